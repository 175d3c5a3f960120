"""Microseconds a proposal of the n-gram proposer takes on the host (it sits on every speculative step's path).

    python benchmarks/ngram_lookup.py [--lengths 300 1000 4000] [--repeats 2000]

Per sequence length, two sequences: random ids over a 49,152-token vocabulary whose last three tokens repeat an
earlier run (a match at n = 3), and ids over 103 values, where the last token occurred hundreds of times before
(many candidate places to check). The same request proposes ``--repeats`` times (its token array is built once and
kept, as across the steps of a request); the median of five rounds is printed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk import SamplingParams  # noqa: E402
from brisk.engine.request import Request  # noqa: E402
from brisk.spec_decode.config import SpeculativeConfig  # noqa: E402
from brisk.spec_decode.ngram_proposer import NgramProposer  # noqa: E402


def time_proposals(proposer: NgramProposer, tokens: list[int], repeats: int) -> float:
    request = Request("r", tokens, SamplingParams(), frozenset())
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            proposer.propose(request, 6)
        rounds.append(1e6 * (time.perf_counter() - start) / repeats)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[300, 1000, 4000])
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    proposer = NgramProposer(SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 6}))
    rng = random.Random(0)
    for length in args.lengths:
        unique = [rng.randrange(49152) for _ in range(length)]
        unique += unique[100:103]
        repetitive = [rng.randrange(103) for _ in range(length)]
        print(
            f"{length} tokens: {time_proposals(proposer, unique, args.repeats):.1f} us (one match), "
            f"{time_proposals(proposer, repetitive, args.repeats):.1f} us (many candidates)"
        )


if __name__ == "__main__":
    main()
