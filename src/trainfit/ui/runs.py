"""Run folders under the root, found by the file each command writes, with their status, pages and
key figures."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.format import format_duration, spread, values_line
from trainfit.run_folder import SUMMARY_FILE, RunFolder
from trainfit.ui.jobs import Job, Jobs, State
from trainfit.ui.paths import Root, open_regular, read_regular
from trainfit.ui.run_figures import kind_figures
from trainfit.ui.specs import walk

MARKERS = (
    (SUMMARY_FILE, "tune"),
    ("ablation.json", "ablate"),
    ("compare.json", "compare"),
    ("train.json", "train"),
    ("plan.json", "plan"),  # a plan made before the hardware (--spec, --like); a tune folder's plan is its own
    ("lengths.json", "analyze"),
    ("measurement.json", "probe"),
)
"""The file that makes a folder a run of each kind, in the order they are tried."""
INSIDE_RUNS = ("train", "budget-")
"""Folders inside a run that are runs of their own (a tune folder's ``train/``, a budget matrix's
``budget-<N>gb/``); the rest of a run's inside (probes, a comparison's configs) is not searched."""
WITH_INSIDES = ("tune", "ablate", "compare", "train")
"""The kinds whose folder holds their own working files (a tune's probes, a comparison's configs, a
training's checkpoints): below one, only :data:`INSIDE_RUNS` are searched. A probe's, an analysis's
or a plan's record is one file that may lie in any folder (``trainfit probe --json measurement.json``
in a project's own): the search goes on below it, where it stopped and lost every run under it."""
MAX_RUNS = 500


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One run folder as the list shows it."""

    path: str
    """Root-relative."""
    kind: str
    status: str
    """``running``, ``finished``, ``failed`` or ``interrupted``."""
    pages: list[str]
    """Its HTML pages, by name."""
    modified: float
    job: str | None = None
    """The id of the UI job that wrote it last, where one did."""
    speed: str = ""
    """A tune's best samples/s or a probe's, with its 95% interval (empty for the other kinds)."""


def find_runs(root: Root, jobs: Jobs) -> list[Run]:
    """Every run folder under the root, newest first."""
    latest: dict[str, tuple[Job, State]] = {}
    for job in reversed(jobs.all()):  # oldest first: the newest job of a folder stays
        if job.output is not None and job.command != "plan":  # a plan that does not fit (exit 1) fails no tune
            state = jobs.state(job)
            if state.status != "damaged":  # its exit unknown: the folder's own files say how it stands
                latest[job.output] = (job, state)
    found = []
    for folder, dirs, files in walk(root.path):
        kind = next((k for marker, k in MARKERS
                     if marker in files and root.why_not_opened(folder / marker) is None), None)  # no FIFO read
        if kind is None:
            continue
        if kind in WITH_INSIDES:
            dirs[:] = [d for d in dirs if d.startswith(INSIDE_RUNS)]
        found.append(_run(root, folder, kind, latest.get(root.relative(folder))))
        if len(found) >= MAX_RUNS:
            break
    return sorted(found, key=lambda r: r.modified, reverse=True)


def default_pair(runs: list[Run]) -> tuple[str, str]:
    """The runs the side by side picks at first (a, b): the newest (b) and the newest other run of its
    kind (a), whose figures line up row by row; else the next newest."""
    if len(runs) < 2:
        return "", ""
    b = runs[0]
    a = next((r for r in runs[1:] if r.kind == b.kind), runs[1])
    return a.path, b.path


def _run(root: Root, folder: Path, kind: str, job: tuple[Job, State] | None) -> Run:
    status = job[1].status if job else None
    if status != "running" and held(folder):
        status = "running"  # started outside the UI, or by an earlier one
    if status is None:
        status = _status_from_files(folder, kind)
    return Run(path=root.relative(folder), kind=kind, status=status, job=job[0].id if job else None,
               pages=sorted(p.name for p in folder.glob("*.html")), modified=_modified(folder),
               speed=_speed(folder, kind))


def _speed(folder: Path, kind: str) -> str:
    """A tune's best samples/s, or a probe's, with its 95% interval (``23.4 ±12%``); empty where it has none."""
    try:
        if kind == "tune":
            best = RunFolder(folder).summary.best_config
            figure, rel = (best.samples_per_second, best.spread_rel) if best else (None, None)
        elif kind == "probe":
            raw = json.loads(read_regular(folder / "measurement.json"))
            figure, rel = raw.get("samples_per_second"), raw.get("step_time_ci95_rel")
        else:
            return ""
    except (TrainfitError, OSError, ValueError, AttributeError):
        return ""
    return f"{figure:,.4g}{spread(rel)}" if isinstance(figure, (int, float)) else ""


def _status_from_files(folder: Path, kind: str) -> str:
    """A run the UI did not start: finished where its last file is there (a tune's summary says why it stopped)."""
    if kind == "train":
        return "finished" if (folder / "train_result.json").is_file() else "interrupted"
    if kind == "tune":
        try:
            reason = RunFolder(folder).summary.stop_reason  # the one reader of summary.json
        except TrainfitError:  # unreadable, or of another schema
            return "failed"
        # a tune writes "running" as it goes: still so, with no process holding the folder, it was stopped
        return "interrupted" if "interrupt" in str(reason).lower() or reason == "running" else "finished"
    return "finished"


def held(folder: Path) -> bool:
    """A live process holds ``folder/.lock`` (a tune, a comparison or a training runs in it). Read
    only: the lock is tried shared and let go at once, the file left as it is."""
    try:
        with open_regular(folder / ".lock") as f:  # a FIFO named .lock would hang a plain open
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(f, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _modified(folder: Path) -> float:
    try:
        return max((os.stat(p).st_mtime for p in folder.iterdir() if p.is_file()), default=folder.stat().st_mtime)
    except OSError:
        return 0.0


def figures(folder: Path) -> list[tuple[str, str]]:
    """A run's key figures as (name, value) rows: a tune folder's best config and counts from its
    ``summary.json``; another kind's as itself (:mod:`trainfit.ui.run_figures`)."""
    return summarised(folder)[0]


def summarised(folder: Path) -> tuple[list[tuple[str, str]], str]:
    """A run's key figures and, for a training or a probe, a chart of them (SVG; '' where none)."""
    if (folder / SUMMARY_FILE).is_file():
        try:
            return _summary_figures(RunFolder(folder)), ""
        except TrainfitError as err:
            return [("error", str(err))], ""
    kind = next((k for marker, k in MARKERS[1:] if (folder / marker).is_file()), None)
    return kind_figures(folder, kind) if kind else ([], "")


def _summary_figures(run: RunFolder) -> list[tuple[str, str]]:
    s = run.summary
    stopped = s.stop_reason
    if stopped == "running" and not held(run.path):  # written as it went, and no process holds it now
        stopped = "interrupted: no process runs it (Resume on its job, or `trainfit tune SPEC --output RUN --resume`)"
    total = s.total_tuning_time_s
    rows = [("device", _text(s.device)), ("strategy", s.strategy), ("stopped", stopped),
            ("probed", f"{s.total_tested} ({s.successful} ok, {s.failed_oom} OOM, {s.failed_error} error, "
                       f"{s.failed_timeout} timeout)"),
            ("tuning time", f"{total:.0f} s over its resumed parts (the last {s.tuning_time_s:.0f} s)" if total
             else f"{s.tuning_time_s:.0f} s")]
    best = s.best_config
    if best is None:
        return [*rows, ("best config", "none fits")]
    return [*rows, ("best config", values_line(best.searched)),
            ("samples/s", _text(best.samples_per_second) + (f"{spread(best.spread_rel)} (the probe's 95% interval)"
                                                             if spread(best.spread_rel) else "")),
            ("tokens/s", _text(best.tokens_per_second)),
            ("peak memory (GiB)", _text(best.memory_peak_gb)), ("MFU", _text(best.mfu)),
            ("effective batch", str(best.effective_batch_size)),
            ("full run", "—" if best.estimated_full_runtime_hours is None else
             f"~{format_duration(best.estimated_full_runtime_hours * 3600)} for {s.epochs_for_estimate:g} epoch(s)"),
            ("command", _text(best.command))]


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)

