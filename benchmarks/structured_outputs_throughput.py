"""What a JSON schema costs at batch 256: W2-shaped requests (256 prompts of 512 random token ids, up to 128 output
tokens, greedy) with and without a JSON-schema constraint, output tokens/s of each and their ratio.

    python benchmarks/structured_outputs_throughput.py --model FOLDER [--num-prompts 256] [--json FILE]
        [engine flags as JSON: --engine '{"load_format": "dummy", "max_model_len": 4096}']

The model needs a real tokenizer (the grammar is compiled against its vocabulary): for random weights, write the
8B shape with the SmolLM2 vocabulary and a tokenizer (``brisk bench write-config
llama-3.1-8b-shape-smollm2-vocab FOLDER --tokenizer TOKENIZER``). The unconstrained run ignores EOS, so it makes
exactly 128 tokens a request; the constrained one stops where its JSON is complete (at most 128): both are
compared as generated tokens per second of wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk import LLM, SamplingParams  # noqa: E402
from brisk.structured_outputs import StructuredOutputsParams  # noqa: E402

# Free-form strings and arrays, so that random weights keep generating inside the grammar (a closed enum would end
# every request after a few tokens and time only the prefill).
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
        "notes": {"type": "string"},
    },
    "required": ["title", "tags", "score", "notes"],
}


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    return wall, sum(len(o.outputs[0].token_ids) for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--engine", type=json.loads, default={}, help="extra LLM(...) arguments as JSON")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    llm = LLM(args.model, **args.engine)
    vocab = min(10000, llm.engine.model_config.hf_config.vocab_size)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, vocab, (args.num_prompts, args.input_len)).tolist()
    plain = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    constrained = SamplingParams(
        temperature=0, max_tokens=args.output_len, structured_outputs=StructuredOutputsParams(json=SCHEMA)
    )
    warm = rng.integers(0, vocab, (4, 64)).tolist()
    llm.generate(warm, plain, use_tqdm=False)
    llm.generate(warm, constrained, use_tqdm=False)  # compiles the grammar (cached by schema)
    # Fresh prompts for each run: the prefix cache must not serve the second run's prefills.
    runs = {}
    for name, params, offset in (("plain", plain, 0), ("json_schema", constrained, 1)):
        prompts = [[(t + offset) % vocab for t in p] for p in ids]
        wall, tokens = timed(llm, prompts, params)
        runs[name] = {"wall_s": round(wall, 3), "output_tokens": tokens, "output_tok_s": round(tokens / wall, 1)}
    ratio = runs["json_schema"]["output_tok_s"] / runs["plain"]["output_tok_s"]
    result = {"model": args.model, "num_prompts": args.num_prompts, "runs": runs, "ratio": round(ratio, 3)}
    print(
        f"structured outputs, {args.num_prompts} x {args.input_len} in, <= {args.output_len} out: plain "
        f"{runs['plain']['output_tok_s']:,.0f} tok/s, json_schema {runs['json_schema']['output_tok_s']:,.0f} tok/s "
        f"({runs['json_schema']['output_tokens']} tokens): {ratio:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
