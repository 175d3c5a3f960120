#!/usr/bin/env bash
# The GPU checks and figures of the features beside the fast path (benchmarks/results/HISTORY.md: quantization,
# structured outputs, worker processes), on the Llama-3.1-8B shape with random weights. For an offline GPU machine:
# missing Python packages come as wheels in .whl/ (as for h200_run.sh); $OUT is the folder results go to.
#   bash benchmarks/h200_features.sh STAGE...   stages, run in the order given:
#     tests    tests/gpu (every GPU test, the features' included; BRISK_TESTS narrows it: pytest paths/flags)
#     tune     the INT4 and FP8 GEMV tiles on the 8B projections, at 1 row and at 4 and 16 (tune_int_gemv.py,
#              tune_gemv_rows.py --fp8-rows), PyTorch's tinygemm beside brisk's INT4 kernels (tune_int_gemv.py
#              --tinygemm), and the decode kernel over an FP8 cache (tune_decode_attention.py)
#     w3quant  W3 (batch 1) in bf16, FP8 weights, FP8 weights and FP8 KV cache, and W4A16 weights (also at batch 8)
#     w1quant  W1 in bf16, FP8 weights, FP8 KV cache, and both
#     w4quant  W4 (32k context) with FP8 weights, an FP8 KV cache, and both
#     profile4 the kernels of 8 x 32,000-token prompts (prefill and 32 decode steps) with FP8 weights and FP8 KV
#     workers  W1 and W3 with the model in a worker process (--distributed-executor-backend mp) beside in-process
#     json     W2-shaped batch of 256 with and without a JSON schema (needs a SmolLM2 tokenizer folder in
#              BRISK_TOKENIZER, default .scratch/smollm2-tokenizer)
#     stepmsg  the per-step cost of the step message to worker processes at batch 256, on this host's CPU
#     spec     n-gram speculative decoding on a real model (BRISK_SPEC_MODEL: a GGUF or HF folder, default
#              /tmp/brisk-models/smollm2.gguf): the editing prompts at batch 1 with k = 2, 4, 6, then every prompt
#              at batch 1, 8, 32 and 128 with k = 4, each beside the same engine without speculation
#     pair     the real target and draft pair (BRISK_SPEC_TARGET, BRISK_SPEC_DRAFT: Qwen2.5-Coder-1.5B-Instruct and
#              0.5B-Instruct, GGUF or HF folders) at batch 1: the draft model on 16 code-writing prompts with
#              k = 2, 4, 6, greedy and at temperature 0.7; n-gram (k = 2, 4, 6) and the draft (k = 4) on the
#              editing prompts, greedy
#     stepcost the cost of a speculative step at the pair's shapes with random weights (spec_step_cost.py)
#     pairbatch  the same pair, every prompt at batch 8, 32 and 128, n-gram and the draft with k = 4, greedy
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
brisk() { python3 -m brisk.entrypoints.cli.main "$@" 2>&1 | grep -v -i -E "warn|tokenizer|sentencepiece|serializ"; }
stage_tests() {
    # shellcheck disable=SC2086  # BRISK_TESTS is a list of pytest arguments
    timeout 420 python3 -m pytest -q -p no:cacheprovider ${BRISK_TESTS:-tests/gpu} -rs 2>&1 |
        tee "$OUT/gpu_tests.log" | tail -25
}
stage_tune() {
    python3 benchmarks/tune_int_gemv.py --rows 4,16 2>&1 | tee "$OUT/tune_int_gemv.log" | tail -40
    python3 benchmarks/tune_int_gemv.py --tinygemm 1,4,16,2048 2>&1 | tee "$OUT/tinygemm.log" | tail -24
    python3 benchmarks/tune_gemv_rows.py --rows "" --sweep-rows "" --fp8-rows 8,16 2>&1 |
        tee "$OUT/tune_gemv_rows_fp8.log" | tail -8
    python3 benchmarks/tune_decode_attention.py --shapes 8x32000,1x32000,256x820 --max-model-len 33000 \
        --kv-cache-dtype fp8 --grid small --top 6 2>&1 | tee "$OUT/tune_decode_fp8.log" | tail -30
}
stage_w3quant() {
    brisk bench latency --model llama-3.1-8b-shape --output-json "$OUT/w3_bf16.json" | tail -3
    brisk bench latency --model llama-3.1-8b-shape --quantization fp8 --output-json "$OUT/w3_fp8.json" | tail -3
    brisk bench latency --model llama-3.1-8b-shape --quantization fp8 --kv-cache-dtype fp8 \
        --output-json "$OUT/w3_fp8_fp8kv.json" | tail -3
    brisk bench latency --model llama-3.1-8b-shape-w4a16 --output-json "$OUT/w3_w4a16.json" | tail -3
    brisk bench latency --model llama-3.1-8b-shape-w4a16 --batch-size 8 --output-json "$OUT/w3_w4a16_b8.json" | tail -3
}
stage_w1quant() {
    brisk bench throughput --workload W1 --model llama-3.1-8b-shape --output-json "$OUT/w1_bf16.json" | tail -3
    local name flags
    for name in fp8:--quantization=fp8 fp8kv:--kv-cache-dtype=fp8 fp8_fp8kv:--quantization=fp8,--kv-cache-dtype=fp8; do
        flags=${name#*:}
        # shellcheck disable=SC2086  # the flags, comma-separated
        brisk bench throughput --workload W1 --model llama-3.1-8b-shape ${flags//,/ } \
            --output-json "$OUT/w1_${name%%:*}.json" | tail -3
    done
}
stage_w4quant() {
    local name flags
    for name in fp8:--quantization=fp8 fp8kv:--kv-cache-dtype=fp8 fp8_fp8kv:--quantization=fp8,--kv-cache-dtype=fp8; do
        flags=${name#*:}
        # shellcheck disable=SC2086  # the flags, comma-separated
        brisk bench long-context --model llama-3.1-8b-shape ${flags//,/ } --output-json "$OUT/w4_${name%%:*}.json" |
            tail -4
    done
}
stage_profile4() {
    python3 benchmarks/profile_workload.py --workload W2 --num-prompts 8 --input-len 32000 --output-len 32 \
        --max-model-len 32256 --quantization fp8 --kv-cache-dtype fp8 --kernels 25 2>&1 |
        grep -v -i -E "warn|tokenizer" | tee "$OUT/profile_w4_fp8.log" | tail -40
}
stage_workers() {
    local mode
    for mode in uni mp; do
        brisk bench latency --model llama-3.1-8b-shape --distributed-executor-backend $mode \
            --output-json "$OUT/w3_$mode.json" | tail -3
        brisk bench throughput --workload W1 --model llama-3.1-8b-shape --distributed-executor-backend $mode \
            --output-json "$OUT/w1_$mode.json" | tail -3
    done
}
stage_json() {
    local model=/tmp/brisk-json-model
    rm -rf "$model"
    brisk bench write-config llama-3.1-8b-shape-smollm2-vocab "$model" \
        --tokenizer "${BRISK_TOKENIZER:-.scratch/smollm2-tokenizer}" >/dev/null
    python3 benchmarks/structured_outputs_throughput.py --model "$model" --json "$OUT/structured_outputs.json" \
        --engine '{"load_format": "dummy", "max_model_len": 4096, "dtype": "bfloat16"}' 2>&1 | tail -3
}
stage_stepmsg() {
    python3 benchmarks/step_message_overhead.py --steps 600 --json "$OUT/step_message.json" 2>&1 | tail -8
}
stage_spec() {
    local model=${BRISK_SPEC_MODEL:-/tmp/brisk-models/smollm2.gguf} k bs specs=()
    for k in 2 4 6; do specs+=(--spec "{\"method\": \"ngram\", \"num_speculative_tokens\": $k}"); done
    python3 benchmarks/spec_decode.py --model "$model" --prompts rewrite "${specs[@]}" \
        --json "$OUT/spec_ngram_rewrite_bs1.json" 2>&1 | grep -E '"(decode_tok_s|speedup|mean_acceptance_length|same_tokens_as_plain)"'
    for bs in 1 8 32 128; do
        python3 benchmarks/spec_decode.py --model "$model" --batch-size "$bs" \
            --spec '{"method": "ngram", "num_speculative_tokens": 4}' \
            --spec '{"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": null}' \
            --json "$OUT/spec_ngram_all_bs$bs.json" 2>&1 |
            grep -E '"(output_tok_s|output_speedup|mean_acceptance_length|same_tokens_as_plain)"'
    done
}
PAIR_TARGET=${BRISK_SPEC_TARGET:-/tmp/brisk-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
PAIR_DRAFT=${BRISK_SPEC_DRAFT:-/tmp/brisk-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
# draft_spec K [DISABLE]: the pair's draft config; DISABLE sets disable_by_batch_size (null: at every batch size)
draft_spec() {
    local extra=""
    [ -n "${2:-}" ] && extra=", \"disable_by_batch_size\": $2"
    echo "{\"method\": \"draft_model\", \"model\": \"$PAIR_DRAFT\", \"num_speculative_tokens\": $1$extra}"
}
stage_pair() {
    local k specs=() ngram=()
    for k in 2 4 6; do
        specs+=(--spec "$(draft_spec $k)")
        ngram+=(--spec "{\"method\": \"ngram\", \"num_speculative_tokens\": $k}")
    done
    python3 benchmarks/spec_decode.py --model "$PAIR_TARGET" --prompts write --num-prompts 16 --max-tokens 128 \
        --temperature 0 0.7 --engine '{"max_num_seqs": 8}' "${specs[@]}" --json "$OUT/spec_pair_write.json" 2>&1 |
        grep -E '^\{"spec"'
    python3 benchmarks/spec_decode.py --model "$PAIR_TARGET" --prompts rewrite --max-tokens 256 \
        --engine '{"max_num_seqs": 8}' "${ngram[@]}" --spec "$(draft_spec 4)" --json "$OUT/spec_pair_rewrite.json" \
        2>&1 | grep -E '^\{"spec"'
}
stage_stepcost() {
    python3 benchmarks/spec_step_cost.py --json "$OUT/spec_step_cost.json" 2>&1 | grep -E '^\{|Error'
}
stage_pairbatch() {
    python3 benchmarks/spec_decode.py --model "$PAIR_TARGET" --batch-size 8 32 128 --max-tokens 128 \
        --engine '{"max_num_seqs": 128}' --spec '{"method": "ngram", "num_speculative_tokens": 4}' \
        --spec '{"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": null}' \
        --spec "$(draft_spec 4)" --spec "$(draft_spec 4 null)" --json "$OUT/spec_pair_batch.json" 2>&1 |
        grep -E '^\{"spec"'
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
for stage in "$@"; do
    echo "== $stage ($(date -u +%H:%M:%S))"
    "stage_$stage"
done
echo "== done ($(date -u +%H:%M:%S))"
