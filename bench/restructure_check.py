"""Does a restructuring of ``tune`` change what it writes? Run it before and after.

    python bench/restructure_check.py record /tmp/before     # on the old code
    python bench/restructure_check.py check /tmp/before      # on the new code: exit 1 on any difference

For every built-in knob with a finite set of values, the bundled tiny Llama spec searches
``batch_size`` with that knob over all its values, measured by a deterministic synthetic probe
(speed and memory a hash of the config: no model runs, so only the search and its outputs are
compared); and the spec without its ``search:`` section, searched by default. The fingerprint is each run's ``summary.json`` (every config's entry, with its ``trl sft``
command; times and paths left out), ``trials.csv`` and ``train_command.sh``, or the error of a
combination that is refused. ``record`` also leaves studies stopped after 3 trials; ``check``
resumes them with the new code to the end, and their outputs must equal a fresh run's.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

import trainfit
import trainfit.tune
from trainfit.errors import TrainfitError
from trainfit.params import KNOBS, Params
from trainfit.probe.measurement import Measurement
from trainfit.spec import load_spec, with_tune

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "tiny-llama.yaml"
GiB = 1024**3
VOLATILE = {"elapsed_s", "created_at", "finished_at", "started_at", "versions", "host", "trainfit_version",
            "search_seconds", "tuning_time_s", "probe_time_s"}
DEFAULT = "(no search: section)"
"""The default search's entry (no knob of its own)."""
RESUMED = ("gradient_checkpointing", "packing", "attention")
"""The knobs whose study ``record`` stops after 3 trials, for ``check`` to resume."""


def probe(params: Params, number: int) -> Measurement:
    """Speed and memory from a hash of the config: the same config measures the same everywhere."""
    config = params.to_dict()
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).digest()
    memory = 0.5 + params.batch_size * (0.2 + digest[0] / 255)
    common = {"config": config, "budget_memory_gb": 4.0, "budget_headroom_gb": 0.5, "device": "cpu",
              "device_name": "synthetic", "wall_time_s": 1.0}
    if memory > 4.0:
        return Measurement(status="oom", message="synthetic OOM", peak_memory_bytes=4 * GiB, **common)
    speed = params.batch_size * (1 + digest[1] / 255) / (1 + 0.05 * params.batch_size)
    return Measurement(status="ok", samples_per_second=speed, tokens_per_second=speed * 100,
                       peak_memory_bytes=int(memory * GiB), steps_measured=5, stable=True, **common)


def knob_values() -> dict[str, list[Any]]:
    """Every built-in knob with a finite set of values (batch_size aside: it is searched with each)."""
    out: dict[str, list[Any]] = {}
    for k in KNOBS.values():
        values: list[Any] = list(k.choices) if k.choices else [False, True] if k.kind == "bool" else []
        if k.nullable and values:
            values.append(None)
        if values and k.name != "batch_size":
            out[k.name] = values
    return out


def normal(value: Any, folder: Path) -> Any:
    """``value`` without the run's folder and the fields that change from run to run."""
    if isinstance(value, dict):
        return {k: normal(v, folder) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normal(v, folder) for v in value]
    if isinstance(value, str):
        return re.sub(r"\d+(\.\d+)? ?s\b", "T s", value.replace(str(folder.resolve()), "<OUT>"))
    return value


def spec_file(knob: str, values: list[Any], folder: Path) -> Path:
    """The tiny Llama spec searching batch_size and ``knob``, its data paths absolute."""
    raw = yaml.safe_load(SPEC.read_text())
    raw["tokenizer"] = str(SPEC.parent / raw["tokenizer"])
    raw["data"]["path"] = str(SPEC.parent / raw["data"]["path"])
    if knob == DEFAULT:
        del raw["search"]
    else:
        raw["search"] = {"batch_size": [1, 2, 4], knob: values}
    raw["tune"] = {"target_effective_batch": 8}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.parent / f"{folder.name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run(knob: str, values: list[Any], folder: Path, max_trials: int, resume: bool = False) -> dict[str, Any]:
    try:
        spec = with_tune(load_spec(spec_file(knob, values, folder)), strategy="grid", max_trials=max_trials)
        trainfit.tune.tune(spec, trainfit.TuneOptions(output=folder, probe_fn=probe, resume=resume))
    except TrainfitError as err:
        return {"error": normal(err.message, folder)}
    command = folder / "train_command.sh"
    return {"summary": normal(json.loads((folder / "summary.json").read_text()), folder),
            "trials.csv": (folder / "trials.csv").read_text(),
            "train_command.sh": normal(command.read_text(), folder) if command.is_file() else None}


def fingerprint(root: Path) -> dict[str, Any]:
    return {knob: run(knob, values, root / "fresh" / knob, 64)
            for knob, values in {**knob_values(), DEFAULT: []}.items()}


def main(argv: list[str]) -> int:
    mode, root = argv[0], Path(argv[1])
    if mode == "record":
        prints = fingerprint(root)
        (root / "fingerprint.json").write_text(json.dumps(prints, indent=1, sort_keys=True, default=str))
        for knob in RESUMED:
            run(knob, knob_values()[knob], root / "stopped" / knob, 3)
        print(f"{len(prints)} knobs recorded in {root / 'fingerprint.json'}; "
              f"{sum('error' in v for v in prints.values())} refused")
        return 0
    before = json.loads((root / "fingerprint.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="restructure-check-"))  # the recorded studies stay as they were: rerunnable
    after = json.loads(json.dumps(fingerprint(work), sort_keys=True, default=str))
    differ = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    shutil.copytree(root / "stopped", work / "stopped")
    for knob in RESUMED:
        resumed = run(knob, knob_values()[knob], work / "stopped" / knob, 64, resume=True)
        if json.loads(json.dumps(resumed, default=str)) != after[knob]:
            differ.append(f"{knob} (resumed from the old code's study)")
    print(f"{len(after)} knobs compared, {len(RESUMED)} old studies resumed; "
          + (f"DIFFER: {', '.join(differ)}" if differ else "identical"))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
