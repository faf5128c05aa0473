"""Each config of a comparison as a job: its ``job.json`` (what its process is given), the process
started bound to die with the comparison, a config's measured run read back, and the config run
in a process of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from trainfit.compare.configs import NamedConfig
from trainfit.compare.runs import MEASURED, ConfigRun
from trainfit.data.analyze import analyze_spec
from trainfit.devices import resolve_device_name
from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.plan.eval_pass import EvalSchedule, trl_dataset
from trainfit.spec import Spec
from trainfit.trainer.command import initial_model, trl_command, trl_data_config, with_eval_split

CONFIGS = "configs"
"""The folder of the configs' folders, ``OUTPUT/configs/NAME`` (``job.json``, ``result.json``, what
its trainer writes): a folder of their own, as a config may be named like any of the comparison's
files (``model``, ``holdout``, ``compare.json``). An older comparison's configs, in ``OUTPUT/NAME``,
resume from its ``compare.json``; what trains again trains here."""


def with_changes(record: Any, **changes: Any) -> Any:
    """A copy of the frozen ``record`` with ``changes``."""
    import dataclasses

    return dataclasses.replace(record, **changes)


def recorded_jobs(output: Path) -> dict[str, dict[str, Any]]:
    """The ``job.json`` of each config's folder, by name, where it can be read and records its
    comparison's setup (one that cannot: its config trains again)."""
    jobs = {}
    for path in sorted((output / CONFIGS).glob("*/job.json")):
        try:
            job = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(job, dict) and isinstance(job.get("comparison"), dict):
            jobs[path.parent.name] = job
    return jobs


def measured_run(folder: Path, name: str) -> ConfigRun | None:
    """The measured run ``folder/result.json`` holds of config ``name`` (None: none, or damaged)."""
    try:
        run = ConfigRun.from_json(json.loads((folder / "result.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return run if run.name == name and run.status in MEASURED else None


def as_job_json(value: Any) -> Any:
    """``value`` as a ``job.json`` holds it once read back."""
    return json.loads(json.dumps(value, default=str))


CHILD_MAIN = """import sys
if sys.path[:1] == ['']:
    del sys.path[0]
from trainfit.probe.worker import die_with_parent
die_with_parent(int(sys.argv[2]), sys.argv[3] == '1')
from trainfit.compare.child import entry
sys.exit(entry(sys.argv[1:2]))
"""
"""The config process's first lines: it is bound to die with the comparison before any heavy
import (transformers' trainer takes seconds, and the comparison may die meanwhile)."""


def child_command(job: Path, parent_pid: int, on_main_thread: bool) -> list[str]:
    """The config process's command line: its ``job.json``, the comparison's pid, and whether the
    thread starting it lives as long as the comparison (see
    :func:`~trainfit.probe.worker.die_with_parent`: it dies with the comparison, as a probe worker
    does with its runner). ``-c``, not ``-m``, as the probe worker's
    (:func:`~trainfit.probe.runner.worker_command`): no file of the working directory shadows a library."""
    return [sys.executable, "-c", CHILD_MAIN, str(job), str(parent_pid), str(int(on_main_thread))]


class ConfigJobs:
    """What each config's child process is given, and the child run."""

    def __init__(self, spec: Spec, spec_path: str | Path, overrides: Sequence[str], output: Path,
                 evaluation: EvalSchedule | None, steps: int, minutes: float | None = None, *,
                 comparison: dict[str, Any], lock: IO[str]) -> None:
        import torch

        self.spec, self.output, self.evaluation, self.steps, self.lock = spec, output, evaluation, steps, lock
        self.base = {"spec": str(Path(spec_path).resolve()), "overrides": list(overrides), "steps": steps,
                     "minutes": minutes,
                     "evaluation": evaluation.to_json() if evaluation else None,
                     "comparison": comparison}  # which comparison the run is of: a rebuild takes only its own
        self.stats = analyze_spec(spec, progress=False)
        self.cpu = resolve_device_name(spec.probe.device) == "cpu"
        self.threads = torch.get_num_threads() if self.cpu else None
        self.data_config = self.folder = Path()
        self.model_dir: Path | None = None
        if spec.model.factory is None:
            self._trl_data()

    def _trl_data(self) -> None:
        """The data (and eval split) and the saved random-init model the ``trl sft`` runs read."""
        import yaml

        config = trl_data_config(self.spec)
        if config is None:
            raise TrainfitError(f"trl sft has no loader for {self.spec.data.path if self.spec.data else 'the data'}",
                                "give the data as JSONL, JSON, CSV, Parquet or text")
        self.data_config = self.output / "trl_data.yaml"
        write_atomically(self.data_config, yaml.safe_dump(config, sort_keys=False))
        if self.evaluation is not None:
            self.folder = trl_dataset(self.output / "trl_dataset", self.spec, Path(self.evaluation.path))
        self.model_dir = initial_model(self.output, self.spec)

    def argv(self, config: NamedConfig) -> list[str]:
        """The ``trl sft`` arguments of ``config``, as tune writes them, on this comparison's data."""
        words = trl_command(self.spec, config.params, max_length=self.stats.truncation_length(config.params.max_length),
                            data_config=self.data_config, cpu_threads=self.threads, model_dir=self.model_dir)
        words = words[words.index("sft") + 1:]
        if self.evaluation is not None:
            words = with_eval_split(words, self.folder, self.evaluation.trl_args())
        return words

    def run(self, config: NamedConfig) -> ConfigRun:
        folder = self.output / CONFIGS / config.name
        shutil.rmtree(folder, ignore_errors=True)  # a config cut short earlier starts over
        folder.mkdir(parents=True)
        job = {**self.base, "name": config.name, "given": config.given, "folder": str(folder),
               "threads": self.threads, "samples": self.stats.samples,
               "argv": self.argv(config) if self.spec.model.factory is None else []}
        write_atomically(folder / "job.json", json.dumps(job, indent=2) + "\n")
        began = time.perf_counter()
        # Its own session: a terminal's Ctrl-C reaches `trainfit compare` alone, which kills the child as it
        # stops (subprocess.run does) and says how to resume, instead of the child's traceback mid-import.
        # It holds the folder's lock too, so that a comparison killed outright leaves it held until the
        # child, dying with it, is gone.
        on_main_thread = threading.current_thread() is threading.main_thread()
        subprocess.run(child_command(folder / "job.json", os.getpid(), on_main_thread), check=False,
                       start_new_session=True, pass_fds=(self.lock.fileno(),))
        wall = round(time.perf_counter() - began, 3)
        result = folder / "result.json"
        if not result.is_file():
            return with_changes(ConfigRun.failed(config.name, self.steps, "its process ended without a result (killed?)"),
                         wall_s=wall)
        return with_changes(ConfigRun.from_json(json.loads(result.read_text())), wall_s=wall)

