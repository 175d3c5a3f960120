"""``brisk bench latency``: W3, one request (or a fixed batch) at a time.

Runs of ``output_len`` tokens on fresh prompts, then runs of one token (a TTFT proxy); decode tok/s is
``batch * output_len / wall`` of the median run, ms per output token ~ ``(wall - wall_1tok) / (output_len - 1)``.
"""

from __future__ import annotations

import argparse
import gc
import statistics

from brisk.bench import configs, datasets, report
from brisk.bench.backends import make_backend
from brisk.bench.common import backends_of, engine_kwargs, run_backends


def _median(values: list[float]) -> float:
    return statistics.median(values)


def run_one(args: argparse.Namespace, backend_name: str) -> dict:
    runs, runs_1tok = datasets.latency_prompts(args.num_iters, args.batch_size, args.input_len)
    model, tmp = configs.materialize(args.model)
    try:
        backend = make_backend(backend_name, model, engine_kwargs(args), args.batch_size)
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
            "warmup_s": round(warmup_s, 3),
            "engine": backend.describe(),
            "device_name": report.device_name(backend.describe().get("device")),
        }
        if engine_ttft:  # brisk's own timestamps (RequestOutput.metrics): TTFT and pure decode speed
            result["engine_ttft_ms_median"] = round(1000 * _median(engine_ttft), 3)
        if engine_decode and out > 1:
            result["engine_decode_tok_s_median"] = round((out - 1) / _median(engine_decode), 2)
        backend.close()
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def run(args: argparse.Namespace) -> int:
    if args.num_iters < 1 or args.batch_size < 1 or args.input_len < 1 or args.output_len < 1:
        raise ValueError("--num-iters, --batch-size, --input-len and --output-len must be >= 1.")
    results = run_backends(args, __name__, "run_one")
    is_w3 = (args.batch_size, args.input_len, args.output_len) == (1, datasets.W3_INPUT_LEN, datasets.W3_OUTPUT_LEN)
    peer = report.load_peer(args.peer_json)
    peer_w3 = ((peer or {}).get("W3") or {}) if is_w3 else {}
    brisk_tok_s = results.get("brisk", {}).get("decode_tok_s_median")
    ratios = {}
    if "hf" in results:
        ratios["brisk_over_hf_decode_tok_s"] = report.ratio(brisk_tok_s, results["hf"].get("decode_tok_s_median"))
    if peer_w3.get("decode_tok_s_median"):
        ratios["brisk_over_peer_decode_tok_s"] = report.ratio(brisk_tok_s, peer_w3["decode_tok_s_median"])
    first = next(iter(results.values()))
    env = report.environment(probe_device=False)
    env["device_name"] = first.get("device_name")
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
    peer_info = None
    if peer is not None:
        peer_info = {
            "caveat": report.peer_caveat(args.model),
            "path": args.peer_json,
            "engine": peer.get("engine"),
            "version": peer.get("vllm"),
            "decode_tok_s_median": peer_w3.get("decode_tok_s_median"),
            "ms_per_output_token_est": peer_w3.get("ms_per_output_token_est"),
        }
    data = report.make_report("latency", args, config, results, env, workload=workload, ratios=ratios, peer=peer_info)
    print_table(data)
    report.write_json(data, args.output_json)
    return 0 if all("error" not in r for r in results.values()) else 1


def print_table(data: dict) -> None:
    w = data["workload"]
    print(
        f"\nbrisk bench latency {w['name']}: batch {w['batch_size']}, input {w['input_len']}, output "
        f"{w['output_len']}, greedy, {w['num_iters']} runs; device {data.get('device_name')}"
    )
    rows = []
    for name, r in data["results"].items():
        if "error" in r:
            rows.append([name, r["error"], "", "", "", ""])
            continue
        rows.append(
            [
                name,
                r["decode_tok_s_median"],
                r["ms_per_output_token_est"],
                r["ttft_ms_median"],
                ", ".join(f"{x:.1f}" for x in r["decode_tok_s"]),
                "yes" if r["exact_lengths"] else "NO",
            ]
        )
    peer = data.get("peer") or {}
    if peer.get("decode_tok_s_median"):
        rows.append(
            [
                f"{peer.get('engine') or 'peer'} {peer.get('version') or ''} (peer json)".strip(),
                float(peer["decode_tok_s_median"]),
                peer.get("ms_per_output_token_est"),
                None,
                "",
                "-",
            ]
        )
    headers = ["backend", "decode tok/s", "ms/out tok", "1-tok wall ms", "runs tok/s", "exact lens"]
    print(report.table(headers, rows))
    for key, value in data["ratios"].items():
        if value is not None:
            print(f"{key}: {value:.2f}x")
    if peer.get("caveat"):
        print(f"note: {peer['caveat']}")
