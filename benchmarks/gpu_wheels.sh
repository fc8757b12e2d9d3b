#!/usr/bin/env bash
# Fetch, here, the wheels benchmarks/gpu_check.sh installs offline on the GPU machine (Python
# 3.12, x86-64 manylinux) where they are missing: the project's dependencies that the device
# tool's image may lack. llvmlite is left out on purpose: its wheel (57 MiB) does not fit the
# tool's 64 MiB limit beside the tree, and that image has it (through numba).
# benchmarks/wheels/ is ignored by git; name it in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
mkdir -p wheels
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d wheels \
    scipy-openblas32 safetensors networkx threadpoolctl tqdm pytest-timeout
ls -la wheels
