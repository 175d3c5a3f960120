"""n-gram speculation in brisk or in vLLM, measured the same way for both: one engine per setting, the same
chat prompts (``spec_decode_prompts.py``), batch 1, and only the wall clock, so no engine's own metrics decide.

    python benchmarks/spec_decode_side_by_side.py --impl brisk|vllm --model HF_FOLDER [--k 2 4 6]
        [--prompts rewrite|write|all] [--max-tokens 256] [--engine JSON] [--json FILE]

Run it twice on one machine, once per ``--impl`` (each in the Python environment where that engine imports), and
compare the two JSON files. Per prompt: the wall time of a 1-token request (prefill and the first token), then of
the full request; decode tok/s = output tokens after the first / the difference, summed over prompts. Prefix
caching is off in both engines, so the full request prefills again as the 1-token one did. Every setting is
greedy; each speculative run reports whether its tokens equal the plain run's and its speedup over it, and the
drafts proposed and accepted where the engine reports them (brisk: ``RequestOutput.metrics``; vLLM: its
``spec_decode`` counters through ``LLM.get_metrics()``).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec_decode_prompts import REWRITE, WRITE, messages  # noqa: E402


def ngram(k: int) -> dict:
    """The same prompt-lookup setting in both engines (vLLM's field names, which brisk shares)."""
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def spec_counts(impl: str, llm, outputs: list) -> tuple[int, int]:
    """Drafts proposed and accepted so far: brisk per request, vLLM from its cumulative counters."""
    if impl == "brisk":
        return (sum(o.metrics.num_draft_tokens for o in outputs), sum(o.metrics.num_accepted_tokens for o in outputs))
    counts = {m.name: getattr(m, "value", 0) for m in llm.get_metrics()}
    return (int(counts.get("vllm:spec_decode_num_draft_tokens", 0)),
            int(counts.get("vllm:spec_decode_num_accepted_tokens", 0)))  # fmt: skip


def run(impl: str, module, args, spec: dict | None, prompts: list) -> tuple[dict, list]:
    engine = {"enable_prefix_caching": False, "max_model_len": 4096, "seed": 0, **args.engine}
    if impl == "vllm":
        engine["disable_log_stats"] = False  # for get_metrics()
    began = time.perf_counter()
    llm = module.LLM(args.model, speculative_config=spec, **engine)
    start_s = time.perf_counter() - began
    one = module.SamplingParams(temperature=0, max_tokens=1)
    full = module.SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for conversation in prompts[:2]:  # warm-up: every step shape a run takes
        llm.chat(conversation, full, use_tqdm=False)
    drafts_before = spec_counts(impl, llm, []) if spec and impl == "vllm" else (0, 0)
    tokens, decode_s, outputs, finished = 0, 0.0, [], []
    for conversation in prompts:
        t0 = time.perf_counter()
        llm.chat(conversation, one, use_tqdm=False)
        t1 = time.perf_counter()
        out = llm.chat(conversation, full, use_tqdm=False)[0]
        t2 = time.perf_counter()
        decode_s += (t2 - t1) - (t1 - t0)
        tokens += len(out.outputs[0].token_ids) - 1
        outputs.append(list(out.outputs[0].token_ids))
        finished.append(out)
    result = {"impl": impl, "spec": spec, "start_s": round(start_s, 2), "decode_tokens": tokens,
              "decode_s": round(decode_s, 4), "decode_tok_s": round(tokens / decode_s, 2)}  # fmt: skip
    if spec:
        drafts, accepted = spec_counts(impl, llm, finished)
        drafts, accepted = drafts - drafts_before[0], accepted - drafts_before[1]
        result.update(num_draft_tokens=drafts, num_accepted_tokens=accepted,
                      acceptance_rate=round(accepted / drafts, 4) if drafts else None)  # fmt: skip
    del llm
    gc.collect()
    return result, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=("brisk", "vllm"), required=True)
    parser.add_argument("--model", required=True, help="an HF folder both engines load")
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4, 6], help="num_speculative_tokens to run")
    parser.add_argument("--prompts", choices=("all", "write", "rewrite"), default="rewrite")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--engine", type=json.loads, default={}, help="more engine arguments for every run (JSON)")
    parser.add_argument("--json", default=None, help="write every number to this file")
    args = parser.parse_args()
    if args.impl == "brisk":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    module = importlib.import_module(args.impl)
    prompts = messages({"all": WRITE + REWRITE, "write": WRITE, "rewrite": REWRITE}[args.prompts])
    base, base_tokens = run(args.impl, module, args, None, prompts)
    print(json.dumps(base), flush=True)
    results = [base]
    for k in args.k:
        result, tokens = run(args.impl, module, args, ngram(k), prompts)
        result["speedup"] = round(result["decode_tok_s"] / base["decode_tok_s"], 3)
        result["same_tokens_as_plain"] = tokens == base_tokens
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.json:
        report = {"impl": args.impl, "model": args.model, "prompts": args.prompts, "max_tokens": args.max_tokens,
                  "results": results}  # fmt: skip
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
