"""What a running job's page shows above its raw log (issue 50 item 4), read from the files its
run writes as it goes, not from the trainer's progress bars and dicts:

- a tune: a line of where it stands (probed, fit, OOM, its time, the best so far with its interval)
  and its ``report.html``, framed, whose ``version`` changes as each trial rewrites it;
- a training: a progress bar of its steps, the last logged loss, the time so far and what the
  on-track monitor projects is left (``train_log.jsonl``);
- a comparison: a progress bar of its configs trained, each one's status (``compare.json``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.format import format_duration, spread, values_line
from trainfit.run_folder import RunFolder
from trainfit.train.records import log_events
from trainfit.ui.jobs import Job
from trainfit.ui.paths import open_regular, read_regular

TAIL = 64 * 1024
"""The bytes of a training's log read from its end: its last loss and on-track lines are there."""


def live_view(root: Path, job: Job, url_for: Callable[..., str]) -> dict[str, Any] | None:
    """The job's live view (see the module); None for a kind without one, or before its first figures."""
    if job.output is None:
        return None
    folder = root / job.output
    try:
        if job.command == "tune":
            return _tune(folder, url_for("serve_file", relative=f"{job.output}/report.html"))
        if job.command == "train":
            return _train(folder)
        if job.command == "compare":
            return _compare(folder)
    except (OSError, ValueError, TrainfitError, KeyError, TypeError):
        return None  # not written yet, being written, or not as trainfit writes it: the next poll reads it
    return None


def _tune(folder: Path, href: str) -> dict[str, Any]:
    version = (folder / "report.html").stat().st_mtime_ns
    s = RunFolder(folder).summary
    best = s.best_config
    standing = (f"best so far: {values_line(best.searched)} at {best.samples_per_second or 0:,.4g} samples/s"
                f"{spread(best.spread_rel)}" if best else "nothing fits yet")
    return {"href": href, "version": str(version),
            "line": f"{s.total_tested} probed ({s.successful} fit, {s.failed_oom} OOM) in "
                    f"{s.total_tuning_time_s or s.tuning_time_s:.0f} s; {standing}"
                    + ("" if s.stop_reason == "running" else f"; {s.stop_reason}")}


def _train(folder: Path) -> dict[str, Any] | None:
    with open_regular(folder / "train_log.jsonl") as f:
        start = max(0, f.seek(0, 2) - TAIL)
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    events = log_events(lines[1 if start else 0:])  # a first line cut by the seek left out
    logged = next((e for e in reversed(events) if e.get("event") == "log" and "max_steps" in e), None)
    if logged is None:
        return None
    step, total = int(logged.get("step", 0)), int(logged.get("max_steps") or 0)
    loss = next((e["loss"] for e in reversed(events) if isinstance(e.get("loss"), (int, float))), None)
    track = next((e for e in reversed(events) if e.get("event") == "on_track"), None)
    left = (f"; ~{format_duration(max(0.0, track['projected_s'] - track['elapsed_s']))} left ({track['state']})"
            if track and isinstance(track.get("projected_s"), (int, float)) else "")
    return {"progress": [step, total],
            "line": f"step {step:,} of {total:,}" + (f" ({step / total:.0%})" if total else "")
                    + (f"; loss {loss:.4g}" if loss is not None else "")
                    + f"; {format_duration(float(logged.get('elapsed_s') or 0))} so far{left}"}


def _compare(folder: Path) -> dict[str, Any] | None:
    raw = json.loads(read_regular(folder / "compare.json"))
    configs, runs = raw.get("configs") or {}, raw.get("runs") or {}
    said = ", ".join(f"{name}: {run.get('status')}" for name, run in runs.items() if isinstance(run, dict))
    return {"progress": [len(runs), len(configs)],
            "line": f"{len(runs)} of {len(configs)} configs trained, {raw.get('steps')} steps each"
                    + (f" ({said})" if said else "")}
