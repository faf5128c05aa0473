"""The JSON state files ``trainfit train`` reads (``plan.json``, ``train.json``,
``train_result.json``), read as their records or refused in one line naming the file; and two of
those records, :class:`TrainRun` (``train.json``) and :class:`TrainResult` (``train_result.json``).

A file of valid JSON can still be damaged: an edit by hand, a bad merge, another tool's output
(``"command": 12``). :meth:`trainfit.json_record.Record.from_json` checks the values' types and says
which key is wrong (:class:`trainfit.json_record.Malformed`); :func:`load_record` adds the file and the
fix, and marks the file :class:`Damaged`, which a resume can rebuild (:mod:`trainfit.train.rebuild`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainfit.errors import TrainfitError
from trainfit.json_record import Malformed, Record, check_schema
from trainfit.plan.eval_pass import Evaluation
from trainfit.spec.training import TrainValues
from trainfit.summary import RecordedSpec
from trainfit.train.data_check import trained_files
from trainfit.trainer.command import flags

R = TypeVar("R", bound=Record)


class Damaged(TrainfitError):
    """A state file that is not what trainfit wrote: not JSON, not an object, or a value of the
    wrong type (a file of another schema version is not damaged: it is refused as such)."""


def read_object(path: Path, what: str, fix: str) -> dict[str, Any]:
    """The JSON object in ``path`` (``what`` names it in the error; ``fix`` is the error's fix)."""
    try:
        text = path.read_bytes()
    except OSError as err:
        raise TrainfitError(f"cannot read {what} {path}: {err}", fix) from None
    try:
        raw = json.loads(text)
    except ValueError as err:  # UnicodeDecodeError is one
        raise Damaged(f"cannot read {what} {path}: {err}", fix) from None
    if not isinstance(raw, dict):
        raise Damaged(f"{what} {path} is not a JSON object", fix)
    return raw


def load_record(cls: type[R], path: Path, what: str, fix: str) -> R:
    """``path`` read as a ``cls`` record; :class:`Damaged`, naming the file and the key, where a
    value is missing or of the wrong type."""
    try:
        return cls.from_json(read_object(path, what, fix))
    except Malformed as err:
        raise Damaged(f"{what} {path} is damaged: {err}", fix) from None


def log_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The events of a run's ``train_log.jsonl`` (its lines), in order; a line that does not parse
    is passed over (a crash, or a line being written, may cut the last one short)."""
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class TrainRun(Record):
    """``train.json``: what an output folder trains; written at the first start, checked on resume."""

    schema_version: int = SCHEMA_VERSION
    run_dir: str
    """The tune output folder it came from."""
    source: str
    """``plan.json`` (the plan's chosen config and epochs), ``compare.json`` (``--from-compare``
    without a plan: the fastest config that learns as the winner), else ``train_command.sh`` (a
    Hugging Face model: the fastest config's command) or ``summary.json`` (a factory model: the
    fastest config)."""
    trial: int
    kind: str
    """``trl_sft`` (the written command, by TRL's trainer), ``factory`` (trainfit's loop on the
    probe's ``TrainStep``) or ``command`` (the spec's ``tune.command_template``, as a child process)."""
    threads: int | None
    """CPU threads the probe used (``OMP_NUM_THREADS`` of the command); None: the library default."""
    argv: list[str] = field(default_factory=list)
    """``trl_sft``: the ``trl sft`` arguments trained, the user's extra ones and trainfit's own last;
    ``command``: the one command line run."""
    config: dict[str, Any] = field(default_factory=dict)
    """``factory``: every knob of the config trained."""
    epochs: float | None = None
    """``factory``: passes over the data (the plan's, else the spec's ``tune.epochs``)."""
    max_steps: int | None = None
    """A cap on the optimizer steps (``--max-steps``); None: the epochs decide."""
    evaluation: Evaluation | None = None
    """``factory``: the plan's eval set and schedule (a ``trl_sft`` run has them in its arguments)."""
    training: dict[str, Any] = field(default_factory=dict)
    """``factory``: the training values it trains by (``TrainValues``' JSON: the spec's ``train:``
    section with the flags given after ``--`` over it; a ``trl_sft`` run has them in its arguments)."""
    started_at: float
    """Epoch seconds of the first start: a deadline and the actual time count from it."""
    data: str | None = None
    """The fingerprint of the data the run trains on at its first start (:mod:`trainfit.train.data_check`):
    a resume on other data would not see the same samples in the same order. None: no data, or a
    record written before it was kept."""

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TrainRun:
        check_schema(raw, SCHEMA_VERSION, "train.json", "train into a new --output with this trainfit")
        return super().from_json(raw)

    def into(self, output: Path) -> TrainRun:
        """This record training into ``output``: a ``trl_sft`` run's ``--output_dir`` (the last, the
        one that wins) set to it. The folder resumed may have been moved or copied since the record
        was written, and a run writes and rotates checkpoints only in the folder it is given: the
        recorded path would recreate the old folder, or rotate away the original's checkpoints."""
        if self.kind != "trl_sft" or "--output_dir" not in self.argv:
            return self
        at = len(self.argv) - 1 - self.argv[::-1].index("--output_dir")
        return dataclasses.replace(self, argv=[*self.argv[:at + 1], str(output), *self.argv[at + 2:]])

    def data_files(self, spec: RecordedSpec) -> list[str]:
        """The files this run trains on (:func:`trainfit.train.data_check.trained_files`), ``spec`` its tune's."""
        return trained_files(spec, self.argv if self.kind == "trl_sft" else None)

    def what(self) -> dict[str, str]:
        """What decides the training, flat, for :func:`~trainfit.train.prepare.differences`."""
        out = {"tune folder": self.run_dir, "trial": str(self.trial), "max steps": str(self.max_steps)}
        if self.kind == "trl_sft":  # the output folder is the one resumed, however it is spelled
            return {**out, **{f"--{k}": v for k, v in flags(self.argv).items() if k != "output_dir"}}
        if self.kind == "command":
            return {**out, "command": " ".join(self.argv)}
        e = self.evaluation
        if e is not None:
            out["evaluation"] = f"{e.path}, every {e.every or 'epoch'}, batch {e.batch_size}"
        return {**out, "epochs": f"{self.epochs:g}" if self.epochs is not None else "None",
                **{k: json.dumps(v) for k, v in self.config.items()},
                # a record from before training values were kept trained at their defaults; the services
                # the figures go to do not change what trains
                **{f"train.{k}": json.dumps(v) for k, v in TrainValues.of(self.training).to_json().items()
                   if k != "report_to"}}


@dataclass(frozen=True, kw_only=True)
class TrainResult(Record):
    """``train_result.json``: how the run (or this part of it) ended."""

    schema_version: int = SCHEMA_VERSION
    status: str
    """``finished``, or ``stopped`` (SIGTERM or the deadline: resume it with ``--resume``)."""
    stopped_by: str | None
    step: int | None
    """Optimizer steps done (None: your own command ran, trainfit does not see its steps)."""
    max_steps: int | None
    resumed_from: str | None
    """The checkpoint this process started from; None: step 0."""
    process_s: float
    """This process's time in ``train``: start-up, model, data, the steps, the saves."""
    elapsed_s: float
    """Since the first start (``train.json``'s ``started_at``), pauses between resumes included."""
    planned_s: float | None
    """The plan's ETA for a run of ``max_steps`` steps (the plan's own, or a ``--max-steps`` run's;
    None: trained without a plan)."""
    planned_low_s: float | None = None
    planned_high_s: float | None = None
    output: str
    resume: str | None = None
    """The command that continues a stopped run (None: it finished)."""
    at_once: bool = False
    """Stopped without a save (a second Ctrl-C, or a signal before the first step): ``step`` is the
    last complete checkpoint's (0: none), where ``resume`` continues; the steps after it are lost."""
    before_first_step: bool = False
    """Stopped at once while the run started up (loading, before the trainer's first step): this
    process trained nothing, so nothing was lost."""
    peak_memory_bytes: int | None = None
    """This process's peak, counted as a probe counts its own (CUDA: the caching allocator's reserved
    bytes; CPU: the peak RSS, which holds the dataset and the trainer too); None: your own command
    trained, in a process of its own."""
    probe_peak_memory_bytes: int | None = None
    """The probe's peak for the trained config (``summary.json``), which promised the run fits; None
    where the summary does not report that trial."""
    trial: int | None = None
    """The tune trial trained (None: a result written before it was kept)."""
    step_s: float | None = None
    """This process's mean optimizer step (its saves and evaluation passes left out), as the trainer
    ran it: what a later plan of this config learns its pace from. None: no step ran, or your own
    command trained (its steps are its trainer's)."""
    planned_step_s: float | None = None
    """The plan's expected step of the config trained, the probe's alone (``Plan.model_step_s``): what
    ``step_s`` is held against when a later plan learns the trainer's cost from it (None: no plan)."""
    startup_s: float | None = None
    """This process's launch to the trainer's start (model load, tokenization), for a run from step 0
    (None for a resumed part, or your own command): what a later plan learns its start-up from."""

