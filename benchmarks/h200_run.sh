#!/usr/bin/env bash
# Reproduces brisk's H200 table (docs/benchmarks.md): GPU correctness tests, then W1, W2, W3 and W7 on the
# Llama-3.1-8B shape with random weights. Run it on the H200 right after vLLM's anchor in the same call
# (shared/peers/README.md), so that $OUT/vllm_anchor.json is there and every figure gets its vLLM ratio:
#   bash .carry/vllm026/scripts/stage.sh 2 && bash .carry/vllm026/scripts/stage.sh install \
#     && bash .carry/vllm026/scripts/run.sh; BRISK_COMMIT=<sha> bash benchmarks/h200_run.sh
# Missing Python packages travel as wheels in .whl/ (gguf); they go to their own folder, apart from vLLM's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/brisk-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/brisk-site .whl/*.whl
fi
export PYTHONPATH=/tmp/brisk-site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PEER=()
[ -f "$OUT/vllm_anchor.json" ] && PEER=(--peer-json "$OUT/vllm_anchor.json")
bench() { python3 -m brisk.entrypoints.cli.main bench "$@" 2>&1 | grep -v -i -E "warn|tokenizer|sentencepiece|serializ"; }
MODEL=(--model llama-3.1-8b-shape)
if [ "${BRISK_SKIP_TESTS:-0}" != 1 ]; then
    python3 -m pytest -q -p no:cacheprovider tests/gpu -s 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|error|max" | tail -30
fi
for workload in ${BRISK_WORKLOADS:-W1 W2}; do
    bench throughput --workload "$workload" "${MODEL[@]}" "${PEER[@]}" --output-json "$OUT/brisk_${workload,,}.json" | tail -8
done
[ "${BRISK_SKIP_LATENCY:-0}" = 1 ] || bench latency "${MODEL[@]}" "${PEER[@]}" --output-json "$OUT/brisk_w3.json" | tail -6
[ "${BRISK_SKIP_STARTUP:-0}" = 1 ] || bench startup "${MODEL[@]}" --output-json "$OUT/brisk_w7.json" | tail -6
