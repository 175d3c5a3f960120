"""The n-gram proposer's vectorized lookup against the rule written out in plain Python, on sequences with a small
vocabulary (many partial matches), as a request grows token by token (its cached array extended) and after its
token list is cut back (the cache rebuilt)."""

import random

import pytest

from brisk import SamplingParams
from brisk.engine.request import Request
from brisk.spec_decode.config import SpeculativeConfig
from brisk.spec_decode.ngram_proposer import NgramProposer


def reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """For n from max_n down to min_n: the first i with tokens[i : i + n] equal to the last n tokens and i + n
    before the end; the k tokens from i + n."""
    length = len(tokens)
    if k <= 0 or length <= min_n:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        for i in range(length - n):
            if tokens[i : i + n] == suffix:
                return tokens[i + n : i + n + k]
    return []


@pytest.mark.parametrize(("min_n", "max_n", "vocab"), [(1, 3, 3), (2, 5, 4), (3, 3, 2), (1, 1, 50), (2, 4, 12)])
def test_matches_the_plain_rule_as_a_request_grows(min_n, max_n, vocab):
    rng = random.Random(min_n * 100 + max_n * 10 + vocab)
    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": min_n, "prompt_lookup_max": max_n}
    proposer = NgramProposer(SpeculativeConfig.from_dict(config))
    found = 0
    for r in range(20):
        request = Request(str(r), [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))], SamplingParams(),
                          frozenset())  # fmt: skip
        for _ in range(rng.randrange(1, 150)):
            limit = rng.randrange(0, 6)
            expected = reference(request.all_token_ids, min(4, limit), min_n, max_n)
            assert proposer.propose(request, limit) == expected
            found += bool(expected)
            request.append_output_token(rng.randrange(vocab))
        del request.all_token_ids[len(request.all_token_ids) // 2 :]  # cut back: the cached array must not serve
        request.all_token_ids.append(rng.randrange(vocab))
        assert proposer.propose(request, 4) == reference(request.all_token_ids, 4, min_n, max_n)
    assert found > 100
