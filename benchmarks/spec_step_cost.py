"""What one speculative step costs on the GPU, at the real pair's shapes with random weights.

    python benchmarks/spec_step_cost.py [--target qwen2.5-coder-1.5b-shape] [--draft qwen2.5-coder-0.5b-shape]
        [--k 2 4 6] [--batch-size 1 8 32] [--max-tokens 128] [--methods draft_model ngram] [--accept-all]
        [--json FILE]

Random weights accept almost no drafts, so a speculative step emits about one token and its time is what a step
that proposes ``k`` drafts costs (for a draft model its ``k`` passes and its mirror of the step, then the
target's verification of ``1 + k`` rows): the part of speculation that acceptance does not change. Per
configuration and batch size: decode time per engine step (``decode_s / steps``, steps = tokens - accepted
drafts) beside the plain engine's, their ratio, and the break-even mean acceptance length (the speculative step
over the plain one: speculation pays when the real weights' mean acceptance length, from
``benchmarks/spec_decode.py``, exceeds it; the speedup is that length over the ratio).
With ``--accept-all`` both models copy their input instead (``brisk/bench/copying_weights.py``): every greedy
token repeats the one before, so the n-gram proposer soon finds ``k`` drafts a step and every draft is accepted.
The step time is then what a step that verifies ``k`` accepted drafts costs, and ``tokens_per_step`` over
``step_vs_plain`` is the speedup of speculation when every draft is right: the ceiling that real acceptance
scales down.
The named shapes are config-only folders (``brisk/bench/configs.py``); prompts are 256 random token ids.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk import LLM, SamplingParams  # noqa: E402
from brisk.bench.configs import write_config_folder  # noqa: E402
from brisk.bench.copying_weights import make_copying  # noqa: E402

PROMPT_LEN = 256


def measure(llm: LLM, prompts: list[list[int]], max_tokens: int, batch_size: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    tokens = accepted = drafts = 0
    decode_s = 0.0
    batch = [prompts[i % len(prompts)] for i in range(batch_size)]
    for _ in range(max(1, 8 // batch_size)):  # at least 8 sequences per figure
        for out in llm.generate(batch, params, use_tqdm=False):
            m = out.metrics
            tokens += len(out.outputs[0].token_ids) - 1
            accepted, drafts = accepted + m.num_accepted_tokens, drafts + m.num_draft_tokens
            decode_s += (m.finished_time - m.first_token_time) / batch_size  # requests of a batch overlap
    steps = (tokens - accepted) / batch_size
    return {"batch_size": batch_size, "decode_tokens": tokens, "num_draft_tokens": drafts,
            "num_accepted_tokens": accepted, "tokens_per_step": round(tokens / (tokens - accepted), 3),
            "step_ms": round(1e3 * decode_s / steps, 4)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-shape")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-shape")
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", choices=("draft_model", "ngram"), default=["draft_model", "ngram"])
    parser.add_argument("--accept-all", action="store_true", help="Models that copy their input: every draft accepted.")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="brisk-spec-shapes-"))
    target = str(write_config_folder(folder / "target", args.target))
    draft = str(write_config_folder(folder / "draft", args.draft))
    rng = random.Random(0)
    vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    prompts = [[rng.randrange(vocab) for _ in range(PROMPT_LEN)] for _ in range(8)]
    configs = [None]
    if "draft_model" in args.methods:
        configs += [
            {"method": "draft_model", "model": draft, "num_speculative_tokens": k, "disable_by_batch_size": None}
            for k in args.k
        ]
    if "ngram" in args.methods:
        configs += [
            {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "disable_by_batch_size": None}
            for k in args.k
        ]
    engine = {"load_format": "dummy", "max_model_len": 4096, "max_num_seqs": max(args.batch_size)}
    plain: dict[int, float] = {}
    results = []
    for spec in configs:
        llm = LLM(target, speculative_config=spec, **engine)
        if args.accept_all:
            make_copying(llm.engine.model_runner.model)
            if llm.engine.drafter is not None:
                make_copying(llm.engine.drafter.runner.model)
        measure(llm, prompts, 8, 1)  # warm-up
        for batch_size in args.batch_size:
            result = {"spec": spec, **measure(llm, prompts, args.max_tokens, batch_size)}
            if spec is None:
                plain[batch_size] = result["step_ms"]
            else:
                result["step_vs_plain"] = round(result["step_ms"] / plain[batch_size], 3)
            print(json.dumps(result), flush=True)
            results.append(result)
        del llm
        gc.collect()
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
