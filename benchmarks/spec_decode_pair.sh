#!/usr/bin/env bash
# Speculative decoding with a real target and draft on one GPU (docs/benchmarks.md, "Speculative decoding"): the
# 32 code prompts of benchmarks/spec_decode_prompts.py at batch 1 unless a part says otherwise, 256 tokens each.
# For an offline GPU machine, from the checkout's root:
#   bash benchmarks/spec_decode_pair.sh TARGET DRAFT [PART ...]
# TARGET and DRAFT: anything LLM(model=...) accepts with one vocabulary (Qwen2.5-Coder-1.5B-Instruct and
# Qwen2.5-Coder-0.5B-Instruct, as GGUF files or folders). PARTs (default: all, in this order):
#   draft    greedy: the plain target, the draft at k = 2, 4, 6, the draft quantized to FP8 while loading at k = 4, 6
#   sampled  temperature 0.7: the plain target, the draft at k = 4 drafting greedily (in its dtype and in FP8) and
#            drawing its drafts (draft_sample_method "probabilistic")
#   ngram    n-gram lookup (no draft) on the 8 editing prompts, greedy, k = 4 and 6
#   batch    greedy at batch 8 and 32, the FP8 draft at k = 4 proposing at every batch size
# Each part writes $OUT/spec_<part>.json (spec_decode.py's report) and its printout to $OUT/spec_<part>.log.
# BRISK_SPEC_ARGS adds arguments to every spec_decode.py run; a CPU dry run of the flow:
#   BRISK_SPEC_ARGS="--num-prompts 2 --max-tokens 8 --engine {\"max_model_len\":4096}" bash benchmarks/spec_decode_pair.sh M M
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
TARGET=$1 DRAFT=$2
shift 2
draft() { # k, then more fields (JSON, with a leading comma)
    printf '{"method": "draft_model", "model": "%s", "num_speculative_tokens": %s%s}' "$DRAFT" "$1" "${2:-}"
}
FP8=', "quantization": "fp8"'
run() { # part, then spec_decode.py's arguments
    local part=$1
    shift
    # shellcheck disable=SC2086 # BRISK_SPEC_ARGS is split into arguments
    python3 benchmarks/spec_decode.py --model "$TARGET" --json "$OUT/spec_$part.json" "$@" ${BRISK_SPEC_ARGS:-} 2>&1 |
        grep -v -i -E "warn|sentencepiece" | tee "$OUT/spec_$part.log" | grep -E '^\{|Error|error' | cut -c1-400
}
for part in "${@:-draft sampled ngram batch}"; do
    for p in $part; do
        echo "== $p"
        case $p in
        draft) run draft --spec "$(draft 2)" --spec "$(draft 4)" --spec "$(draft 6)" \
            --spec "$(draft 4 "$FP8")" --spec "$(draft 6 "$FP8")" ;;
        sampled) run sampled --temperature 0.7 --spec "$(draft 4)" --spec "$(draft 4 "$FP8")" \
            --spec "$(draft 4 ', "draft_sample_method": "probabilistic"')" ;;
        ngram) run ngram --prompts rewrite --spec '{"method": "ngram", "num_speculative_tokens": 4}' \
            --spec '{"method": "ngram", "num_speculative_tokens": 6}' ;;
        batch) run batch --batch-size 8 32 --spec "$(draft 4 "$FP8, \"disable_by_batch_size\": null")" ;;
        *) echo "unknown part $p (draft, sampled, ngram, batch)" ;;
        esac
    done
done
