#!/usr/bin/env bash
# A/B two builds of brisk on one GPU machine (not a test): the serve stage of h200_run.sh (W5/W6 through
# `brisk serve` and `brisk bench serve`, a fresh server per build) and, optionally, offline workloads, for a base
# tree and for this checkout, in the order base, this, base, this when BRISK_AB_REPEAT=1; then a table of each
# point's figures and this checkout's ratio to the base, and the step timelines' decode-only and mixed-step means.
#   bash benchmarks/ab_serve.sh BASE_TREE          # BASE_TREE: another checkout (e.g. git worktree add ../base <sha>)
# Knobs: BRISK_SERVE_POINTS (as h200_run.sh; default "16:160 64:384 256:768 64:256:2000:100"), BRISK_AB_WORKLOADS
# (offline workloads for `brisk bench throughput`, e.g. "W1"; default none), BRISK_AB_REPEAT (1: a second round),
# and h200_run.sh's serve knobs. Results: $OUT/ab_<round>_<base|head>/.
set -uo pipefail
cd "$(dirname "$0")/.."
head_tree=$PWD
base_tree=$(cd "${1:?usage: ab_serve.sh BASE_TREE}" && pwd)
source benchmarks/gpu_env.sh
tokenizer=$(cd "${BRISK_SERVE_TOKENIZER:-.scratch/smollm2-tokenizer}" 2>/dev/null && pwd) || tokenizer=
points=${BRISK_SERVE_POINTS:-16:160 64:384 256:768 64:256:2000:100}
run_build() {  # tree label
    local tree=$1 label=$2 workload
    mkdir -p "$OUT/$label"
    [ -d .whl ] && [ ! -d "$tree/.whl" ] && cp -r .whl "$tree/"
    (cd "$tree" && OUT=$OUT/$label BRISK_SKIP_TESTS=1 BRISK_WORKLOADS= BRISK_SKIP_LATENCY=1 BRISK_SKIP_LONG_CONTEXT=1 \
        BRISK_SKIP_STARTUP=1 BRISK_SERVE_TOKENIZER=$tokenizer BRISK_SERVE_POINTS=$points bash benchmarks/h200_run.sh |
        grep -v " steps: " | sed "s/^/[$label] /")
    for workload in ${BRISK_AB_WORKLOADS:-}; do
        (cd "$tree" && PYTHONPATH=/tmp/brisk-site:$tree python3 -m brisk.entrypoints.cli.main bench throughput \
            --workload "$workload" --model llama-3.1-8b-shape --output-json "$OUT/$label/brisk_${workload,,}.json" \
            >/dev/null 2>&1) || echo "[$label] $workload failed"
    done
}
rounds=1
[ "${BRISK_AB_REPEAT:-0}" = 1 ] && rounds=2
for round in $(seq 1 "$rounds"); do
    run_build "$base_tree" "ab_${round}_base"
    run_build "$head_tree" "ab_${round}_head"
done
python3 - "$OUT" "$rounds" <<'PY'
import glob, json, os, sys
sys.path.insert(0, "benchmarks")
from step_timeline import summarize

out, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    base, head = f"{out}/ab_{r}_base", f"{out}/ab_{r}_head"
    print(f"round {r}: this checkout / base")
    for path in sorted(glob.glob(f"{head}/brisk_*.json")):
        name, other = os.path.basename(path), f"{base}/{os.path.basename(path)}"
        if not os.path.isfile(other):
            continue
        h, b = json.load(open(path)), json.load(open(other))
        if h.get("bench") == "throughput":
            hv, bv = h["results"]["brisk"]["output_tok_s"], b["results"]["brisk"]["output_tok_s"]
            print(f"  {name}: output tok/s {hv:,.0f} / {bv:,.0f} ({hv / bv:.3f}x)")
            continue
        hm, bm = h["results"]["server"], b["results"]["server"]
        pairs = [("output tok/s", hm["output_throughput"], bm["output_throughput"]),
                 ("TTFT p50", hm["ttft_ms"]["median"], bm["ttft_ms"]["median"]),
                 ("TTFT p99", hm["ttft_ms"]["p99"], bm["ttft_ms"]["p99"]),
                 ("TPOT p50", hm["tpot_ms"]["median"], bm["tpot_ms"]["median"]),
                 ("ITL p99", hm["itl_ms"]["p99"], bm["itl_ms"]["p99"])]
        print(f"  {name}: " + ", ".join(f"{k} {x:,.1f} / {y:,.1f} ({x / y:.3f}x)" for k, x, y in pairs if y))
        for label, folder in (("this", head), ("base", base)):
            steps_file = f"{folder}/brisk_steps_{name.removeprefix('brisk_').removesuffix('.json')}.jsonl"
            if os.path.isfile(steps_file):
                steps = [json.loads(line) for line in open(steps_file) if line.strip()]
                buckets = summarize(steps)["by_prefill_tokens"]
                print(f"    {label} steps: " + "; ".join(f"{b['prefill_tokens']} prompt tokens {b['steps']} x "
                                                   f"{b['mean_interval_ms']} ms" for b in buckets))
PY
