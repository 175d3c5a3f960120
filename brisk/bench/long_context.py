"""``brisk bench long-context``: W4, a long prompt prefilled, then decoded on a prefix-cache hit.

Per batch size (1, then 8): a one-token request on each prompt with its last id replaced prefills the prompts
(and leaves all of each but its last block in the prefix cache); then the prompts themselves, ``output_len``
tokens each, time decoding at that context. prefill tok/s = batch * input_len / wall of the first run; decode
tok/s = output tokens / wall of the second (whose prefill is the last block alone). The recipe is
the recipe vLLM's W4 figures were measured with, so they line up.
"""

from __future__ import annotations

import argparse
import gc

from brisk.bench import datasets, report
from brisk.bench.common import backend_fields, check_engine_flags, engine_kwargs, finish, open_backend


def _is_recipe(args: argparse.Namespace) -> bool:
    return (tuple(args.batch_sizes), args.input_len, args.output_len) == (
        datasets.W4_BATCH_SIZES,
        datasets.W4_INPUT_LEN,
        datasets.W4_OUTPUT_LEN,
    )


def run_one(args: argparse.Namespace) -> dict:
    batches = datasets.long_context_prompts(args.batch_sizes, args.input_len)
    with open_backend(args, "brisk", 1) as backend:
        if backend.vocab_size < datasets.VOCAB_DRAW:
            raise ValueError(
                f"The prompts draw ids from [0, {datasets.VOCAB_DRAW}); the vocabulary has {backend.vocab_size}."
            )
        warmup_s = backend.warmup()
        gc.collect()
        per_batch = {}
        for prompts in batches:
            bs = len(prompts)
            prefill = backend.run([p[:-1] + [datasets.W4_PREFILL_LAST_ID] for p in prompts], [1] * bs, 0.0)
            decode = backend.run(prompts, [args.output_len] * bs, 0.0)
            out = sum(decode.output_counts)
            per_batch[f"bs{bs}"] = {
                "batch_size": bs,
                "prefill_s": round(prefill.wall_s, 4),
                "prefill_tok_s": round(bs * args.input_len / prefill.wall_s, 1),
                "decode_wall_s": round(decode.wall_s, 4),
                "decode_tok_s": round(out / decode.wall_s, 1),
                "output_tokens": out,
                "exact_lengths": decode.output_counts == [args.output_len] * bs,
                "prefix_hit_tokens": decode.cached_tokens,
            }
        return {"backend": "brisk", "batches": per_batch, **backend_fields(backend, warmup_s)}


def run(args: argparse.Namespace) -> int:
    if args.input_len < 2 or args.output_len < 1 or not args.batch_sizes or min(args.batch_sizes) < 1:
        raise ValueError("--input-len must be >= 2, --output-len >= 1, and each of --batch-sizes >= 1.")
    if len(set(args.batch_sizes)) != len(args.batch_sizes):
        raise ValueError(f"--batch-sizes must differ from each other, got {args.batch_sizes}.")
    if args.enable_prefix_caching is False:
        raise ValueError("W4 decodes on a prefix-cache hit: leave prefix caching on (drop --no-enable-prefix-caching).")
    if args.max_model_len is None:  # the named shapes' 4096 would not hold the prompt
        args.max_model_len = args.input_len + args.output_len
    elif args.max_model_len < args.input_len + args.output_len:
        raise ValueError(
            f"--input-len + --output-len = {args.input_len + args.output_len} exceeds --max-model-len "
            f"{args.max_model_len}; raise it or leave it out."
        )
    check_engine_flags(args)
    peer = report.load_peer(args.peer_json)
    results = {"brisk": run_one(args)}
    peer_w4 = ((peer or {}).get("W4") or {}) if _is_recipe(args) else {}
    ratios = {}
    for key, ours in results["brisk"]["batches"].items():
        theirs = peer_w4.get(key) or {}
        for figure in ("prefill_tok_s", "decode_tok_s"):
            if theirs.get(figure):
                ratios[f"brisk_over_peer_{figure}_{key}"] = report.ratio(ours[figure], theirs[figure])
    workload = {
        "name": "W4" if _is_recipe(args) else "W4-custom",
        "batch_sizes": list(args.batch_sizes),
        "input_len": args.input_len,
        "output_len": args.output_len,
        "seed": datasets.W4_SEED,
        "prefill_last_id": datasets.W4_PREFILL_LAST_ID,
        "greedy": True,
        "ignore_eos": True,
    }
    config = {"model": args.model, "backends": ["brisk"], "engine_args": engine_kwargs(args)}
    peer_info = report.peer_info(args, peer, W4=peer_w4 or None)
    return finish("long-context", args, config, results, print_table, workload=workload, ratios=ratios, peer=peer_info)


def print_table(data: dict) -> None:
    w = data["workload"]
    print(
        f"\nbrisk bench long-context {w['name']}: input {w['input_len']:,}, output {w['output_len']}, batch sizes "
        f"{', '.join(map(str, w['batch_sizes']))}, greedy; device {data.get('device_name')}"
    )
    rows = []
    for key, r in data["results"]["brisk"]["batches"].items():
        hit = f"{min(r['prefix_hit_tokens']):,}" if r["prefix_hit_tokens"] else "-"
        exact = "yes" if r["exact_lengths"] else "NO"
        rows.append([f"brisk {key}", r["prefill_s"], r["prefill_tok_s"], r["decode_tok_s"], hit, exact])
    peer = data.get("peer") or {}
    for key, r in (peer.get("W4") or {}).items():
        name = f"{peer.get('engine') or 'peer'} {peer.get('version') or ''} {key}".replace("  ", " ")
        rows.append([name, r.get("prefill_s"), r.get("prefill_tok_s"), r.get("decode_tok_s"), "", ""])
    headers = ["run", "prefill s", "prefill tok/s", "decode tok/s", "prefix hit (min)", "exact lens"]
    print(report.table(headers, rows))
    report.print_ratios(data)
