# Sourced by the GPU scripts (run from the checkout's root): $OUT for results, wheels from .whl/ (packages an
# offline GPU machine lacks) into their own folder on PYTHONPATH, and NVLink multicast off for NCCL.
OUT=${OUT:-/tmp/brisk-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/brisk-site .whl/*.whl
fi
export PYTHONPATH=/tmp/brisk-site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
