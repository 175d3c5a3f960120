"""Speculative decoding at batch 1 on the fixed code prompts (``spec_decode_prompts.py``): decode speed with and
without speculation, and the acceptance length.

    python benchmarks/spec_decode.py --model TARGET [--spec '{"method": "ngram", "num_speculative_tokens": 4}' ...]
        [--num-prompts 32] [--prompts all|write|rewrite] [--batch-size 1] [--max-tokens 256] [--temperature 0]
        [--device auto] [--engine JSON] [--json FILE]

Each ``--spec`` (repeatable) and the plain engine run the same prompts one at a time through the chat template,
with the same sampling settings. Per run: decode tok/s = output tokens after the first / (finished - first token
time), summed over prompts (prefill excluded); for speculation also drafts proposed and accepted, the acceptance
rate and the mean acceptance length (tokens per verifying step), and the speedup over the plain run. Greedy runs
also check that speculation gave the plain run's tokens. ``--engine`` adds engine arguments to every run (on the
CPU, e.g. ``'{"max_model_len": 4096, "cpu_threads": 1}'``: target and draft KV for the models' full context do
not fit the CPU's default 2 GiB). ``--prompts rewrite`` keeps the editing prompts (most of the answer is in the
prompt: what n-gram lookup is for). ``--batch-size B`` sends B requests at a time (the prompts repeated to fill
the batches): where speculation stops paying; ``output_tok_s`` (all output tokens over the wall time of the
batches, prefill included) is then the figure to compare.
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


def run(
    model: str, spec: dict | None, conversations: list, params: SamplingParams, engine: dict, batch_size: int
) -> tuple[dict, list]:
    llm = LLM(model, speculative_config=spec, **engine)
    llm.chat(conversations[0], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm-up
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
    del llm
    gc.collect()
    result = {"spec": spec, "decode_tokens": tokens, "decode_s": round(decode_s, 4),
              "decode_tok_s": round(tokens / decode_s, 2) if decode_s else None,
              "output_tok_s": round((tokens + len(outputs)) / wall_s, 2)}  # fmt: skip
    if spec is not None:
        result.update(num_draft_tokens=drafts, num_accepted_tokens=accepted, num_spec_steps=steps,
                      acceptance_rate=round(accepted / drafts, 4) if drafts else None,
                      mean_acceptance_length=round(1 + accepted / steps, 3) if steps else None)  # fmt: skip
    return result, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--spec", action="append", type=json.loads, default=[], help="a speculative_config (JSON)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompts", choices=("all", "write", "rewrite"), default="all")
    parser.add_argument("--batch-size", type=int, default=1, help="requests sent at a time")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--engine", type=json.loads, default={}, help="more engine arguments for every run (JSON)")
    parser.add_argument("--json", default=None, help="write every number to this file")
    args = parser.parse_args()
    chosen = {"all": WRITE + REWRITE, "write": WRITE, "rewrite": REWRITE}[args.prompts]
    conversations = messages(chosen)[: args.num_prompts]
    conversations = [conversations[i % len(conversations)] for i in range(max(len(conversations), args.batch_size))]
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=0)
    engine = {"device": args.device, **args.engine}
    plain, plain_tokens = run(args.model, None, conversations, params, engine, args.batch_size)
    results = [plain]
    for spec in args.spec:
        result, tokens = run(args.model, spec, conversations, params, engine, args.batch_size)
        result["speedup"] = round(result["decode_tok_s"] / plain["decode_tok_s"], 3)
        result["output_speedup"] = round(result["output_tok_s"] / plain["output_tok_s"], 3)
        if args.temperature == 0:
            result["same_tokens_as_plain"] = tokens == plain_tokens
        results.append(result)
    report = {"model": args.model, "prompts": args.prompts, "num_prompts": len(conversations),
              "batch_size": args.batch_size, "max_tokens": args.max_tokens, "temperature": args.temperature,
              "results": results}  # fmt: skip
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
