"""Engine logprobs (``{token_id: Logprob}`` per position) in the two OpenAI shapes: completions' parallel
lists and chat's list of token objects."""

from __future__ import annotations

from brisk.entrypoints.openai.protocol import (
    ChatTokenLogprob,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
    TopLogprob,
)
from brisk.outputs import PositionLogprobs

_MISSING = -9999.0  # what OpenAI reports for a token without a logprob (JSON has no -inf)
# Pass as the tokenizer to name tokens "token_id:{id}" (vLLM's return_tokens_as_token_ids: every token, even one
# that is not valid UTF-8 alone, has a name a client can map back).
TOKEN_IDS = object()


def _text(tokenizer, token_id: int, entry) -> str:
    if tokenizer is TOKEN_IDS:
        return f"token_id:{token_id}"
    if entry is not None and entry.decoded_token is not None:
        return entry.decoded_token
    return tokenizer.decode([token_id]) if tokenizer is not None else str(token_id)


# Pass as ``k`` for requests with ``logprob_token_ids``: every entry of a position (the chosen token's and the
# listed tokens', whatever their rank) is an alternative, as vLLM returns them.
ALL = -1


def _top(position: PositionLogprobs, k: int) -> list[tuple[int, object]]:
    if k == ALL:
        return list(position.items())
    return sorted(((t, lp) for t, lp in position.items() if lp.rank <= k), key=lambda item: item[1].rank)


def completion_logprobs(
    tokenizer,
    token_ids: list[int],
    positions: list[PositionLogprobs | None],
    k: int,
    text_offset: int,
    into: CompletionLogprobs | None = None,
) -> CompletionLogprobs:
    """Append ``token_ids``' logprobs (``positions[i]`` belongs to ``token_ids[i]``; None = no logprob, e.g.
    the first prompt token) to ``into``; offsets count characters from ``text_offset``."""
    out = into or CompletionLogprobs()
    offset = text_offset
    for token_id, position in zip(token_ids, positions, strict=False):
        entry = position.get(token_id) if position else None
        token = _text(tokenizer, token_id, entry)
        out.tokens.append(token)
        out.token_logprobs.append(entry.logprob if entry is not None else None)
        if position is None:
            out.top_logprobs.append(None)
        else:
            # Tokens that decode alike (partial UTF-8 bytes) share a key: the chosen token's wins, then rank.
            top: dict[str, float] = {}
            if entry is not None and (k == ALL or entry.rank <= max(k, 1)):
                top[token] = entry.logprob
            for t, lp in _top(position, k):
                top.setdefault(_text(tokenizer, t, lp), lp.logprob)
            if entry is not None:
                top.setdefault(token, entry.logprob)
            out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def chat_logprobs(
    tokenizer, token_ids: list[int], positions: list[PositionLogprobs | None], k: int
) -> list[ChatTokenLogprob]:
    content = []
    for token_id, position in zip(token_ids, positions, strict=False):
        entry = position.get(token_id) if position else None
        token = _text(tokenizer, token_id, entry)
        tops = [
            TopLogprob(token=(t_text := _text(tokenizer, t, lp)), logprob=lp.logprob, bytes=list(t_text.encode()))
            for t, lp in _top(position or {}, k)
        ]
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=entry.logprob if entry is not None else _MISSING,
                bytes=list(token.encode()),
                top_logprobs=tops,
            )
        )
    return content


def prompt_logprobs(positions: list[PositionLogprobs | None] | None) -> PromptLogprobs | None:
    """The engine's prompt logprobs in vLLM's response shape (``-inf`` as -9999, which JSON can carry)."""
    if positions is None:
        return None
    return [
        None
        if position is None
        else {
            token_id: PromptLogprob(
                logprob=max(entry.logprob, _MISSING), rank=entry.rank, decoded_token=entry.decoded_token
            )
            for token_id, entry in position.items()
        }
        for position in positions
    ]
