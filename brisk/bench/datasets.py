"""The benchmark workloads as token ids, built exactly as the published recipe (docs/benchmarks.md).

Ids come from ``numpy.random.default_rng``, in [0, 10000); W1 uses seed 0, W2 seed 1, W3 seed 2, W4 seed 3. The same
prompts give the same fingerprint as vLLM's anchor run, so brisk and vLLM figures are over identical requests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

VOCAB_DRAW = 10000  # ids are drawn from [0, VOCAB_DRAW)
W1_SEED, W2_SEED, W3_SEED, W4_SEED, WARMUP_SEED = 0, 1, 2, 3, 12345
NUM_REQUESTS = 256
W1_TEMPERATURE = 0.6
W2_INPUT_LEN, W2_OUTPUT_LEN = 512, 128
W3_INPUT_LEN, W3_OUTPUT_LEN, W3_RUNS = 128, 256, 3
W4_INPUT_LEN, W4_OUTPUT_LEN, W4_BATCH_SIZES = 32000, 256, (1, 8)
W4_PREFILL_LAST_ID = 7  # the prefill request's last id, so that the timed decode misses only the last block
WARMUP_LENS = (16, 64, 200, 700)
WARMUP_OUTPUT_LEN = 32

# Pinned fingerprints of the full recipes (vLLM's anchor reports the same).
FINGERPRINTS = {"W1": "c64d310445788388", "W2": "4b412bb5cc3c82e3"}
# Token totals of the full W1 recipe.
W1_INPUT_TOKENS, W1_OUTPUT_TOKENS = 145_208, 142_892


@dataclass
class Workload:
    name: str  # W1, W2, or "fixed" for custom lengths
    prompts: list[list[int]]
    output_lens: list[int]
    temperature: float  # 0 = greedy
    fingerprint: str  # of these prompts and output lengths
    fingerprint_expected: str | None  # the pinned value when these are the full recipe, else None
    note: str = ""

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def input_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def max_len(self) -> int:
        """The longest prompt + output, so callers can check max_model_len."""
        return max(len(p) + o for p, o in zip(self.prompts, self.output_lens))


def fingerprint(prompts: Sequence[Sequence[int]], output_lens: Sequence[int]) -> str:
    """First 16 hex digits of sha256 over, per request, ``",".join(ids) + "|" + str(out_len) + ";"``."""
    if len(prompts) != len(output_lens):
        raise ValueError(f"{len(prompts)} prompts but {len(output_lens)} output lengths.")
    h = hashlib.sha256()
    for ids, out_len in zip(prompts, output_lens):
        h.update((",".join(map(str, ids)) + "|" + str(out_len) + ";").encode())
    return h.hexdigest()[:16]


def w1_recipe() -> tuple[list[list[int]], list[int]]:
    """nano-vllm's bench: per request an input length then its ids; then all output lengths."""
    rng = np.random.default_rng(W1_SEED)
    prompts = []
    for _ in range(NUM_REQUESTS):
        n = int(rng.integers(100, 1025))
        prompts.append(rng.integers(0, VOCAB_DRAW, n).tolist())
    output_lens = [int(rng.integers(100, 1025)) for _ in range(NUM_REQUESTS)]
    return prompts, output_lens


def w2_recipe(
    num_requests: int = NUM_REQUESTS, input_len: int = W2_INPUT_LEN, output_len: int = W2_OUTPUT_LEN
) -> tuple[list[list[int]], list[int]]:
    rng = np.random.default_rng(W2_SEED)
    return rng.integers(0, VOCAB_DRAW, (num_requests, input_len)).tolist(), [output_len] * num_requests


def check_recipe(name: str) -> str:
    """Build the full recipe and compare its fingerprint with the pinned one (catches a numpy that draws
    differently); returns the fingerprint."""
    prompts, output_lens = w1_recipe() if name == "W1" else w2_recipe()
    got = fingerprint(prompts, output_lens)
    if got != FINGERPRINTS[name]:
        raise RuntimeError(
            f"{name} prompts have fingerprint {got}, expected {FINGERPRINTS[name]}: this numpy "
            f"({np.__version__}) draws different ids, so the prompts differ from the peers' run."
        )
    return got


def build_workload(
    name: str,
    num_prompts: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
) -> Workload:
    """W1 or W2 (optionally the first ``num_prompts`` requests, or other fixed lengths).

    W1 with ``output_len`` keeps W1's prompts and gives every request that output length. W2 with
    ``input_len``/``output_len`` draws ``(num_prompts, input_len)`` ids from W2's seed. Only the full
    unmodified recipe carries ``fingerprint_expected``; the pinned fingerprint is always verified first.
    """
    name = name.upper()
    if name not in FINGERPRINTS:
        raise ValueError(f"Unknown workload {name!r}; choose W1 or W2 (W3 is `brisk bench latency`).")
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}.")
    for flag, value in (("--input-len", input_len), ("--output-len", output_len)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}.")
    check_recipe(name)
    n = NUM_REQUESTS if num_prompts is None else num_prompts
    notes = []
    if name == "W1":
        if input_len is not None:
            raise ValueError("W1 has its own input lengths (uniform [100, 1024]); use --workload W2 --input-len N.")
        if n > NUM_REQUESTS:
            raise ValueError(f"W1 has {NUM_REQUESTS} requests; --num-prompts must be <= {NUM_REQUESTS}.")
        prompts, output_lens = w1_recipe()
        prompts, output_lens = prompts[:n], output_lens[:n]
        if output_len is not None:
            output_lens = [output_len] * n
            notes.append(f"output lengths set to {output_len}")
        temperature = W1_TEMPERATURE
    else:
        in_len = W2_INPUT_LEN if input_len is None else input_len
        out_len = W2_OUTPUT_LEN if output_len is None else output_len
        # One (n, input_len) draw: with input_len 512 its first rows are the recipe's first rows.
        prompts, output_lens = w2_recipe(n, in_len, out_len)
        temperature = 0.0
    full = n == NUM_REQUESTS and input_len is None and output_len is None
    if n != NUM_REQUESTS:
        notes.append(f"first {n} of {NUM_REQUESTS} requests" if n < NUM_REQUESTS else f"{n} requests")
    wname = name if full else f"{name}-custom"
    return Workload(
        name=wname,
        prompts=prompts,
        output_lens=output_lens,
        temperature=temperature,
        fingerprint=fingerprint(prompts, output_lens),
        fingerprint_expected=FINGERPRINTS[name] if full else None,
        note="; ".join(notes),
    )


def warmup_prompts() -> list[list[int]]:
    """4 prompts of 16, 64, 200 and 700 ids (seed 12345), run for 32 tokens sampled and then greedy."""
    rng = np.random.default_rng(WARMUP_SEED)
    return [rng.integers(0, VOCAB_DRAW, n).tolist() for n in WARMUP_LENS]


def latency_prompts(
    num_iters: int = W3_RUNS, batch_size: int = 1, input_len: int = W3_INPUT_LEN
) -> tuple[list[list[list[int]]], list[list[list[int]]]]:
    """W3: fresh prompts per run from seed 2, first the full-length runs, then the one-token (TTFT) runs.

    Returns ``(runs, runs_1tok)``; each run is a batch of ``batch_size`` prompts of ``input_len`` ids, drawn one
    prompt at a time (``rng.integers(0, 10000, input_len)``), so batch 1 is exactly the recipe.
    """
    rng = np.random.default_rng(W3_SEED)

    def draw(count: int) -> list[list[list[int]]]:
        return [[rng.integers(0, VOCAB_DRAW, input_len).tolist() for _ in range(batch_size)] for _ in range(count)]

    runs = draw(num_iters)
    return runs, draw(num_iters)


def long_context_prompts(
    batch_sizes: Sequence[int] = W4_BATCH_SIZES, input_len: int = W4_INPUT_LEN
) -> list[list[list[int]]]:
    """W4: per batch size in order, ``batch_size`` prompts of ``input_len`` ids from seed 3, drawn one prompt at a
    time (``rng.integers(0, 10000, input_len)``), one generator for all batch sizes."""
    rng = np.random.default_rng(W4_SEED)
    return [[rng.integers(0, VOCAB_DRAW, input_len).tolist() for _ in range(bs)] for bs in batch_sizes]
