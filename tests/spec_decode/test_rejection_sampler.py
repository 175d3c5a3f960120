"""The rejection sampler keeps the target distribution: the first token it emits is distributed as the target's
own sample would be, whatever the draft, for temperature 1 with top-p over a small vocabulary."""

import pytest
import torch

from brisk.engine.request import Request
from brisk.sampling_params import SamplingParams
from brisk.spec_decode.rejection_sampler import RejectionSampler
from brisk.worker.sampler import Sampler

VOCAB = 8
NUM_SAMPLES = 20000
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])  # top-p 0.9 keeps the first five tokens
PARAMS = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8)


def target() -> torch.Tensor:
    """The exact distribution the plain sampler draws from: softmax, then the top-p nucleus, renormalized."""
    probs = LOGITS.softmax(-1)
    before = probs.cumsum(-1) - probs
    kept = torch.where(before < 0.9, probs, 0.0)
    return kept / kept.sum()


def chi_square_p_value(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's test over tokens with nonzero target probability (a token outside them fails outright)."""
    support = expected_probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = expected_probs[support] * counts.sum()
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic.double() / 2).item()


def first_tokens(sampler: RejectionSampler, draft: list[int] | None) -> torch.Tensor:
    """Counts of the first emitted token over NUM_SAMPLES requests that each verify ``draft``; with None, each
    verifies one draft drawn from ``DRAFT_Q`` (a draft model's sample)."""
    requests = [Request(f"r{i}", [1, 2, 3], PARAMS, frozenset()) for i in range(NUM_SAMPLES)]
    if draft is None:
        drawn = torch.multinomial(DRAFT_Q, NUM_SAMPLES, replacement=True, generator=torch.Generator().manual_seed(1))
        drafts, draft_probs = [[t] for t in drawn.tolist()], [DRAFT_Q[None]] * NUM_SAMPLES
    else:
        drafts, draft_probs = [draft] * NUM_SAMPLES, None
    logits = LOGITS.repeat(NUM_SAMPLES * (len(drafts[0]) + 1), 1)
    verification = sampler(logits, requests, drafts, draft_probs).result()
    first = torch.tensor([tokens[0] for tokens in verification.token_ids])
    return torch.bincount(first, minlength=VOCAB).double()


class ResampleFromTarget(RejectionSampler):
    """A deliberately wrong rule: after a rejection, draw from the target ``p`` instead of the residual."""

    @staticmethod
    def residual(probs, rejected):
        return probs


# A draft model's distribution, unlike the target's (it favours tokens the target ranks lower).
DRAFT_Q = torch.tensor([-1.0, 0.0, 1.0, 1.5, 0.5, 1.0, 0.0, -1.0]).softmax(-1)
# Drafts: the likeliest token, a mid one, one outside the top-p nucleus, two drafts in a row, the draft model's
# argmax (greedy drafting: a point mass like the others), one drawn from q (probabilistic drafting).
DRAFTS = [[0], [2], [6], [1, 1], [int(DRAFT_Q.argmax())], None]


@pytest.mark.parametrize("draft", DRAFTS, ids=str)
def test_emitted_token_follows_the_target_distribution(draft):
    """Chi-square over 20,000 draws, p > 0.001. Measured with seed 0: p = 0.60, 0.96, 0.98, 0.48, 0.82 and 0.80 for
    drafts [0], [2], [6], [1, 1], [3] (``DRAFT_Q``'s argmax) and drafts drawn from ``DRAFT_Q``. The wrong rule of
    ``ResampleFromTarget`` gives p = 0.0 (to double precision) on the same draws for all but [6] (the test below);
    draft [6] lies outside the nucleus, so both rules always reject it and draw from ``p`` (p = 0.98 for both)."""
    sampler = RejectionSampler(Sampler(torch.device("cpu"), seed=0), seed=0)
    assert chi_square_p_value(first_tokens(sampler, draft), target()) > 0.001


@pytest.mark.parametrize("draft", [[0], [2], [1, 1], [3], None], ids=str)
def test_a_wrong_residual_fails_the_same_test(draft):
    sampler = ResampleFromTarget(Sampler(torch.device("cpu"), seed=0), seed=0)
    assert chi_square_p_value(first_tokens(sampler, draft), target()) < 0.001


def test_greedy_accepts_exactly_the_argmax_drafts():
    sampler = RejectionSampler(Sampler(torch.device("cpu"), seed=0), seed=0)
    greedy = SamplingParams(temperature=0, max_tokens=8)
    requests = [Request(f"r{i}", [1, 2, 3], greedy, frozenset()) for i in range(3)]
    # Position rows: the argmax is token 0 everywhere.
    drafts = [[0, 0], [0, 3], [5, 0]]
    verification = sampler(LOGITS.repeat(9, 1), requests, drafts).result()
    assert verification.token_ids == [[0, 0, 0], [0, 0], [0]]


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_all_greedy_shortcut_equals_the_general_rule(penalty):
    """A batch of greedy rows alone takes the argmax shortcut; beside one sampled row the same greedy rows go
    through the general rule (point masses, residuals). Their tokens must agree, penalties included."""
    torch.manual_seed(0)
    greedy = SamplingParams(temperature=0, max_tokens=8, repetition_penalty=penalty)
    requests = [Request(f"r{i}", [1, 2, 3, i], greedy, frozenset()) for i in range(6)]
    drafts = [[int(t) for t in torch.randint(0, 3, (n,))] for n in (0, 1, 2, 3, 3, 4)]
    logits = torch.randn(sum(len(d) + 1 for d in drafts), VOCAB)
    logits[:, :3] += 2.0  # drafts of tokens 0-2 are sometimes the argmax, sometimes not
    sampled = Request("s", [1, 2, 3], PARAMS, frozenset())
    shortcut = RejectionSampler(Sampler(torch.device("cpu"), seed=0), seed=0)(logits, requests, drafts).result()
    general = RejectionSampler(Sampler(torch.device("cpu"), seed=0), seed=0)(
        torch.cat([logits, LOGITS[None]]), requests + [sampled], drafts + [[]]
    ).result()
    assert shortcut.token_ids == general.token_ids[:-1]
    assert any(len(t) < len(d) + 1 for t, d in zip(shortcut.token_ids, drafts))  # some drafts were rejected
    assert any(len(t) > 1 for t in shortcut.token_ids)  # and some accepted


@pytest.mark.parametrize("penalty", [1.0, 1.3])
@pytest.mark.parametrize("with_sampled_row", [False, True])
def test_drafts_on_the_device_give_the_same_verification(penalty, with_sampled_row):
    """A draft model's drafts reach the rejection sampler as a tensor, with placeholder lists of the right
    lengths: the verification must equal the one from host lists, and the lists must end up holding the drafts,
    whichever path reads them back (with the argmaxes for plain greedy rows; first where a penalty reads the
    token history or a row samples)."""
    torch.manual_seed(1)
    greedy = SamplingParams(temperature=0, max_tokens=8, repetition_penalty=penalty)
    requests = [Request(f"r{i}", [1, 2, 3, i], greedy, frozenset()) for i in range(5)]
    drafts = [[int(t) for t in torch.randint(0, 3, (n,))] for n in (1, 2, 3, 3, 4)]
    if with_sampled_row:
        requests.append(Request("s", [1, 2, 3], PARAMS, frozenset()))
        drafts.append([1, 2])
    logits = torch.randn(sum(len(d) + 1 for d in drafts), VOCAB)
    logits[:, :3] += 2.0
    on_host = RejectionSampler(Sampler(torch.device("cpu"), seed=0), seed=0)(logits, requests, drafts).result()
    placeholders = [[0] * len(d) for d in drafts]
    on_device = torch.tensor([t for d in drafts for t in d])
    verified = RejectionSampler(Sampler(torch.device("cpu"), seed=0), seed=0)(
        logits, requests, placeholders, None, on_device
    ).result()
    assert verified.token_ids == on_host.token_ids
    assert placeholders == drafts
    assert any(len(t) < len(d) + 1 for t, d in zip(on_host.token_ids, drafts))
