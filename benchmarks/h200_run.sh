#!/usr/bin/env bash
# Reproduces brisk's H200 table (docs/benchmarks.md): GPU correctness tests, then W1, W2, W3, W4 and W7 on the
# Llama-3.1-8B shape with random weights, then W5 online through `brisk serve` (the 8B shape with the SmolLM2
# vocabulary and tokenizer). For an offline GPU machine: run vLLM's figures first in the same session, so that
# $OUT/vllm_anchor.json (the --peer-json format of docs/benchmarks.md) is there and every figure gets its vLLM
# ratio; $OUT is the folder results go to. Then: BRISK_COMMIT=<sha> bash benchmarks/h200_run.sh
# Missing Python packages can come as wheels in .whl/ (gguf, fastapi and its deps); they go to their own folder.
# Knobs (environment): BRISK_SKIP_TESTS=1, BRISK_WORKLOADS="W1 W2" (empty: none), BRISK_SKIP_LATENCY=1,
# BRISK_SKIP_LONG_CONTEXT=1 (W4), BRISK_SKIP_STARTUP=1, BRISK_QUANTIZED=1 (FP8 and W4A16 figures), BRISK_SKIP_SERVE=1, and for the serve stage: BRISK_SERVE_POINTS ("C:N ...", max concurrency
# C with N prompts, or "C:N:PREFIX:INPUT" for W6's shared prefix; default the W5 points "1:16 16:160 64:384 256:768"
# and W6 "64:256:2000:100"; ratios to vLLM where serve_anchor.sh left its files in $OUT; each point's step timeline
# in $OUT/brisk_steps_<point>.jsonl, for benchmarks/step_timeline.py), BRISK_SERVE_INPUT_LEN (1024),
# BRISK_SERVE_OUTPUT_LEN (128), BRISK_SERVE_TOKENIZER (a folder with SmolLM2's tokenizer; default .scratch/smollm2-tokenizer),
# BRISK_SERVE_SHAPE (llama-3.1-8b-shape-smollm2-vocab), BRISK_SERVE_VOCAB_SIZE (none: the shape's),
# BRISK_SERVE_ARGS (server flags; default "--dtype bfloat16 --gpu-memory-utilization 0.9"), BRISK_SERVE_PORT (8011),
# BRISK_SERVE_READY_TIMEOUT (600 s), BRISK_SERVE_VLLM_SITE (a folder holding vLLM: each point then runs vLLM's own
# `bench serve` client, as serve_anchor.sh runs it against vLLM, into $OUT/brisk_vllm_client_<point>.json). A CPU dry run of the serve stage alone:
#   BRISK_SKIP_TESTS=1 BRISK_WORKLOADS= BRISK_SKIP_LATENCY=1 BRISK_SKIP_LONG_CONTEXT=1 BRISK_SKIP_STARTUP=1 \
#   BRISK_SERVE_SHAPE=llama-tiny-shape BRISK_SERVE_VOCAB_SIZE=49152 BRISK_SERVE_ARGS="--device cpu --kv-cache-memory-bytes 64MiB" \
#   BRISK_SERVE_POINTS="1:2 2:4" BRISK_SERVE_INPUT_LEN=32 BRISK_SERVE_OUTPUT_LEN=8 bash benchmarks/h200_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
# FlashInfer, where it was installed into /tmp/fi-site (pip --target), joins the path so that its GPU tests run.
[ -d /tmp/fi-site/flashinfer ] && PYTHONPATH=/tmp/fi-site:$PYTHONPATH
PEER=()
[ -f "$OUT/vllm_anchor.json" ] && PEER=(--peer-json "$OUT/vllm_anchor.json")
bench() { python3 -m brisk.entrypoints.cli.main bench "$@" 2>&1 | grep -v -i -E "warn|tokenizer|sentencepiece|serializ"; }
MODEL=(--model llama-3.1-8b-shape)
if [ "${BRISK_SKIP_TESTS:-0}" != 1 ]; then
    python3 -m pytest -q -p no:cacheprovider tests/gpu tests/worker/test_triton_sampling.py tests/worker/test_seeded_sampling.py tests/worker/test_input_buffers.py -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|error|max" | tail -30
fi
for workload in ${BRISK_WORKLOADS-W1 W2}; do
    bench throughput --workload "$workload" "${MODEL[@]}" "${PEER[@]}" --output-json "$OUT/brisk_${workload,,}.json" | tail -8
done
[ "${BRISK_SKIP_LATENCY:-0}" = 1 ] || bench latency "${MODEL[@]}" "${PEER[@]}" --output-json "$OUT/brisk_w3.json" | tail -6
# W4 beside vLLM's W4 when its anchor ran with VLLM_ANCHOR_ONLY=W4 VLLM_ANCHOR_MAXLEN=33000
# ANCHOR_OUT_JSON=$OUT/vllm_anchor_w4.json.
PEER_W4=()
[ -f "$OUT/vllm_anchor_w4.json" ] && PEER_W4=(--peer-json "$OUT/vllm_anchor_w4.json")
[ "${BRISK_SKIP_LONG_CONTEXT:-0}" = 1 ] ||
    bench long-context "${MODEL[@]}" "${PEER_W4[@]}" --output-json "$OUT/brisk_w4.json" | tail -9
[ "${BRISK_SKIP_STARTUP:-0}" = 1 ] || bench startup "${MODEL[@]}" --output-json "$OUT/brisk_w7.json" | tail -6
# W7 with a tokenizer (the serve stage's, SmolLM2's): the first start saves the tokenizer snapshot, the others load it.
W7_TOKENIZER=${BRISK_SERVE_TOKENIZER:-.scratch/smollm2-tokenizer}
if [ "${BRISK_SKIP_STARTUP:-0}" != 1 ] && [ -f "$W7_TOKENIZER/tokenizer.json" ] &&
    python3 -m brisk.entrypoints.cli.main bench write-config llama-3.1-8b-shape-smollm2-vocab /tmp/brisk-w7-tokenizer \
        --tokenizer "$W7_TOKENIZER" >/dev/null; then
    BRISK_CACHE_DIR=$(mktemp -d) bench startup --model /tmp/brisk-w7-tokenizer --load-format dummy --max-model-len 4096 \
        --repeats 3 --output-json "$OUT/brisk_w7_tokenizer.json" | tail -8
fi
# Quantized (BRISK_QUANTIZED=1): W3 with FP8 weights and with W4A16 (the random INT4 layout), each as a ratio to W3
# in bf16 above; W1 with FP8 weights; W4 with FP8 weights and the FP8 KV cache. Beside vLLM's figures of the same
# setting where its anchor ran with VLLM_ANCHOR_QUANT=fp8 (VLLM_ANCHOR_KV=fp8 for W4) into $OUT/vllm_anchor_fp8.json.
if [ "${BRISK_QUANTIZED:-0}" = 1 ]; then
    PEER_FP8=()
    [ -f "$OUT/vllm_anchor_fp8.json" ] && PEER_FP8=(--peer-json "$OUT/vllm_anchor_fp8.json")
    bench latency "${MODEL[@]}" --quantization fp8 "${PEER_FP8[@]}" --output-json "$OUT/brisk_w3_fp8.json" | tail -6
    bench latency --model llama-3.1-8b-shape-w4a16 --output-json "$OUT/brisk_w3_w4a16.json" | tail -6
    python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

def tok_s(name):
    path = Path(sys.argv[1]) / name
    return json.loads(path.read_text())["results"]["brisk"]["decode_tok_s_median"] if path.is_file() else None

bf16 = tok_s("brisk_w3.json")
for label, name in (("FP8 weights", "brisk_w3_fp8.json"), ("W4A16", "brisk_w3_w4a16.json")):
    if bf16 and tok_s(name):
        print(f"W3 {label}: {tok_s(name):.1f} tok/s, {tok_s(name) / bf16:.2f}x bf16's {bf16:.1f}")
PY
    bench throughput --workload W1 "${MODEL[@]}" --quantization fp8 "${PEER_FP8[@]}" \
        --output-json "$OUT/brisk_w1_fp8.json" | tail -8
    bench long-context "${MODEL[@]}" --quantization fp8 --kv-cache-dtype fp8 "${PEER_FP8[@]}" \
        --output-json "$OUT/brisk_w4_fp8.json" | tail -9
fi

# W5 and W6 online: brisk serve in the background (log: $OUT/brisk_serve.log), one brisk bench serve per point (JSON:
# $OUT/brisk_w5_c{C}.json or brisk_w6.json, client output beside it), then SIGTERM and wait. A server that does not come
# up costs at most BRISK_SERVE_READY_TIMEOUT: the client stops at once when the server process exits.
# vLLM's own bench serve client against brisk's server, with serve_anchor.sh's flags (port model n c prefix input name).
vllm_client() {
    local input_len=${BRISK_SERVE_INPUT_LEN:-1024}
    [ -n "$5" ] && input_len=$6
    PYTHONPATH=$BRISK_SERVE_VLLM_SITE VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1 \
        python3 -m vllm.entrypoints.cli.main bench serve --backend vllm --base-url "http://127.0.0.1:$1" \
        --model llama8b --tokenizer "$2" --dataset-name random --ignore-eos --num-prompts "$3" --max-concurrency "$4" \
        ${5:+--random-prefix-len "$5"} --random-input-len "$input_len" --random-output-len "${BRISK_SERVE_OUTPUT_LEN:-128}" \
        --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 --seed 0 \
        --save-result --result-dir "$OUT" --result-filename "$7.json"
}
serve_stage() {
    local port=${BRISK_SERVE_PORT:-8011} model=/tmp/brisk-serve-model tok=${BRISK_SERVE_TOKENIZER:-.scratch/smollm2-tokenizer}
    if [ ! -f "$tok/tokenizer.json" ]; then
        echo "serve stage skipped: no SmolLM2 tokenizer in $tok (set BRISK_SERVE_TOKENIZER to a folder with its tokenizer.json)"
        return 0
    fi
    local vocab=()
    [ -n "${BRISK_SERVE_VOCAB_SIZE:-}" ] && vocab=(--vocab-size "$BRISK_SERVE_VOCAB_SIZE")
    rm -rf "$model"
    python3 -m brisk.entrypoints.cli.main bench write-config "${BRISK_SERVE_SHAPE:-llama-3.1-8b-shape-smollm2-vocab}" \
        "$model" --tokenizer "$tok" "${vocab[@]}" >/dev/null || { echo "serve stage skipped: write-config failed"; return 0; }
    local t0=$SECONDS server_args=${BRISK_SERVE_ARGS---dtype bfloat16 --gpu-memory-utilization 0.9}
    # A step timeline per point (BRISK_STEP_TIMELINE; the engine appends, so emptying the file starts the next).
    local timeline="$OUT/brisk_steps.jsonl"
    : >"$timeline"
    # shellcheck disable=SC2086  # server_args is a list of flags
    BRISK_STEP_TIMELINE=$timeline python3 -m brisk.entrypoints.cli.main serve "$model" --load-format dummy \
        --max-model-len 4096 --seed 0 \
        --host 127.0.0.1 --port "$port" --served-model-name llama8b --disable-uvicorn-access-log \
        $server_args >"$OUT/brisk_serve.log" 2>&1 &
    local pid=$!
    local client=(python3 -m brisk.entrypoints.cli.main bench serve --base-url "http://127.0.0.1:$port" --model llama8b
        --tokenizer "$model" --seed 0 --random-input-len "${BRISK_SERVE_INPUT_LEN:-1024}"
        --random-output-len "${BRISK_SERVE_OUTPUT_LEN:-128}")
    # Wait for /health, then one untimed request (a warm-up). The client stops as soon as the server process exits;
    # no --refused-timeout: brisk serve refuses connections until its model is loaded.
    if "${client[@]}" --ready-timeout "${BRISK_SERVE_READY_TIMEOUT:-600}" --server-pid "$pid" --refused-timeout 0 \
        --num-prompts 1 --skip-initial-test >"$OUT/brisk_w5_warmup.log" 2>&1; then
        echo "brisk serve ready (and one request answered) after $((SECONDS - t0)) s;" \
            "$(grep -a -i -o -m1 'engine ready in .*' "$OUT/brisk_serve.log")"
        local point c n prefix input name peer label result
        for point in ${BRISK_SERVE_POINTS:-1:16 16:160 64:384 256:768 64:256:2000:100}; do
            IFS=: read -r c n prefix input <<<"$point"
            if [ -n "$prefix" ]; then name=w6 peer=w6_prefix label=W6; else name=w5_c$c peer=w5_c$c label=W5-c$c; fi
            if ! kill -0 "$pid" 2>/dev/null; then
                echo "brisk serve exited before $label; its log ends:"; tail -30 "$OUT/brisk_serve.log"; break
            fi
            rm -f "$OUT/brisk_$name.json"
            : >"$timeline"
            if [ -n "${BRISK_SERVE_VLLM_SITE:-}" ]; then
                vllm_client "$port" "$model" "$n" "$c" "$prefix" "$input" "brisk_vllm_client_$peer" >"$OUT/brisk_$name.log" 2>&1
            else
                "${client[@]}" --num-prompts "$n" --max-concurrency "$c" --label "$label" \
                    ${prefix:+--random-prefix-len "$prefix" --random-input-len "$input"} \
                    --output-json "$OUT/brisk_$name.json" >"$OUT/brisk_$name.log" 2>&1
            fi
            cp "$timeline" "$OUT/brisk_steps_$name.jsonl"
            python3 benchmarks/step_timeline.py "$OUT/brisk_steps_$name.jsonl" 2>&1 | head -1 | sed "s/^/  $label steps: /"
            result=$OUT/brisk_$name.json
            [ -n "${BRISK_SERVE_VLLM_SITE:-}" ] && result=$OUT/brisk_vllm_client_$peer.json
            if [ -f "$result" ]; then
                python3 - "$result" "$OUT/$peer.json" "$label" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
if "results" in d:  # brisk bench serve's file
    m, c = d["results"]["server"], d["config"]
    got = {"completed": m["completed"], "num_prompts": c["num_prompts"], "output_throughput": m["output_throughput"],
           "request_throughput": m["request_throughput"], "median_ttft_ms": m["ttft_ms"]["median"],
           "p99_ttft_ms": m["ttft_ms"]["p99"], "median_tpot_ms": m["tpot_ms"]["median"],
           "p99_tpot_ms": m["tpot_ms"]["p99"], "p99_itl_ms": m["itl_ms"]["p99"]}
    errors = m["errors"]
else:  # vLLM bench serve's file
    got, errors = d, [e for e in d.get("errors", []) if e][:2]
line = (f"{sys.argv[3]}: {got['completed']}/{got['num_prompts']} ok, TTFT p50/p99 {got['median_ttft_ms']:.1f}/"
        f"{got['p99_ttft_ms']:.1f} ms, TPOT p50/p99 {got['median_tpot_ms']:.2f}/{got['p99_tpot_ms']:.2f} ms, ITL p99 "
        f"{got['p99_itl_ms']:.1f} ms, {got['output_throughput']:,.0f} output tok/s, {got['request_throughput']:.2f} req/s")
peer = sys.argv[2]  # vLLM's bench serve file for the same point, where serve_anchor.sh ran in this $OUT
if os.path.isfile(peer):
    with open(peer) as f:
        v = json.load(f)
    pairs = [(k, got[key], v.get(key)) for k, key in [("output tok/s", "output_throughput"),
             ("TTFT p50", "median_ttft_ms"), ("TTFT p99", "p99_ttft_ms"), ("ITL p99", "p99_itl_ms")]]
    line += "; / vLLM: " + ", ".join(f"{k} {b / p:.2f}x" for k, b, p in pairs if p)
print(line + (f"; errors: {errors}" if errors else ""))
PY
            else
                echo "$label: no result; the client's output ends:"; tail -5 "$OUT/brisk_$name.log"
            fi
        done
    else
        echo "brisk serve did not come up ($((SECONDS - t0)) s): $(grep -a 'error' "$OUT/brisk_w5_warmup.log" | tail -1)"
        echo "its log ($OUT/brisk_serve.log) ends:"; tail -30 "$OUT/brisk_serve.log"
    fi
    kill -TERM "$pid" 2>/dev/null
    local i
    for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid"
    echo "brisk serve stopped (exit status $?)"
}
[ "${BRISK_SKIP_SERVE:-0}" = 1 ] || serve_stage
