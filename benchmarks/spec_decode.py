"""Speculative decoding on the fixed code prompts (``spec_decode_prompts.py``): decode speed with and
without speculation, and the acceptance length.

    python benchmarks/spec_decode.py --model TARGET [--spec '{"method": "ngram", "num_speculative_tokens": 4}' ...]
        [--num-prompts 32] [--prompts all|write|rewrite] [--batch-size 1 ...] [--max-tokens 256]
        [--temperature 0 ...] [--device auto] [--engine JSON] [--json FILE]

Each ``--spec`` (repeatable) and the plain engine run the same prompts through the chat template, once for each
temperature and batch size given (one engine per configuration), with the same sampling settings. Per run:
decode tok/s = output tokens after the first / (finished - first token time), summed over prompts (prefill
excluded); for speculation also drafts proposed and accepted, the acceptance rate and the mean acceptance length
(tokens per verifying step), and the speedup over the plain run. Greedy runs also check that speculation gave the
plain run's tokens. ``--engine`` adds engine arguments to every run (on the CPU, e.g. ``'{"max_model_len": 4096,
"cpu_threads": 1}'``: target and draft KV for the models' full context do not fit the CPU's default 2 GiB).
``--prompts rewrite`` keeps the editing prompts (most of the answer is in the prompt: what n-gram lookup is for).
``--batch-size B`` sends B requests at a time (the prompts repeated to fill the batches): where speculation stops
paying; ``output_tok_s`` (all output tokens over the wall time of the batches, prefill included) is then the
figure to compare. Each run prints one JSON line as it finishes.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec_decode_prompts import REWRITE, WRITE, messages  # noqa: E402

from brisk import LLM, SamplingParams  # noqa: E402


def measure(llm: LLM, conversations: list, params: SamplingParams, batch_size: int) -> tuple[dict, list]:
    """One pass over the prompts, ``batch_size`` at a time: decode and output speed, speculation's counts."""
    tokens, decode_s, wall_s, drafts, accepted, steps, outputs = 0, 0.0, 0.0, 0, 0, 0, []
    for start in range(0, len(conversations), batch_size):
        began = time.perf_counter()
        batch = llm.chat(conversations[start : start + batch_size], params, use_tqdm=False)
        wall_s += time.perf_counter() - began
        for out in batch:
            m = out.metrics
            tokens += len(out.outputs[0].token_ids) - 1
            decode_s += m.finished_time - m.first_token_time
            drafts, accepted = drafts + m.num_draft_tokens, accepted + m.num_accepted_tokens
            steps += m.num_spec_steps
            outputs.append(out.outputs[0].token_ids)
    result = {"temperature": params.temperature, "batch_size": batch_size, "decode_tokens": tokens,
              "decode_s": round(decode_s, 4), "decode_tok_s": round(tokens / decode_s, 2) if decode_s else None,
              "output_tok_s": round((tokens + len(outputs)) / wall_s, 2)}  # fmt: skip
    if drafts:
        result.update(num_draft_tokens=drafts, num_accepted_tokens=accepted, num_spec_steps=steps,
                      acceptance_rate=round(accepted / drafts, 4),
                      mean_acceptance_length=round(1 + accepted / steps, 3) if steps else None)  # fmt: skip
    return result, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--spec", action="append", type=json.loads, default=[], help="a speculative_config (JSON)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompts", choices=("all", "write", "rewrite"), default="all")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1], help="requests sent at a time")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--engine", type=json.loads, default={}, help="more engine arguments for every run (JSON)")
    parser.add_argument("--json", default=None, help="write every number to this file")
    args = parser.parse_args()
    chosen = {"all": WRITE + REWRITE, "write": WRITE, "rewrite": REWRITE}[args.prompts]
    prompts = messages(chosen)[: args.num_prompts]
    engine = {"device": args.device, **args.engine}
    plain: dict[tuple, tuple[dict, list]] = {}
    results = []
    for spec in [None, *args.spec]:
        llm = LLM(args.model, speculative_config=spec, **engine)
        llm.chat(prompts[0], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm-up
        for temperature in args.temperature:
            params = SamplingParams(temperature=temperature, max_tokens=args.max_tokens, seed=0)
            for batch_size in args.batch_size:
                conversations = [prompts[i % len(prompts)] for i in range(max(len(prompts), batch_size))]
                result, tokens = measure(llm, conversations, params, batch_size)
                result = {"spec": spec, **result}
                key = (temperature, batch_size)
                if spec is None:
                    plain[key] = (result, tokens)
                else:
                    base, base_tokens = plain[key]
                    result["speedup"] = round(result["decode_tok_s"] / base["decode_tok_s"], 3)
                    result["output_speedup"] = round(result["output_tok_s"] / base["output_tok_s"], 3)
                    if temperature == 0:
                        result["same_tokens_as_plain"] = tokens == base_tokens
                print(json.dumps(result), flush=True)
                results.append(result)
        del llm
        gc.collect()
    report = {"model": args.model, "prompts": args.prompts, "num_prompts": len(prompts),
              "max_tokens": args.max_tokens, "results": results}  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
