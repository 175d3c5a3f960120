"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes)."""

from __future__ import annotations

from brisk.entrypoints.openai.errors import bad_request
from brisk.entrypoints.openai.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from brisk.entrypoints.openai.serving_engine import OpenAIServing


class OpenAIServingTokenization(OpenAIServing):
    async def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        self.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("Give exactly one of 'prompt' and 'messages'.", param="prompt")
        if req.messages is not None:
            if not req.messages:
                raise bad_request("'messages' must not be empty.", param="messages")
            _, tokens = await self.render_chat(req.messages, req.add_generation_prompt)
        else:
            tokens = await self.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        return TokenizeResponse(count=len(tokens), max_model_len=self.max_model_len, tokens=tokens)

    async def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(req.model)
        self.check_token_ids(req.tokens, "tokens")
        return DetokenizeResponse(prompt=await self.decode(req.tokens))
