"""What a calibration needs before it runs (see :mod:`trainfit.trainer.calibration`): a command it
can stop after a few steps, on this machine, in one process where ``trainfit train`` times it, and
the ``trl`` command beside this Python. Checked before a search spends its time, and again on the
pick's config before its first run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.spec import Spec
from trainfit.template import placeholders
from trainfit.trainer.command import trl_data_config
from trainfit.trainer.written_command import FALLBACK_HINT, NO_MAX_STEPS_HINT


def check_can_calibrate(spec: Spec) -> None:
    """Refuse, before a search spends its time, a spec whose training command a calibration cannot
    run (``tune --calibrate``): a ``tune.command_template`` without ``{max_steps}``, a custom model
    trained by ``trainfit train``'s own loop, no ``trl`` command, a run over several machines or (the
    ``trl sft`` command) several processes, where the spec fixes them (:func:`one_process`)."""
    searched = spec.search.names if spec.search is not None else ()
    one_process({k: v for k, v in spec.params.to_dict().items() if k not in searched},  # else: the pick's, later
                 template=bool(spec.tune.command_template))
    if spec.tune.command_template:
        if "max_steps" not in placeholders(spec.tune.command_template):
            raise TrainfitError("--calibrate runs your tune.command_template for a few steps, and it has no {max_steps} "
                                "placeholder to stop it with",
                                f"{NO_MAX_STEPS_HINT}, or drop --calibrate: the ranking then rests on the probes")
        return
    if not spec.uses_trl_sft:
        raise TrainfitError("--calibrate times the `trl sft` command trainfit writes, and a custom model "
                            "(model.factory) trains through `trainfit train`'s own loop on the probe's very step",
                            "drop --calibrate: that loop adds no trainer of its own to the probe's step")
    if trl_data_config(spec) is None:
        raise TrainfitError("--calibrate runs the `trl sft` command on the spec's data, and this spec has no data "
                            "file `trl sft` can load", "give the spec a data.path in a format `datasets` loads "
                            "(JSONL, JSON, CSV, Parquet or text; not TSV or a save_to_disk folder), or drop --calibrate")
    trainer_env()


def trainer_env() -> dict[str, str]:
    """This process's environment, with the ``trl`` beside this Python first on PATH (the one whose
    package was checked) and unbuffered output (each progress update arrives as it is written)."""
    if importlib.util.find_spec("trl") is None:
        raise TrainfitError("trl is not installed: a calibration runs the written `trl sft` command",
                            f"pip install trl (the version the command was written for: see summary.json's "
                            f"versions), or {FALLBACK_HINT}")
    path = os.pathsep.join(p for p in (str(Path(sys.executable).parent), os.environ.get("PATH")) if p)
    if shutil.which("trl", path=path) is None:
        raise TrainfitError(f"trl is installed for {sys.executable} but its `trl` command is on no PATH",
                            f"reinstall trl (pip install --force-reinstall trl), or {FALLBACK_HINT}")
    return {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}


def one_process(config: Mapping[str, Any], *, template: bool) -> None:
    """Refuse a config that trains over several machines (``nnodes``: its command on this machine
    alone would wait for the others, or stop at once, without its rank) or, but through a
    ``template`` (both runs yours), several processes (``nproc_per_node``: the calibration's second
    run, ``trainfit train``, trains in one)."""
    machines, processes = int(config.get("nnodes") or 1), int(config.get("nproc_per_node") or 1)
    if machines > 1:
        raise TrainfitError(f"--calibrate runs the training command on this machine, and nnodes: {machines} trains on "
                            f"{machines} machines", "time it on the cluster (bash train_command.sh --max_steps N on "
                            "each machine), or drop --calibrate: the ranking then rests on the probes")
    if processes > 1 and not template:
        raise TrainfitError(f"this config trains on {processes} processes (nproc_per_node: {processes}), and a "
                            "calibration's second run, `trainfit train`, trains in one",
                            "time it yourself (bash train_command.sh --max_steps N), or drop --calibrate: the ranking "
                            "then rests on the probes")
