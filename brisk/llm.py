"""The offline API: ``LLM(model=...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping, Sequence

from tqdm.auto import tqdm

from brisk.config import EngineArgs
from brisk.engine.engine import LLMEngine
from brisk.engine.tokenizer import RESERVED_CHAT_TEMPLATE_KWARGS, template_message
from brisk.engine.tokenizer_snapshot import transformers_tokenizer
from brisk.outputs import RequestOutput
from brisk.sampling_params import SamplingParams

# Text, token ids, or one of vLLM's prompt dicts: {"prompt": text} or {"prompt_token_ids": ids}.
Prompt = str | list[int] | Mapping


class LLM:
    """Generates completions for batches of prompts with continuous batching over a paged KV cache."""

    def __init__(self, model: str, **kwargs):
        unknown = set(kwargs) - set(EngineArgs.__dataclass_fields__)
        if unknown:
            raise TypeError(
                f"LLM() got unknown arguments {sorted(unknown)}; accepted: {sorted(EngineArgs.__dataclass_fields__)}"
            )
        self.engine = LLMEngine(EngineArgs(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        """The transformers tokenizer of the model (None for random weights without one)."""
        return transformers_tokenizer(self.engine.tokenizer)

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` and ``chat`` sample with when given no ``SamplingParams``: the neutral defaults, or
        those the model's ``generation_config.json`` recommends (``generation_config`` says which)."""
        return SamplingParams(**self.engine.default_sampling_fields)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        prompts = self._normalize_prompts(prompts)
        params_list = self._normalize_params(sampling_params, len(prompts))
        request_ids = []
        try:
            for prompt, params in zip(prompts, params_list):
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, prompt, params, stream=False)
                request_ids.append(request_id)
            return self._run(request_ids, use_tqdm)
        except BaseException:
            self.engine.abort_request(request_ids)
            raise

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = True,
        *,
        continue_final_message: bool = False,
        tools: list[dict] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """Each conversation rendered by the chat template, then generated (vLLM's arguments): ``tools`` reach
        the template as its ``tools``, ``chat_template_kwargs`` as further variables (``enable_thinking``, ...),
        and ``continue_final_message`` continues the last (assistant) message instead of starting a new one."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("This model has no tokenizer, so chat templates cannot be applied.")
        shape = "one conversation (a list of {role, content} dicts) or a list of conversations"
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"messages must be {shape}, got {type(messages).__name__ if messages else 'nothing'}.")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        for conversation in conversations:
            if (
                not isinstance(conversation, list)
                or not conversation
                or not all(_is_chat_message(m) for m in conversation)
            ):
                raise ValueError(f"messages must be {shape}; each message needs 'role' and 'content' or 'tool_calls'.")
        conversations = [[template_message(m) for m in conversation] for conversation in conversations]
        if chat_template is None and tokenizer.chat_template is None:
            raise ValueError("The tokenizer has no chat template: pass chat_template= (a Jinja string).")
        if continue_final_message and add_generation_prompt:
            raise ValueError(
                "continue_final_message continues the last message, add_generation_prompt starts a new one: pass "
                "add_generation_prompt=False with it."
            )
        if continue_final_message and any(c[-1]["role"] != "assistant" for c in conversations):
            raise ValueError("continue_final_message needs each conversation to end with an assistant message.")
        clash = sorted(RESERVED_CHAT_TEMPLATE_KWARGS & set(chat_template_kwargs or {}))
        if clash:
            raise ValueError(f"chat_template_kwargs cannot set {clash}: use chat()'s own arguments.")
        prompts = [
            tokenizer.apply_chat_template(
                conversation,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                tokenize=False,
                **(chat_template_kwargs or {}),
            )
            for conversation in conversations
        ]
        # The template already holds BOS where the model wants it: tokenize without adding special tokens again.
        token_prompts = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(token_prompts, sampling_params, use_tqdm)

    @staticmethod
    def _normalize_prompts(prompts) -> list[Prompt]:
        if isinstance(prompts, (str, Mapping)):
            return [prompts]
        if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
            return [list(prompts)]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(
                "prompts must be a non-empty string, list of strings, list of token-id lists, or prompt dicts."
            )
        return list(prompts)

    def _normalize_params(self, params, count: int) -> list[SamplingParams]:
        if params is None:
            params = self.get_default_sampling_params()
        if isinstance(params, SamplingParams):
            return [params] * count
        if not isinstance(params, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in params):
            got = type(params).__name__
            if isinstance(params, (list, tuple)):
                got = f"a list holding {', '.join(sorted({type(p).__name__ for p in params}))}"
            raise ValueError(f"sampling_params must be a SamplingParams or a list of them, got {got}.")
        params = list(params)
        if len(params) != count:
            raise ValueError(f"Got {len(params)} SamplingParams for {count} prompts: pass one, or one per prompt.")
        return params

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        in_tokens = out_tokens = 0
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
                    in_tokens += len(output.prompt_token_ids)
                    out_tokens += sum(len(o.token_ids) for o in output.outputs)
                    elapsed = bar.format_dict["elapsed"] or 1e-9
                    bar.set_postfix_str(f"in: {in_tokens / elapsed:.0f} tok/s, out: {out_tokens / elapsed:.0f} tok/s")
                    bar.update(1)
        bar.close()
        if self.engine.step_timer.enabled:
            print(f"brisk step timing: {self.engine.step_timer.summary()}", file=sys.stderr)
        return [finished[r] for r in request_ids]


def _is_chat_message(message) -> bool:
    """A role and content, or an assistant turn that only calls tools (OpenAI's shape, no content)."""
    return isinstance(message, dict) and "role" in message and ("content" in message or "tool_calls" in message)
