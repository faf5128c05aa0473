#!/usr/bin/env bash
# Wheels of what trainfit needs that the lent GPU machines' image lacks (its python3 is 3.12 with
# torch 2.11, transformers 5.17, peft, accelerate, pyarrow, pandas, scipy, pytest, triton; no optuna,
# trl, datasets, liger-kernel; see .library/device/KINDS.md). peft is carried too, pinned to the version of the CPU
# figures: the image's is not on record, and lora_target_parameters needs peft >= 0.17. Nothing
# can be fetched there, so download here, carry `.whl` (git-ignored, ~51 MB) and install there,
# before the GPU tests and benchmarks:
#
#   bash bench/gpu_wheels.sh                     # here, once; bench/gpu_session.sh then installs them
#   # and runs every GPU benchmark. For a command of your own instead,
#   # there, first in each device command (carry: [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD/src PATH=/tmp/site/bin:$PATH      # `trl` lands in /tmp/site/bin
#
# The versions are the ones the CPU figures in docs/benchmarks.md were taken with.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    -d .whl optuna==5.0.0 alembic==1.20.1 colorlog==6.12.0 sqlalchemy==2.1.9 mako==1.4.3 \
    trl==1.16.0 datasets==5.2.0 peft==0.21.2 dill==0.4.1 multiprocess==0.70.19 liger-kernel==0.8.5 \
    bitsandbytes==0.50.2  # QLoRA and 8-bit AdamW (43 MB; the carry holds 64 MiB in all)
ls -la .whl
