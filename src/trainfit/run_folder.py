"""A tune output folder, read through one object: its ``summary.json``, ``trainer_cost.json`` and
``train_command.sh``, each read and checked once however many steps of a flow ask (a flow hands the
same :class:`RunFolder` on), with a clear error naming what is wrong and the way on. The tune's
measured trials are read on demand by ``plan.inputs.load_run``."""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path

from trainfit.errors import TrainfitError
from trainfit.summary import Summary, TrainerCost

SUMMARY_FILE = "summary.json"
TRAINER_COST_FILE = "trainer_cost.json"
"""Where ``tune --calibrate`` keeps the trainer cost it measured in the output folder
(:class:`TrainerCost`): a later ``--resume`` without ``--calibrate`` ranks with it too."""
COMMAND_FILE = "train_command.sh"


class RunFolder:
    """The output folder of a ``trainfit tune`` (a plan and a calibration write into it too)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, folder: Path | str | RunFolder) -> RunFolder:
        """``folder`` itself when it is one already (what it read stays read), else a new one."""
        return folder if isinstance(folder, RunFolder) else cls(folder)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @functools.cached_property
    def summary(self) -> Summary:
        """``summary.json``, or a clear error naming what is wrong (no file: the newest tune folder
        inside, where there is one)."""
        folder, path = self.path, self.path / SUMMARY_FILE
        if not path.is_file():
            inside = sorted(folder.glob(f"*/{SUMMARY_FILE}"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
            raise TrainfitError(f"{folder} holds no {SUMMARY_FILE}: it is not a tune output folder",
                                f"the newest tune folder in it is {inside[-1].parent}" if inside else
                                "give the folder `trainfit tune --output` wrote (its summary.json names the best config)")
        try:
            raw = json.loads(path.read_text())
            if not isinstance(raw, dict):
                raise TypeError(f"it holds a JSON {type(raw).__name__}, not an object")
            return Summary.from_json(raw)
        except (ValueError, KeyError, TypeError) as err:
            raise TrainfitError(f"cannot read {path}: {err}",
                                f"rebuild it from the trials stored beside it, probing nothing again: trainfit tune "
                                f"YOUR_SPEC.yaml --output {shlex.quote(str(folder))} --resume (with the --storage URL "
                                "too, if the tune used one)") from None

    @functools.cached_property
    def trainer_cost(self) -> TrainerCost | None:
        """``trainer_cost.json`` (what ``tune --calibrate`` measured), None when there is none."""
        path = self.path / TRAINER_COST_FILE
        if not path.is_file():
            return None
        try:
            return TrainerCost.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as err:
            raise TrainfitError(f"cannot read {path}: {err}",
                                "delete it (the ranking then rests on the probes alone), or tune with --calibrate "
                                "again") from None

    @functools.cached_property
    def command_script(self) -> str | None:
        """``train_command.sh`` as read the first time it was asked for (a tune still running may
        rewrite the file; what a flow checked is what it runs); None where there is none."""
        path = self.path / COMMAND_FILE
        return path.read_text() if path.is_file() else None
