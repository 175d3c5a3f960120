"""How n-gram speculation's steps split under async scheduling: launched ahead (the lookup, one step behind, found
nothing) or waiting (drafts, or a match to act on), against every step waiting as before; counts, not timings,
so it runs anywhere (the CPU's async scheduling is the GPU's).

    python benchmarks/ngram_launch_ahead.py [--model qwen2.5-coder-0.5b-instruct] [--k 4] [--max-tokens 128]

The editing prompts of ``spec_decode_prompts.py``, one at a time (batch 1, where speculation is on), greedy. Per
mode: output tokens, drafts proposed and accepted, steps that verified drafts, steps launched ahead and steps
that waited; and whether both modes gave the same tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec_decode_prompts import REWRITE, messages  # noqa: E402

from brisk import LLM, SamplingParams  # noqa: E402


def run(llm: LLM, conversations: list, params: SamplingParams) -> tuple[dict, list]:
    """Every conversation alone; the engine's steps counted by whether they were launched before the last step's
    tokens were read back (ahead) or after (waited)."""
    before = dict(llm.engine.launch_counts)
    outputs = [llm.chat([conversation], params, use_tqdm=False)[0] for conversation in conversations]
    metrics = [o.metrics for o in outputs]
    return {
        "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "drafts": sum(m.num_draft_tokens for m in metrics),
        "accepted": sum(m.num_accepted_tokens for m in metrics),
        "spec_steps": sum(m.num_spec_steps for m in metrics),
        "launched_ahead": llm.engine.launch_counts["ahead"] - before["ahead"],
        "waited": llm.engine.launch_counts["waited"] - before["waited"],
    }, [o.outputs[0].token_ids for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    tokens = {}
    for mode, async_scheduling in (("every step waits", False), ("launched ahead where nothing matched", True)):
        llm = LLM(
            args.model,
            device=args.device,
            speculative_config=spec,
            async_scheduling=async_scheduling,
            max_model_len=4096,
        )
        result, tokens[mode] = run(llm, messages(REWRITE), params)
        print(json.dumps({"mode": mode, **result}), flush=True)
        del llm
    print(json.dumps({"same_tokens": len(set(map(str, tokens.values()))) == 1}))


if __name__ == "__main__":
    main()
