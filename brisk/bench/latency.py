"""``brisk bench latency``: W3, one request (or a fixed batch) at a time.

Runs of ``output_len`` tokens on fresh prompts, then runs of one token (a TTFT proxy); decode tok/s is
``batch * output_len / wall`` of the median run, ms per output token ~ ``(wall - wall_1tok) / (output_len - 1)``.
"""

from __future__ import annotations

import argparse
import gc
import statistics

from brisk.bench import datasets, report
from brisk.bench.common import backend_fields, backends_of, engine_kwargs, finish, open_backend, run_backends


def _median(values: list[float]) -> float:
    return statistics.median(values)


def run_one(args: argparse.Namespace, backend_name: str) -> dict:
    runs, runs_1tok = datasets.latency_prompts(args.num_iters, args.batch_size, args.input_len)
    with open_backend(args, backend_name, args.batch_size) as backend:
        if backend.vocab_size < datasets.VOCAB_DRAW:
            raise ValueError(
                f"The prompts draw ids from [0, {datasets.VOCAB_DRAW}); the vocabulary has {backend.vocab_size}."
            )
        if args.input_len + args.output_len > backend.max_model_len:
            raise ValueError(
                f"--input-len + --output-len = {args.input_len + args.output_len} exceeds "
                f"max_model_len {backend.max_model_len}."
            )
        warmup_s = backend.warmup()
        gc.collect()
        walls, counts, engine_ttft, engine_decode = [], [], [], []
        for prompts in runs:
            r = backend.run(prompts, [args.output_len] * len(prompts), 0.0)
            walls.append(r.wall_s)
            counts.append(sum(r.output_counts))
            engine_ttft += [t for t in r.ttft_s if t is not None]
            engine_decode += [t for t in r.decode_s if t is not None]
        walls_1tok = [backend.run(prompts, [1] * len(prompts), 0.0).wall_s for prompts in runs_1tok]
        med, med1 = _median(walls), _median(walls_1tok)
        batch, out = args.batch_size, args.output_len
        result = {
            "backend": backend_name,
            "batch_size": batch,
            "input_len": args.input_len,
            "output_len": out,
            "runs": len(walls),
            "output_tokens": counts,
            "exact_lengths": all(c == batch * out for c in counts),
            "wall_s": [round(w, 4) for w in walls],
            "decode_tok_s": [round(c / w, 2) for c, w in zip(counts, walls)],
            "decode_tok_s_median": round(batch * out / med, 2),
            "wall_1tok_s": [round(w, 4) for w in walls_1tok],
            "ttft_ms_median": round(1000 * med1, 3),
            "ms_per_token_incl_prefill": round(1000 * med / out, 3),
            "ms_per_output_token_est": round(1000 * (med - med1) / (out - 1), 3) if out > 1 else None,
            **backend_fields(backend, warmup_s),
        }
        if engine_ttft:  # brisk's own timestamps (RequestOutput.metrics): TTFT and pure decode speed
            result["engine_ttft_ms_median"] = round(1000 * _median(engine_ttft), 3)
        if engine_decode and out > 1:
            result["engine_decode_tok_s_median"] = round((out - 1) / _median(engine_decode), 2)
        return result


def run(args: argparse.Namespace) -> int:
    if args.num_iters < 1 or args.batch_size < 1 or args.input_len < 1 or args.output_len < 1:
        raise ValueError("--num-iters, --batch-size, --input-len and --output-len must be >= 1.")
    peer = report.load_peer(args.peer_json)
    results = run_backends(args, __name__, "run_one")
    recipe = (1, datasets.W3_INPUT_LEN, datasets.W3_OUTPUT_LEN, datasets.W3_RUNS)
    is_w3 = (args.batch_size, args.input_len, args.output_len, args.num_iters) == recipe
    peer_w3 = ((peer or {}).get("W3") or {}) if is_w3 else {}
    brisk_tok_s = results.get("brisk", {}).get("decode_tok_s_median")
    ratios = {}
    for peer_name in ("hf", "vllm"):
        if peer_name in results:
            ratios[f"brisk_over_{peer_name}_decode_tok_s"] = report.ratio(
                brisk_tok_s, results[peer_name].get("decode_tok_s_median")
            )
    if peer_w3.get("decode_tok_s_median"):
        ratios["brisk_over_peer_decode_tok_s"] = report.ratio(brisk_tok_s, peer_w3["decode_tok_s_median"])
    config = {"model": args.model, "backends": backends_of(args), "engine_args": engine_kwargs(args)}
    workload = {
        "name": "W3" if is_w3 else "latency-custom",
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_iters": args.num_iters,
        "seed": datasets.W3_SEED,
        "greedy": True,
        "ignore_eos": True,
    }
    peer_info = report.peer_info(
        args,
        peer,
        decode_tok_s_median=peer_w3.get("decode_tok_s_median"),
        ms_per_output_token_est=peer_w3.get("ms_per_output_token_est"),
    )
    return finish("latency", args, config, results, print_table, workload=workload, ratios=ratios, peer=peer_info)


def print_table(data: dict) -> None:
    w = data["workload"]
    print(
        f"\nbrisk bench latency {w['name']}: batch {w['batch_size']}, input {w['input_len']}, output "
        f"{w['output_len']}, greedy, {w['num_iters']} runs; device {data.get('device_name')}"
    )
    peer = data.get("peer") or {}
    peer_row = None
    if peer.get("decode_tok_s_median"):
        peer_row = [float(peer["decode_tok_s_median"]), peer.get("ms_per_output_token_est"), None, "", "-"]
    report.print_results(
        data,
        ["backend", "decode tok/s", "ms/out tok", "1-tok wall ms", "runs tok/s", "exact lens"],
        lambda r: [
            r["decode_tok_s_median"],
            r["ms_per_output_token_est"],
            r["ttft_ms_median"],
            ", ".join(f"{x:.1f}" for x in r["decode_tok_s"]),
            "yes" if r["exact_lengths"] else "NO",
        ],
        peer_row,
    )
