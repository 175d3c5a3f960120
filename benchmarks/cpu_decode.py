"""CPU decode speed of the embedded default model: brisk vs HF transformers ``generate``, same weights, same threads.

    python benchmarks/cpu_decode.py [--threads N] [--batch-sizes 1 16] [--prompt-len 128] [--output-len 128]

Both engines load the folder ``resolve_model(MODEL, torch.float32)`` returns (the Q4_1 GGUF dequantized to
float32 safetensors) in one process with the same ``torch.set_num_threads``. Per batch size and repeat, a fresh
batch of random prompts (numpy ``default_rng``, ids in [0, 10000)) is generated greedily by each engine twice:
with ``output_len`` tokens (brisk ``ignore_eos``, HF ``min_new_tokens = max_new_tokens``) and with 1 token. The
engines alternate within a repeat, so a change in machine load hits both alike.

- end-to-end tok/s = batch x output_len / wall (prefill included);
- decode tok/s = batch x (output_len - 1) / (wall(output_len) - wall(1)) (prefill and the first token removed).

Each figure is the best of ``--repeats`` runs (min wall: on a shared machine the least disturbed run is the
closest to the engine's own speed; every run's wall is printed on stderr and written by ``--json``). brisk
runs without the prefix cache (the prompts of the two runs are the same) and without detokenization, like
``brisk bench``. ``--json FILE`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk.loader.resolve import DEFAULT_MODEL, resolve_model  # noqa: E402


class Brisk:
    name = "brisk"

    def __init__(self, folder: Path, max_batch: int, max_len: int):
        from brisk import LLM

        start = time.perf_counter()
        self.llm = LLM(
            str(folder),
            device="cpu",
            dtype="float32",
            enable_prefix_caching=False,
            max_num_seqs=max(max_batch, 1),
            max_model_len=max_len,
            kv_cache_memory_bytes=(max_batch + 1) * max_len * self._kv_bytes_per_token(folder),
        )
        self.load_s = time.perf_counter() - start

    @staticmethod
    def _kv_bytes_per_token(folder: Path) -> int:
        config = json.loads((folder / "config.json").read_text())
        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        return 2 * config["num_hidden_layers"] * kv_heads * head * 4

    def generate(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
        from brisk import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        if any(len(t) != max_tokens for t in tokens):
            raise RuntimeError(f"brisk made {[len(t) for t in tokens]} tokens, expected {max_tokens} each")
        return wall, tokens


class HF:
    name = "hf"

    def __init__(self, folder: Path):
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.logging.disable_progress_bar()
        start = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.pad = self.model.generation_config.pad_token_id
        self.load_s = time.perf_counter() - start

    def generate(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
        ids = torch.tensor(prompts)  # equal lengths: no padding
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=self.pad,
            )
        wall = time.perf_counter() - start
        new = out[:, ids.shape[1] :]
        if new.shape[1] != max_tokens:
            raise RuntimeError(f"HF made {new.shape[1]} tokens per row, expected {max_tokens}")
        return wall, new.tolist()


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean length of the common prefix of the two engines' greedy outputs, as a fraction of the output."""
    fractions = []
    for x, y in zip(a, b):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        fractions.append(n / max(len(x), 1))
    return sum(fractions) / len(fractions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"Model name or path (default: {DEFAULT_MODEL}).")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="Runs per batch size and engine (best reported).")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default).")
    parser.add_argument("--backends", nargs="+", choices=["brisk", "hf"], default=["brisk", "hf"])
    parser.add_argument("--seed", type=int, default=0, help="Seed of the random prompts.")
    parser.add_argument("--json", default=None, help="Write every number to this file.")
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    load_before = os.getloadavg()
    folder = resolve_model(args.model, torch.float32)
    max_len = args.prompt_len + args.output_len + 16

    engines = []
    for name in args.backends:
        engine = Brisk(folder, max(args.batch_sizes), max_len) if name == "brisk" else HF(folder)
        engines.append(engine)
        print(f"{name}: loaded in {engine.load_s:.1f} s", file=sys.stderr, flush=True)

    rng = np.random.default_rng(args.seed)

    def fresh_prompts(batch: int) -> list[list[int]]:
        return rng.integers(0, 10000, (batch, args.prompt_len)).tolist()

    # Warm-up: one short run per engine and batch size (first-call allocations, lazy inits).
    for batch in args.batch_sizes:
        prompts = fresh_prompts(batch)
        for engine in engines:
            engine.generate(prompts, 8)

    results: dict = {}
    for batch in args.batch_sizes:
        walls = {e.name: {"full": [], "one": []} for e in engines}
        agree = []
        for repeat in range(args.repeats):
            prompts = fresh_prompts(batch)
            outputs = {}
            for engine in engines:
                full, outputs[engine.name] = engine.generate(prompts, args.output_len)
                one, _ = engine.generate(prompts, 1)
                walls[engine.name]["full"].append(full)
                walls[engine.name]["one"].append(one)
                print(
                    f"batch {batch} repeat {repeat + 1}/{args.repeats} {engine.name}: "
                    f"{args.output_len} tokens {full:.2f} s, 1 token {one:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
            if len(outputs) == 2:
                agree.append(agreement(outputs["brisk"], outputs["hf"]))
        results[batch] = {}
        for name, w in walls.items():
            full, one = min(w["full"]), min(w["one"])
            results[batch][name] = {
                "wall_s": w["full"],
                "one_token_wall_s": w["one"],
                "end_to_end_tok_s": batch * args.output_len / full,
                "decode_tok_s": batch * (args.output_len - 1) / (full - one) if full > one else float("nan"),
            }
        if agree:
            results[batch]["greedy_prefix_agreement"] = sum(agree) / len(agree)
    load_after = os.getloadavg()

    import transformers

    setup = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "model": args.model,
        "folder": str(folder),
        "dtype": "float32",
        "threads": threads,
        "cpu_count": os.cpu_count(),
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }

    print(
        f"\n{args.model} (float32), CPU, {threads} thread(s), prompt {args.prompt_len}, output {args.output_len}, "
        f"greedy, ignore_eos, best of {args.repeats}"
    )
    print(f"load average before {setup['loadavg_before']}, after {setup['loadavg_after']} ({os.cpu_count()} CPUs)")
    names = [e.name for e in engines]
    header = "| batch | " + " | ".join(f"{n} decode tok/s | {n} e2e tok/s" for n in names)
    if len(names) == 2:
        header += " | decode brisk/hf | e2e brisk/hf | greedy agreement"
    print(header + " |")
    print("|" + "---|" * (header.count("|")))
    for batch, r in results.items():
        cells = [str(batch)]
        for n in names:
            cells += [f"{r[n]['decode_tok_s']:.1f}", f"{r[n]['end_to_end_tok_s']:.1f}"]
        if len(names) == 2:
            cells += [
                f"{r['brisk']['decode_tok_s'] / r['hf']['decode_tok_s']:.2f}x",
                f"{r['brisk']['end_to_end_tok_s'] / r['hf']['end_to_end_tok_s']:.2f}x",
                f"{r['greedy_prefix_agreement']:.0%}",
            ]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"setup": setup, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
