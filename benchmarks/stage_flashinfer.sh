#!/usr/bin/env bash
# Carries FlashInfer (the optional attention backend) to an offline GPU machine that only takes files in
# transfers of at most 64 MiB. Its wheel (101 MB) travels in two parts, .offline/flashinfer/c1 and c2 (ignored by git):
#   on a machine with PyPI:                         bash benchmarks/stage_flashinfer.sh download
#   on the GPU machine, with c1 copied over:        bash benchmarks/stage_flashinfer.sh receive
#   then, with c2 copied over:                      bash benchmarks/stage_flashinfer.sh install && <tests, benches>
# `install` unpacks into /tmp/fi-site, which benchmarks/h200_run.sh puts on PYTHONPATH. The image already has
# FlashInfer's other imports (nvidia-ml-py, einops, ninja, click); apache-tvm-ffi travels with it.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${FLASHINFER_VERSION:-0.7.4}
STAGED=.offline/flashinfer
PARTS=/tmp/fi-parts
case "${1:-}" in
download)
    rm -rf "$STAGED" && mkdir -p "$STAGED/c1" "$STAGED/c2" "$STAGED/dl"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        -d "$STAGED/dl" "flashinfer-python==$VERSION" "apache-tvm-ffi<0.2,>=0.1.11"
    (cd "$STAGED/dl" && tar cf - ./*.whl | split -b 50M - ../part.)
    mv "$STAGED"/part.aa "$STAGED/c1/" && mv "$STAGED"/part.a[b-z] "$STAGED/c2/" && rm -rf "$STAGED/dl"
    du -sh "$STAGED"/c1 "$STAGED"/c2
    ;;
receive)
    mkdir -p "$PARTS" && cp "$STAGED"/c1/part.* "$PARTS/"
    ;;
install)
    cp "$STAGED"/c2/part.* "$PARTS/"
    rm -rf /tmp/fi-wheels && mkdir -p /tmp/fi-wheels && cat "$PARTS"/part.* | tar xf - -C /tmp/fi-wheels
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fi-site \
        /tmp/fi-wheels/*.whl
    PYTHONPATH=/tmp/fi-site python3 -c "import flashinfer; print('FlashInfer', flashinfer.__version__, 'installed')"
    ;;
*)
    echo "usage: $0 download|receive|install" >&2
    exit 2
    ;;
esac
