"""What each sampling setting costs over greedy decoding, in brisk or in vLLM, measured the same way for both:
decode tok/s with greedy, temperature, a per-request seed, top-p, top-k and min-p, at each batch size given.

    python benchmarks/sampling_cost.py --impl brisk|vllm --model MODEL [--batch-size 1 32] [--input-len 128]
        [--output-len 256] [--repeats 3] [--settings greedy seed ...] [--engine JSON] [--json FILE]

MODEL is a folder or, for brisk, a shape name (``brisk bench``'s config-only folders, random weights; give vLLM
the folder brisk wrote, printed as ``model``). One engine serves every setting, with prefix caching off and
random weights where the folder has none. Each run sends ``batch`` prompts of random token ids at once, seeded
requests with seeds 0, 1, ...: first with ``max_tokens=1`` (prefill and the first token), then with
``--output-len``; decode tok/s = the tokens after each request's first / the difference of the two wall times,
the median of ``--repeats`` runs, and ``vs_greedy`` its ratio to greedy's at the same batch size. Run it once per
``--impl`` on one machine (each where that engine imports) and compare the JSON files.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "greedy": {"temperature": 0.0},
    "temperature": {"temperature": 0.7},
    "seed": {"temperature": 0.7, "seed": 0},
    "top_p": {"temperature": 0.7, "top_p": 0.9},
    "top_k": {"temperature": 0.7, "top_k": 50},
    "min_p": {"temperature": 0.7, "min_p": 0.05},
}


def wall_s(llm, module, prompts: list[list[int]], fields: dict, max_tokens: int) -> float:
    seed = fields.get("seed")
    params = [
        module.SamplingParams(**{**fields, "seed": None if seed is None else seed + i}, max_tokens=max_tokens,
                              ignore_eos=True, detokenize=False)  # fmt: skip
        for i in range(len(prompts))
    ]
    began = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - began
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outputs)
    return elapsed


def decode_tok_s(llm, module, prompts: list[list[int]], fields: dict, output_len: int) -> float:
    first = wall_s(llm, module, prompts, fields, 1)
    return len(prompts) * (output_len - 1) / (wall_s(llm, module, prompts, fields, output_len) - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=("brisk", "vllm"), default="brisk")
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--engine", type=json.loads, default={}, help="more engine arguments (JSON)")
    parser.add_argument("--json", default=None, help="write every number to this file")
    args = parser.parse_args()
    model = args.model
    engine = {"enable_prefix_caching": False, "max_model_len": 4096, "seed": 0}
    if args.impl == "brisk":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
        from brisk.bench.configs import NAMED_CONFIGS, write_config_folder

        if model in NAMED_CONFIGS:
            model = str(write_config_folder(Path(tempfile.mkdtemp()) / "model", model))
    if not any(Path(model).glob("*.safetensors")) and Path(model).is_dir():
        engine["load_format"] = "dummy"
        if args.impl == "vllm":
            engine["skip_tokenizer_init"] = True  # a config-only folder: token-id prompts, no detokenizing
    module = importlib.import_module(args.impl)
    llm = module.LLM(model, **{**engine, **args.engine})
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    results = []
    for batch in args.batch_size:
        prompts = [[rng.randrange(vocab) for _ in range(args.input_len)] for _ in range(batch)]
        wall_s(llm, module, prompts, SETTINGS["greedy"], 8)  # warm-up at this batch size
        greedy = None
        for name in args.settings:
            runs = [decode_tok_s(llm, module, prompts, SETTINGS[name], args.output_len) for _ in range(args.repeats)]
            result = {"impl": args.impl, "setting": name, "batch_size": batch,
                      "decode_tok_s": round(statistics.median(runs), 1)}  # fmt: skip
            if name == "greedy":
                greedy = result["decode_tok_s"]
            elif greedy:
                result["vs_greedy"] = round(result["decode_tok_s"] / greedy, 3)
            print(json.dumps(result), flush=True)
            results.append(result)
    if args.json:
        report = {"impl": args.impl, "model": model, "input_len": args.input_len, "output_len": args.output_len,
                  "results": results}  # fmt: skip
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
