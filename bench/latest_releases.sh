#!/usr/bin/env bash
# Drift made visible before a user meets it: a fresh venv with the newest releases pip resolves today
# (torch 2.13.0 first, as .ci/run; everything else upgraded eagerly), what changed since the last green CI
# (bench/releases.py against bench/releases_tested.txt), then the README's test command, or the pytest
# arguments given:
#
#   bash bench/latest_releases.sh                          # the default suite (~15 minutes on 2 cores)
#   bash bench/latest_releases.sh tests/test_probe_ranks.py tests/test_study_faults.py
#
# After a green run, `python bench/releases.py --write` there records its releases as tested.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT  # the venv is several GB
python3 -m venv "$scratch/venv"
. "$scratch/venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
echo "torch==2.13.0" > "$scratch/torch.txt"  # held: an eager upgrade would swap it for a CUDA build
PIP_CONSTRAINT="$scratch/torch.txt" python -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev]'
python bench/releases.py
python -m pytest -q "$@"
