"""A run folder's ``train.json`` rebuilt where it is damaged or gone but checkpoints survive.

``train.json`` says what a folder trains; a resume checks the command against it. Without it the
checkpoints (hours of training) could not be resumed, and a new start in the folder is refused
because they are there. So the record is rebuilt from what is left: what the resume command
trains now (the tune folder, the plan or fastest config, the arguments), checked against every
start ``train_log.jsonl`` recorded (its trial and where it came from), with the first start's time
from that log. What the record held alone (the first start's exact arguments and the data's
fingerprint) cannot be checked again: the rebuild says so, and keeps the damaged file beside it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.errors import TrainfitError
from trainfit.files import set_aside, write_atomically
from trainfit.train.checkpoints import checkpoints, latest_complete
from trainfit.train.records import log_events

if TYPE_CHECKING:
    from trainfit.train.records import TrainRun

LOG = "train_log.jsonl"


def rebuilt(output: Path, now: TrainRun, why: str, say: Callable[[str], None]) -> TrainRun:
    """``output/train.json`` rebuilt as ``now`` (what the resume command trains) started when the
    log says the run first started; ``why``: what is wrong with the old one (said). A damaged file
    is kept as ``train.json.damaged`` (:func:`~trainfit.files.set_aside`). Refused when no complete
    checkpoint is there to resume, or when the log's starts trained another trial or source than ``now``."""
    record_path = output / "train.json"
    if latest_complete(output) is None:
        raise TrainfitError(f"{why}, and {output} holds no complete checkpoint to resume",
                            "train into a new --output (or remove this folder and start again)")
    starts = _starts(output / LOG)
    other = [s for s in starts if (s.get("trial"), s.get("source")) != (now.trial, now.source)]
    if other:
        raise TrainfitError(f"{why}; {output / LOG} says the run trained trial {other[0].get('trial')} "
                            f"from {other[0].get('source')}, and this command trains trial {now.trial} from "
                            f"{now.source}", "resume with the tune folder and plan the run started with, "
                            "or train into a new --output")
    started_at, since = _first_start(output, starts)
    record = dataclasses.replace(now, started_at=started_at)
    aside = set_aside(record_path) if record_path.exists() else None
    write_atomically(record_path, json.dumps(record.to_json(), indent=2) + "\n")
    say(f"trainfit: {why}; rebuilt {record_path} from this command and {since}: the resume goes on from the "
        "checkpoints, but cannot check that the arguments and the data are those of the first start"
        + (f" (the damaged file is kept as {aside.name})" if aside else ""))
    return record


def _starts(log: Path) -> list[dict[str, Any]]:
    """The ``start`` events of a run's log, oldest first; a line that does not parse is passed over
    (a crash may cut the last one short)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [e for e in log_events(lines) if e.get("event") == "start"]


def _first_start(output: Path, starts: list[dict[str, Any]]) -> tuple[float, str]:
    """The first start's epoch seconds, and where they come from: the log, else the oldest
    checkpoint's time (a deadline counts from it; the run is then older than it says)."""
    times = [s["time"] for s in starts if isinstance(s.get("time"), (int, float)) and not isinstance(s["time"], bool)]
    if times:
        return float(min(times)), f"{output / LOG} (its first start)"
    oldest = checkpoints(output)[0]
    return oldest.stat().st_mtime, f"the time of {oldest.name} (no start in {LOG}: the run began before it)"

