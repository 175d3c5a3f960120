"""Verification of draft tokens by rejection sampling: the tokens it emits follow the target model's own sampling
distribution, whatever the drafts were.

Draft ``t_j`` is accepted with probability ``min(1, p_j(t_j) / q_j(t_j))``, where ``p_j`` is the target's full
sampling distribution at that position (penalties, min_tokens, temperature, top-k, top-p, min-p, computed as if
the drafts before it were accepted) and ``q_j`` the proposer's. At the first rejection the token is drawn from
the residual ``max(0, p_j - q_j)``, normalized; if every draft is accepted, one more token is drawn from the
next position's ``p``. The n-gram proposer is deterministic, so its ``q_j`` is a point mass: accept with
probability ``p_j(t_j)``, and the residual is ``p_j`` without ``t_j``; a draft model that samples passes its
``q_j``. Greedy rows have a point-mass ``p`` on the
argmax, so they accept exactly the drafts the plain path would have produced and then emit its next token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from brisk.device_transfer import to_device_async
from brisk.engine.request import Request
from brisk.outputs import PositionLogprobs
from brisk.worker.sampler import Sampler


class _DraftPosition:
    """A request as it would stand after accepting its first drafts: the fields the sampler reads."""

    def __init__(self, request: Request, accepted: list[int]):
        self.request_id = request.request_id
        self.sampling_params = request.sampling_params
        self.eos_token_ids = request.eos_token_ids
        self.generator = request.generator
        self.noise_generator = request.noise_generator
        self.bad_words_token_ids = request.bad_words_token_ids
        self.grammar = request.grammar  # (requests with a grammar get no drafts: this is their only position)
        self._request = request
        self._accepted = accepted
        self.num_output_tokens = request.num_output_tokens + len(accepted)
        self.num_pending_tokens = 1  # the token this position samples

    @property
    def all_token_ids(self) -> list[int]:
        return self._request.all_token_ids + self._accepted

    @property
    def output_token_ids(self) -> list[int]:
        return self._request.output_token_ids + self._accepted


@dataclass
class Verification:
    """Per request, in order: the emitted tokens (accepted drafts, then one drawn token) and, for requests that
    asked for logprobs, each emitted token's logprobs and chosen logprob."""

    token_ids: list[list[int]]
    logprobs: list[list[PositionLogprobs] | None]
    chosen_logprobs: list[list[float] | None]


class PendingVerification:
    """A verification whose device work is queued: :meth:`result` waits for its read-back and finishes on the host.
    An all-greedy batch reads one tensor back, so the engine can launch the step and do other host work (emit the
    last step's outputs) while the device runs it; otherwise the verification is done when this is made."""

    def __init__(self, finish: Callable[[], Verification] | None, done: torch.cuda.Event | None = None):
        self._finish: Callable[[], Verification] | None = finish
        self._done = done
        self._result: Verification | None = None

    @classmethod
    def ready(cls, verification: Verification) -> PendingVerification:
        pending = cls(None)
        pending._result = verification
        return pending

    def is_ready(self) -> bool:
        """Whether :meth:`result` would return without waiting for the device."""
        return self._finish is None or self._done is None or self._done.query()

    def result(self) -> Verification:
        if self._finish is not None:
            if self._done is not None:
                self._done.synchronize()
            self._result, self._finish = self._finish(), None
        return self._result


def _read_back_async(values: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """``values`` copied into host memory without blocking the host, and the event that marks the copy done."""
    if values.device.type == "cpu":
        return values, None
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


class RejectionSampler:
    def __init__(self, sampler: Sampler, seed: int):
        self.sampler = sampler
        self.generator = torch.Generator()  # acceptance draws of unseeded requests (on the host)
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        drafts: list[list[int]],
        draft_probs: list[torch.Tensor | None] | None = None,
        draft_token_ids: torch.Tensor | None = None,
    ) -> PendingVerification:
        """``logits`` has ``len(drafts[i]) + 1`` rows per request, in order: the target's prediction after each
        token of the request's step (its last known token, then each draft). ``draft_probs[i]``, when given, is
        the ``[len(drafts[i]), vocab]`` distribution each draft was drawn from (None: a point mass).
        ``draft_token_ids``, when given, holds every draft on the device, in order, and ``drafts`` only their
        counts: they are read back (into ``drafts``) with the verification's tokens where no row's sampling
        reads its token history, else first. An all-greedy batch is read back when the result is asked for; any
        other is verified now."""
        greedy = all(r.sampling_params.greedy for r in requests)
        if draft_token_ids is not None and not (greedy and self._ignores_history(requests)):
            self._fill(drafts, draft_token_ids.tolist())
            draft_token_ids = None
        positions = [_DraftPosition(r, d[:j]) for r, d in zip(requests, drafts) for j in range(len(d) + 1)]
        starts = [0]
        for d in drafts:
            starts.append(starts[-1] + len(d) + 1)
        if greedy:
            return self._verify_greedy(logits, positions, drafts, starts, draft_token_ids)
        return PendingVerification.ready(self._verify_sampled(logits, requests, drafts, draft_probs, positions, starts))

    def _verify_sampled(self, logits, requests, drafts, draft_probs, positions, starts) -> Verification:
        """The general rule, some row sampling: accept with ``min(1, p/q)``, else draw from the residual."""
        probs = self.sampler.target_probs(logits, positions)
        draft_rows = [starts[i] + j for i, d in enumerate(drafts) for j in range(len(d))]
        draft_tokens = [t for d in drafts for t in d]
        p_draft: list[float] = []
        if draft_rows:
            rows = to_device_async(draft_rows, torch.int64, self.sampler.device)
            p_draft = probs[rows, to_device_async(draft_tokens, torch.int64, self.sampler.device)].tolist()
        q = draft_probs or [None] * len(drafts)
        q_draft = [
            [1.0] * len(d) if qi is None else qi[torch.arange(len(d)), torch.tensor(d)].tolist()
            for qi, d in zip(q, drafts)
        ]

        emit_rows, rejected, accepted = [], [], []
        k = 0
        for i, (request, d) in enumerate(zip(requests, drafts)):
            p = p_draft[k : k + len(d)]
            k += len(d)
            if request.sampling_params.greedy:
                num_accepted = next((j for j, pj in enumerate(p) if pj < 0.5), len(d))  # p is 0 or 1
            else:
                u = torch.rand(len(d), generator=request.generator or self.generator).tolist()
                num_accepted = next((j for j in range(len(d)) if u[j] * q_draft[i][j] >= p[j]), len(d))
            accepted.append(d[:num_accepted])
            emit_rows.append(starts[i] + num_accepted)
            if num_accepted < len(d):
                q_row = None if q[i] is None else q[i][num_accepted].to(probs.device)
                rejected.append((i, d[num_accepted], q_row))
        residual = self.residual(probs[to_device_async(emit_rows, torch.int64, self.sampler.device)], rejected)
        greedy = [r.sampling_params.greedy for r in requests]
        # A greedy row's residual is a point mass on its argmax, so the race draws that token too.
        drawn = residual.argmax(dim=-1) if all(greedy) else self.sampler.draw(residual, requests, greedy)
        token_ids = [a + [t] for a, t in zip(accepted, drawn.tolist())]
        logprobs, chosen = self._logprobs(logits, positions, starts, token_ids)
        return Verification(token_ids, logprobs, chosen)

    @staticmethod
    def _ignores_history(requests: list[Request]) -> bool:
        """Whether no request's sampling reads the tokens before the one it samples (penalties, bad words,
        grammars), so the target's choice at a draft's position does not depend on the drafts before it."""
        return not any(r.sampling_params.needs_token_history for r in requests)

    @staticmethod
    def _fill(drafts: list[list[int]], values: list[int]) -> None:
        """Write ``values``, every draft in order, into the ``drafts`` lists in place."""
        k = 0
        for d in drafts:
            d[:] = values[k : k + len(d)]
            k += len(d)

    def _verify_greedy(
        self, logits, positions, drafts: list[list[int]], starts: list[int], draft_token_ids: torch.Tensor | None
    ) -> PendingVerification:
        """Every row greedy: a draft is accepted while it is the target's argmax, and the token after the accepted
        ones is the argmax where they end. The same tokens as the general rule (a greedy row's distribution is a
        point mass), from one read of the argmaxes instead of two reads and the full-vocabulary point masses;
        drafts still on the device come back in that same read."""
        values = self.sampler.target_argmax(logits, positions)
        if draft_token_ids is not None:
            values = torch.cat([values, draft_token_ids.to(values.dtype)])
        host, done = _read_back_async(values)

        def finish() -> Verification:
            read = host.tolist()
            argmax = read[: starts[-1]]
            if draft_token_ids is not None:
                self._fill(drafts, read[starts[-1] :])
            token_ids = []
            for d, start in zip(drafts, starts):
                choice = argmax[start : start + len(d) + 1]
                num_accepted = next((j for j, t in enumerate(d) if t != choice[j]), len(d))
                token_ids.append(d[:num_accepted] + [choice[num_accepted]])
            return Verification(token_ids, *self._logprobs(logits, positions, starts, token_ids))

        return PendingVerification(finish, done)

    @staticmethod
    def residual(probs: torch.Tensor, rejected: list[tuple[int, int, torch.Tensor | None]]) -> torch.Tensor:
        """Where rows rejected a draft (row, token, the draft's distribution or None for a point mass):
        ``max(0, p - q)``, unnormalized (the draw does not need it); for a point mass that is ``p`` without the
        token. Other rows keep ``p`` (the bonus token)."""
        for row, token, q in rejected:
            if q is None:
                probs[row, token] = 0.0
            else:
                residual = (probs[row] - q).clamp_(min=0.0)
                if residual.sum() > 0:  # (p == q leaves nothing: only by rounding, as rejection then has p ~ 0)
                    probs[row] = residual
        return probs

    @staticmethod
    def _logprobs(logits: torch.Tensor, positions: list[_DraftPosition], starts: list[int], token_ids):
        """Raw logprobs of the emitted tokens only (rejected drafts leave none)."""
        num_requests = len(token_ids)
        logprobs: list[list[PositionLogprobs] | None] = [None] * num_requests
        chosen: list[list[float] | None] = [None] * num_requests
        wanted = [i for i in range(num_requests) if positions[starts[i]].sampling_params.num_logprobs is not None]
        if not wanted:
            return logprobs, chosen
        rows = [starts[i] + j for i in wanted for j in range(len(token_ids[i]))]
        ids = torch.tensor([t for i in wanted for t in token_ids[i]], device=logits.device)
        raw = logits[to_device_async(rows, torch.int64, logits.device)].float().log_softmax(dim=-1)
        entries, values = Sampler._gather_logprobs(raw, ids, positions, rows)
        k = 0
        for i in wanted:
            n = len(token_ids[i])
            logprobs[i], chosen[i] = entries[k : k + n], values[k : k + n]
            k += n
        return logprobs, chosen
