"""``brisk bench throughput``: W1 / W2 offline throughput, one ``generate`` call over all requests after the
recipe's warm-up, wall clock around it (the peers' method, so figures line up with vLLM's anchor)."""

from __future__ import annotations

import argparse
import gc

from brisk.bench import datasets, report
from brisk.bench.backends import DEFAULT_HF_BATCH_SIZE
from brisk.bench.common import backend_fields, backends_of, engine_kwargs, finish, open_backend, run_backends


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
    with open_backend(args, backend_name, args.hf_batch_size or DEFAULT_HF_BATCH_SIZE) as backend:
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
            **backend_fields(backend, warmup_s),
        }
        if backend_name == "hf" and run.generated_tokens != out_tokens:
            result["note"] = (
                "static batches decode max(output_len) steps per batch; output_tokens counts only the requested "
                "tokens, generated_tokens all decoded ones"
            )
        return result


def run(args: argparse.Namespace) -> int:
    if args.hf_batch_size is not None:
        if "hf" not in backends_of(args):
            raise ValueError("--hf-batch-size sizes HF transformers' static batches: use it with --backend hf or both.")
        if args.hf_batch_size < 1:
            raise ValueError("--hf-batch-size must be >= 1.")
    workload = build(args)
    peer = report.load_peer(args.peer_json)
    results = run_backends(args, __name__, "run_one")
    base = workload.name.split("-")[0]
    peer_tok_s = ((peer or {}).get(base) or {}).get("output_tok_s") if workload.fingerprint_expected else None
    brisk_tok_s = results.get("brisk", {}).get("output_tok_s")
    ratios = {}
    for peer_name in ("hf", "vllm"):
        if peer_name in results:
            ratios[f"brisk_over_{peer_name}_output_tok_s"] = report.ratio(
                brisk_tok_s, results[peer_name].get("output_tok_s")
            )
    if peer_tok_s is not None:
        ratios["brisk_over_peer_output_tok_s"] = report.ratio(brisk_tok_s, peer_tok_s)
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
        "hf_batch_size": (args.hf_batch_size or DEFAULT_HF_BATCH_SIZE) if "hf" in results else None,
    }
    peer_info = report.peer_info(args, peer, output_tok_s=peer_tok_s)
    return finish("throughput", args, config, results, print_table, workload=summary, ratios=ratios, peer=peer_info)


def print_table(data: dict) -> None:
    w = data["workload"]
    fp = w["fingerprint"] + ("" if w["fingerprint_ok"] is None else " ok" if w["fingerprint_ok"] else " MISMATCH")
    sampling = f"T={w['temperature']:g}" if w["temperature"] else "greedy"
    print(
        f"\nbrisk bench throughput {w['name']}: {w['requests']} requests, {w['input_tokens']:,} input + "
        f"{w['output_tokens']:,} output tokens, {sampling}, "
        f"fingerprint {fp}; device {data.get('device_name')}"
    )
    peer = data.get("peer") or {}
    peer_row = [None, float(peer["output_tok_s"]), None, None, "-"] if peer.get("output_tok_s") else None
    report.print_results(
        data,
        ["backend", "wall s", "output tok/s", "total tok/s", "req/s", "exact lens"],
        lambda r: [r["wall_s"], r["output_tok_s"], r["total_tok_s"], r["req_s"], "yes" if r["exact_lengths"] else "NO"],
        peer_row,
    )
