"""Batched sampling: penalties, min_tokens, logit bias, allowed tokens, bad words, grammars (structured outputs),
temperature, top-k / top-p / min-p, per-request seeds, logprobs.

Logprobs are those of the model's raw distribution (before penalties and temperature), as OpenAI and vLLM
report them. Seeded requests draw their noise from their own generator, so their samples do not depend on
what else is in the batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from brisk.device_transfer import to_device_async
from brisk.engine.request import Request
from brisk.outputs import Logprob, PositionLogprobs
from brisk.sampling_params import SamplingParams
from brisk.structured_outputs.state import apply_grammar_bitmask


@dataclass
class SamplerOutput:
    """Sampled ids stay on the device (int64), so the next step can read them without a round trip through
    the host; logprobs, when asked for, are read back at once."""

    token_ids: torch.Tensor
    logprobs: list[PositionLogprobs | None] | None
    chosen_logprobs: list[float | None] | None
    # The ids in pinned host memory, when the sampling kernel wrote them there itself (valid once the step is done).
    host_token_ids: torch.Tensor | None = None
    # Pinned host inputs that the kernels read in place: they must outlive the step.
    host_inputs: tuple[torch.Tensor, ...] = ()


def _apply_penalties(logits: torch.Tensor, requests: list[Request]) -> None:
    for row, request in enumerate(requests):
        params = request.sampling_params
        if not params.has_penalties:
            continue
        row_logits = logits[row]
        if params.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(request.all_token_ids)), device=logits.device, dtype=torch.long)
            values = row_logits[seen]
            penalized = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
            row_logits[seen] = penalized
        if (params.frequency_penalty or params.presence_penalty) and request.output_token_ids:
            out = torch.tensor(request.output_token_ids, device=logits.device, dtype=torch.long)
            counts = torch.zeros_like(row_logits).index_add_(0, out, torch.ones_like(out, dtype=row_logits.dtype))
            row_logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(counts.dtype)


def _apply_min_tokens(logits: torch.Tensor, requests: list[Request]) -> None:
    for row, request in enumerate(requests):
        params = request.sampling_params
        # Tokens generated before this one: those known plus those still in flight, less this step's own.
        if request.num_output_tokens + request.num_pending_tokens - 1 < params.min_tokens:
            banned = set(params.stop_token_ids)
            if not params.ignore_eos:
                banned |= request.eos_token_ids
            if banned:
                logits[row, sorted(banned)] = float("-inf")


def _apply_token_constraints(logits: torch.Tensor, requests: list[Request]) -> None:
    """Logit bias, the allowed tokens, bad words (the last token of a bad word whose other tokens were just
    generated), then the grammar's bitmask: each in place, on the rows that ask for it."""
    for row, request in enumerate(requests):
        params = request.sampling_params
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias), device=logits.device)
            logits[row, ids] += torch.tensor(list(params.logit_bias.values()), device=logits.device)
        if params.allowed_token_ids is not None:
            keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
            keep[params.allowed_token_ids] = True
            logits[row].masked_fill_(~keep, float("-inf"))
        if request.bad_words_token_ids:
            history = request.output_token_ids
            banned = [
                word[-1]
                for word in request.bad_words_token_ids
                if len(word) == 1 or history[len(history) - len(word) + 1 :] == word[:-1]
            ]
            if banned:
                logits[row, banned] = float("-inf")
    apply_grammar_bitmask(logits, [r.grammar for r in requests])


def _filter(logits: torch.Tensor, params: list[SamplingParams], device: torch.device) -> torch.Tensor:
    """Mask logits outside top-k, the top-p nucleus, and below min_p times the top probability. The checks for
    which filters apply read the host-side params, so no step waits on the device for them."""
    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        top_k = to_device_async([p.top_k for p in params], torch.int64, device)
        top_p = to_device_async([p.top_p for p in params], torch.float32, device)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[-1]
        k = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab)
        ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
        # keep every token tied with the k-th (vLLM's and HF's rule; sort order among ties is arbitrary)
        drop = sorted_logits < sorted_logits.gather(-1, (k - 1)[:, None])
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        # keep a token if the mass strictly before it is below top_p, and always the top token (a top_p that
        # rounds to 0 in float32 would drop it too)
        mass_before = probs.cumsum(dim=-1) - probs
        drop |= (mass_before >= top_p[:, None]) & (ranks > 0)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    if any(p.min_p > 0 for p in params):
        min_p = to_device_async([p.min_p for p in params], torch.float32, device)
        probs = logits.softmax(dim=-1)
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < threshold, float("-inf"))
    return logits


def _fusable(params: SamplingParams, generator: torch.Generator | None) -> bool:
    return (
        generator is None
        and params.top_k == 0
        and params.top_p == 1.0
        and params.min_p == 0.0
        and not params.has_logits_processors
        and params.min_tokens == 0
        and params.num_logprobs is None
    )


def _fused_sampling_module(device: torch.device):
    if device.type != "cuda":
        return None
    try:
        from brisk.worker import triton_sampling
    except ImportError:
        return None
    return triton_sampling


class Sampler:
    def __init__(self, device: torch.device, seed: int):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.fused = _fused_sampling_module(device)
        self._seeds = random.Random()  # per-step seeds of the fused kernel's random stream
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        """Restart the random streams of unseeded requests (after the engine's throwaway warm-up requests, so
        that an engine seed gives the same samples with or without them)."""
        self.generator.manual_seed(seed)
        self._seeds.seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        if self.fused is not None and all(_fusable(r.sampling_params, r.generator) for r in requests):
            return self._sample_fused(logits, requests)
        logits = logits.float()
        want_logprobs = [r.sampling_params.num_logprobs is not None for r in requests]
        raw_logprobs = logits.log_softmax(dim=-1) if any(want_logprobs) else None
        if any(r.sampling_params.has_penalties for r in requests):
            _apply_penalties(logits, requests)
        _apply_min_tokens(logits, requests)
        if any(r.sampling_params.has_logits_processors for r in requests):
            _apply_token_constraints(logits, requests)

        greedy = [r.sampling_params.greedy for r in requests]
        token_ids = logits.argmax(dim=-1)
        if not all(greedy):
            token_ids = self._sample(logits, requests, greedy, token_ids)
        if raw_logprobs is None:
            return SamplerOutput(token_ids, None, None)

        logprobs: list[PositionLogprobs | None] = [None] * len(requests)
        chosen: list[float | None] = [None] * len(requests)
        rows = [i for i, w in enumerate(want_logprobs) if w]
        logprobs_rows, chosen_rows = self._gather_logprobs(raw_logprobs[rows], token_ids[rows], requests, rows)
        for i, row in enumerate(rows):
            logprobs[row], chosen[row] = logprobs_rows[i], chosen_rows[i]
        return SamplerOutput(token_ids, logprobs, chosen)

    def _sample_fused(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        """Plain temperature / greedy rows: one kernel pass over the logits."""
        temps = [0.0 if r.sampling_params.greedy else r.sampling_params.temperature for r in requests]
        temperature = torch.tensor(temps, dtype=torch.float32, pin_memory=True)  # read in place by the kernel
        ids, host_ids = self.fused.gumbel_argmax(logits, temperature, self._seeds.getrandbits(31))
        return SamplerOutput(ids, None, None, host_token_ids=host_ids, host_inputs=(temperature,))

    def filtered_probs(self, logits: torch.Tensor, requests: list[Request], greedy: list[bool]) -> torch.Tensor:
        """Temperature, then top-k / top-p / min-p: the distribution a sampled row draws from (greedy rows: T=1)."""
        params = [r.sampling_params for r in requests]
        temps = [1.0 if g else p.temperature for g, p in zip(greedy, params)]
        temperature = to_device_async(temps, torch.float32, self.device)
        return _filter(logits / temperature[:, None], params, self.device).softmax(dim=-1)

    @staticmethod
    def _processed(logits: torch.Tensor, requests) -> torch.Tensor:
        """Float32 logits with penalties, min_tokens and token constraints applied: what every row's choice is
        made from (a request with token constraints gets no drafts, so its one row is an ordinary sampling
        position). A copy even when the logits are float32 already (CPU): the caller's raw logits still give the
        logprobs."""
        logits = logits.to(torch.float32, copy=True)
        if any(r.sampling_params.has_penalties for r in requests):
            _apply_penalties(logits, requests)
        _apply_min_tokens(logits, requests)
        if any(r.sampling_params.has_token_constraints for r in requests):
            _apply_token_constraints(logits, requests)
        return logits

    def target_argmax(self, logits: torch.Tensor, requests) -> torch.Tensor:
        """Each row's greedy choice, penalties and min_tokens included: :meth:`target_probs`' point masses as
        token ids, for verification when every row is greedy."""
        return self._processed(logits, requests).argmax(dim=-1)

    def target_probs(self, logits: torch.Tensor, requests) -> torch.Tensor:
        """Each row's full sampling distribution (penalties and min_tokens included): what speculative decoding
        verifies drafts against when some row samples (an all-greedy batch takes :meth:`target_argmax`). A greedy
        row's is a point mass on its argmax, the token it would pick."""
        logits = self._processed(logits, requests)
        greedy = [r.sampling_params.greedy for r in requests]
        probs = self.filtered_probs(logits, requests, greedy)
        if any(greedy):
            rows = to_device_async([i for i, g in enumerate(greedy) if g], torch.int64, self.device)
            probs[rows] = torch.nn.functional.one_hot(logits[rows].argmax(dim=-1), logits.shape[-1]).float()
        return probs

    def draw(self, probs: torch.Tensor, requests, greedy: list[bool]) -> torch.Tensor:
        """One token per row from (unnormalized) ``probs``. Exponential race: argmax(p / E) with E ~ Exp(1) draws
        from p; each seeded row uses its own stream (greedy rows draw nothing from it)."""
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for row, request in enumerate(requests):
            if request.generator is not None and not greedy[row]:
                noise[row].exponential_(generator=request.noise_generator(self.device))
        return (probs / noise).argmax(dim=-1)

    def _sample(self, logits: torch.Tensor, requests: list[Request], greedy: list[bool], greedy_ids: torch.Tensor):
        sampled = self.draw(self.filtered_probs(logits, requests, greedy), requests, greedy)
        if not any(greedy):
            return sampled
        return torch.where(to_device_async(greedy, torch.bool, self.device), greedy_ids, sampled)

    @staticmethod
    def _gather_logprobs(raw: torch.Tensor, chosen_ids: torch.Tensor, requests: list[Request], rows: list[int]):
        """Each row's chosen token with the top ``logprobs`` alternatives, or with its ``logprob_token_ids``."""
        params = [requests[r].sampling_params for r in rows]
        top_k = [0 if p.logprob_token_ids else p.logprobs for p in params]
        k_max = max(top_k)
        chosen_lp = raw.gather(-1, chosen_ids[:, None]).squeeze(-1)
        ranks = (raw > chosen_lp[:, None]).sum(dim=-1) + 1
        top_values, top_ids = raw.topk(k_max, dim=-1) if k_max > 0 else (raw[:, :0], chosen_ids[:, None][:, :0])
        positions = _to_position_logprobs(
            chosen_ids.tolist(), chosen_lp.tolist(), ranks.tolist(), top_ids.tolist(), top_values.tolist(), top_k
        )
        listed = [i for i, p in enumerate(params) if p.logprob_token_ids]
        if listed:
            _add_listed_logprobs(positions, raw, listed, [params[i].logprob_token_ids for i in listed])
        return positions, chosen_lp.tolist()


def _to_position_logprobs(chosen_ids, chosen_lps, ranks, top_ids, top_values, ks) -> list[PositionLogprobs]:
    result = []
    for token, lp, rank, ids, values, k in zip(chosen_ids, chosen_lps, ranks, top_ids, top_values, ks):
        position = {token: Logprob(lp, rank)}
        for r, (tid, value) in enumerate(zip(ids[:k], values[:k]), start=1):
            position.setdefault(tid, Logprob(value, r))
        result.append(position)
    return result


def _add_listed_logprobs(
    positions: list[PositionLogprobs], raw: torch.Tensor, rows: list[int], token_ids: list[list[int]]
) -> None:
    """Add to ``positions[row]`` the logprob and rank of each id of ``token_ids`` (one list per row of ``rows``).
    Ranks are those in the whole vocabulary, as the chosen token's (vLLM numbers listed tokens 1..n instead)."""
    width = max(map(len, token_ids))
    padded = [ids + ids[-1:] * (width - len(ids)) for ids in token_ids]
    sub = raw[to_device_async(rows, torch.int64, raw.device)]
    ids = to_device_async(padded, torch.int64, raw.device)
    values = sub.gather(-1, ids)
    # rank = 1 + how many tokens are more likely: the vocabulary less those at most as likely (a sorted search)
    at_most = torch.searchsorted(sub.sort(dim=-1).values, values, right=True)
    ranks = sub.shape[-1] - at_most + 1
    for row, row_ids, row_values, row_ranks in zip(rows, token_ids, values.tolist(), ranks.tolist()):
        position = positions[row]
        for token, value, rank in zip(row_ids, row_values, row_ranks):
            position.setdefault(token, Logprob(value, rank))


def prompt_position_logprobs(logprobs: torch.Tensor, targets: list[int], k: int) -> list[PositionLogprobs]:
    """Logprobs of given next tokens at consecutive prompt positions, with the top-k alternatives."""
    target_ids = torch.tensor(targets, device=logprobs.device)
    chosen = logprobs.gather(-1, target_ids[:, None]).squeeze(-1)
    ranks = (logprobs > chosen[:, None]).sum(dim=-1) + 1
    top_values, top_ids = logprobs.topk(max(k, 1), dim=-1)
    return _to_position_logprobs(
        targets, chosen.tolist(), ranks.tolist(), top_ids.tolist(), top_values.tolist(), [k] * len(targets)
    )
