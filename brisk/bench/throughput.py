"""``brisk bench throughput``: W1 / W2 offline throughput, one ``generate`` call over all requests after the
recipe's warm-up, wall clock around it (the peers' method, so figures line up with vLLM's anchor)."""

from __future__ import annotations

import argparse
import gc

from brisk.bench import configs, datasets, report
from brisk.bench.backends import make_backend
from brisk.bench.common import backends_of, engine_kwargs, run_backends


def build(args: argparse.Namespace) -> datasets.Workload:
    return datasets.build_workload(args.workload, args.num_prompts, args.input_len, args.output_len)


def check_fits(workload: datasets.Workload, vocab_size: int, max_model_len: int) -> None:
    if vocab_size < datasets.VOCAB_DRAW:
        raise ValueError(
            f"The workloads draw ids from [0, {datasets.VOCAB_DRAW}), but the model's vocabulary has {vocab_size}."
        )
    if workload.max_len > max_model_len:
        raise ValueError(
            f"{workload.name} needs {workload.max_len} tokens (prompt + output) but max_model_len is "
            f"{max_model_len}; pass --max-model-len {max(workload.max_len, 2048)} or more."
        )


def run_one(args: argparse.Namespace, backend_name: str) -> dict:
    """Build the engine, warm up, time the workload; the per-backend result dict."""
    workload = build(args)
    model, tmp = configs.materialize(args.model)
    try:
        backend = make_backend(backend_name, model, engine_kwargs(args), args.hf_batch_size)
        check_fits(workload, backend.vocab_size, backend.max_model_len)
        warmup_s = backend.warmup()
        gc.collect()
        run = backend.run(workload.prompts, workload.output_lens, workload.temperature)
        out_tokens = sum(run.output_counts)
        result = {
            "backend": backend_name,
            "wall_s": round(run.wall_s, 4),
            "input_tokens": workload.input_tokens,
            "output_tokens": out_tokens,
            "output_tokens_expected": workload.output_tokens,
            "exact_lengths": run.output_counts == workload.output_lens,
            "generated_tokens": run.generated_tokens,
            "output_tok_s": round(out_tokens / run.wall_s, 1),
            "total_tok_s": round((workload.input_tokens + out_tokens) / run.wall_s, 1),
            "req_s": round(workload.num_requests / run.wall_s, 3),
            "warmup_s": round(warmup_s, 3),
            "engine": backend.describe(),
            "device_name": report.device_name(backend.describe().get("device")),
        }
        if backend_name == "hf" and run.generated_tokens != out_tokens:
            result["note"] = (
                "static batches decode max(output_len) steps per batch; output_tokens counts only the requested "
                "tokens, generated_tokens all decoded ones"
            )
        backend.close()
        return result
    finally:
        if tmp is not None:
            tmp.cleanup()


def run(args: argparse.Namespace) -> int:
    if args.hf_batch_size < 1:
        raise ValueError("--hf-batch-size must be >= 1.")
    workload = build(args)
    results = run_backends(args, __name__, "run_one")
    peer = report.load_peer(args.peer_json)
    base = workload.name.split("-")[0]
    peer_tok_s = ((peer or {}).get(base) or {}).get("output_tok_s") if workload.fingerprint_expected else None
    brisk_tok_s = results.get("brisk", {}).get("output_tok_s")
    ratios = {}
    if "hf" in results:
        ratios["brisk_over_hf_output_tok_s"] = report.ratio(brisk_tok_s, results["hf"].get("output_tok_s"))
    if peer_tok_s is not None:
        ratios["brisk_over_peer_output_tok_s"] = report.ratio(brisk_tok_s, peer_tok_s)
    first = next(iter(results.values()))
    env = report.environment(probe_device=False)
    env["device_name"] = first.get("device_name")
    summary = {
        "name": workload.name,
        "requests": workload.num_requests,
        "input_tokens": workload.input_tokens,
        "output_tokens": workload.output_tokens,
        "temperature": workload.temperature,
        "ignore_eos": True,
        "fingerprint": workload.fingerprint,
        "fingerprint_expected": workload.fingerprint_expected,
        "fingerprint_ok": None
        if workload.fingerprint_expected is None
        else workload.fingerprint == workload.fingerprint_expected,
        "note": workload.note,
    }
    config = {
        "model": args.model,
        "backends": backends_of(args),
        "engine_args": engine_kwargs(args),
        "hf_batch_size": args.hf_batch_size if "hf" in results else None,
    }
    peer_info = None
    if peer is not None:
        peer_info = {
            "caveat": report.peer_caveat(args.model),
            "path": args.peer_json,
            "engine": peer.get("engine"),
            "version": peer.get("vllm"),
            "output_tok_s": peer_tok_s,
        }
    data = report.make_report("throughput", args, config, results, env, workload=summary, ratios=ratios, peer=peer_info)
    print_table(data)
    report.write_json(data, args.output_json)
    return 0 if all("error" not in r for r in results.values()) else 1


def print_table(data: dict) -> None:
    w = data["workload"]
    fp = w["fingerprint"] + ("" if w["fingerprint_ok"] is None else " ok" if w["fingerprint_ok"] else " MISMATCH")
    sampling = f"T={w['temperature']:g}" if w["temperature"] else "greedy"
    print(
        f"\nbrisk bench throughput {w['name']}: {w['requests']} requests, {w['input_tokens']:,} input + "
        f"{w['output_tokens']:,} output tokens, {sampling}, "
        f"fingerprint {fp}; device {data.get('device_name')}"
    )
    rows = []
    for name, r in data["results"].items():
        if "error" in r:
            rows.append([name, r["error"], "", "", "", ""])
            continue
        exact = "yes" if r["exact_lengths"] else "NO"
        rows.append([name, r["wall_s"], r["output_tok_s"], r["total_tok_s"], r["req_s"], exact])
    peer = data.get("peer") or {}
    if peer.get("output_tok_s"):
        rows.append(
            [
                f"{peer.get('engine') or 'peer'} {peer.get('version') or ''} (peer json)".strip(),
                None,
                float(peer["output_tok_s"]),
                None,
                None,
                "-",
            ]
        )
    print(report.table(["backend", "wall s", "output tok/s", "total tok/s", "req/s", "exact lens"], rows))
    for key, value in data["ratios"].items():
        if value is not None:
            print(f"{key}: {value:.2f}x")
    if peer.get("caveat"):
        print(f"note: {peer['caveat']}")
