"""Where a speculative step's time goes on the GPU, phase by phase and kernel by kernel.

    python benchmarks/profile_spec_step.py [--target qwen2.5-coder-1.5b-shape] [--draft qwen2.5-coder-0.5b-shape]
        [--k 4] [--batch-size 1] [--max-tokens 64] [--accept-all] [--json FILE]

Random weights at the real pair's shapes (as ``spec_step_cost.py``). Two passes per engine (plain, the draft
model, n-gram): one with every phase wrapped in device synchronizations (drafting, preparing the step, each kind
of graph replay, verification, the engine step as a whole), which serializes the step but bills each phase its
own device time; then one under ``torch.profiler``, for the kernels that take the device's time. ``--accept-all``:
models that copy their input (``brisk/bench/copying_weights.py``), so every draft is accepted.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk import LLM, SamplingParams  # noqa: E402
from brisk.bench.configs import write_config_folder  # noqa: E402
from brisk.bench.copying_weights import make_copying  # noqa: E402
from brisk.spec_decode.draft_model import DraftModelProposer  # noqa: E402
from brisk.worker.cuda_graphs import StepGraphs  # noqa: E402
from brisk.worker.model_runner import ModelRunner  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class PhaseTimes:
    """Wraps methods so that each call is timed between two device synchronizations."""

    def __init__(self) -> None:
        self.enabled = False
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.labels: dict[int, str] = {}  # id of a StepGraphs -> what it replays

    def wrap(self, owner, name: str, label=None) -> None:
        original = getattr(owner, name)

        def timed(obj, *args, **kwargs):
            if not self.enabled:
                return original(obj, *args, **kwargs)
            phase = label(obj) if label else name
            _sync()
            start = time.perf_counter()
            result = original(obj, *args, **kwargs)
            _sync()
            self.totals[phase] += time.perf_counter() - start
            self.calls[phase] += 1
            return result

        setattr(owner, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-shape")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-shape")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--accept-all", action="store_true", help="Models that copy their input: every draft accepted.")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="brisk-spec-profile-"))
    target = str(write_config_folder(folder / "target", args.target))
    draft = str(write_config_folder(folder / "draft", args.draft))
    vocab = json.loads((Path(target) / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(256)] for _ in range(args.batch_size)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, detokenize=False)

    phases = PhaseTimes()
    phases.wrap(DraftModelProposer, "draft")
    phases.wrap(DraftModelProposer, "mirror")
    phases.wrap(ModelRunner, "_prepare")
    phases.wrap(ModelRunner, "_verify")
    phases.wrap(StepGraphs, "replay", lambda g: f"replay {phases.labels.get(id(g), '?')}")
    configs = {
        "plain": None,
        "draft_model": {
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": args.k,
            "disable_by_batch_size": None,
        },
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": args.k,
            "prompt_lookup_min": 1,
            "disable_by_batch_size": None,
        },
    }
    report = {}
    for name, spec in configs.items():
        llm = LLM(target, speculative_config=spec, load_format="dummy", max_model_len=4096,
                  max_num_seqs=max(8, args.batch_size))  # fmt: skip
        runner = llm.engine.model_runner
        if args.accept_all:
            make_copying(runner.model)
            if getattr(runner, "drafter", None) is not None:
                make_copying(runner.drafter.runner.model)
        phases.labels = {id(runner.graphs): "target decode", id(runner.verify_graphs): "target verify"}
        drafter = getattr(runner, "drafter", None)
        if drafter is not None:
            phases.labels |= {
                id(drafter.first_pass_graphs): "draft first pass",
                id(drafter.graphs): "draft pass",
                id(drafter.mirror_graphs): "draft mirror",
            }
        llm.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm-up
        engine = llm.engine
        original_step = type(engine).step
        steps = 0

        def step(self, _original=original_step):
            nonlocal steps
            steps += 1
            return _original(self)

        type(engine).step = step
        phases.totals.clear()
        phases.calls.clear()
        phases.enabled = True
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        phases.enabled = False
        timed_steps = steps
        per_step = {p: round(1e3 * t / timed_steps, 4) for p, t in sorted(phases.totals.items())}
        calls = {p: round(c / timed_steps, 2) for p, c in sorted(phases.calls.items())}

        steps = 0
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        free_ms = 1e3 * (time.perf_counter() - start) / max(steps, 1)
        activity = torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available() else None
        with torch.profiler.profile(activities=[activity or torch.profiler.ProfilerActivity.CPU]) as prof:
            steps = 0
            llm.generate(prompts, params, use_tqdm=False)
        kernels = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:25]
        type(engine).step = original_step
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        report[name] = {
            "steps": timed_steps,
            "tokens": tokens,
            "step_ms_unsynchronized": round(free_ms, 4),
            "step_ms_synchronized": round(1e3 * wall / timed_steps, 4),
            "phase_ms_per_step": per_step,
            "phase_calls_per_step": calls,
            "top_kernels_us_per_step": [
                (e.key[:90], round(e.device_time_total / steps, 1), round(e.count / steps, 2)) for e in kernels
            ],
        }
        print(json.dumps({name: report[name]}, indent=1), flush=True)
        del llm, runner, drafter, engine
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": report}, indent=1))


if __name__ == "__main__":
    main()
