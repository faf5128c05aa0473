"""Whether a resumed run reads the data its first start read: ``train.json`` keeps the fingerprint
of the files it trains on (:func:`identity`), and a resume on changed data is refused, as it
would repeat or skip samples (:func:`refuse_changed`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from trainfit.data.readers import fingerprint
from trainfit.errors import TrainfitError
from trainfit.summary import RecordedSpec
from trainfit.trainer.command import flags


def trained_files(spec: RecordedSpec, argv: Sequence[str] | None = None) -> list[str]:
    """The data a run trains on: a ``trl sft`` run's (``argv``), the files its ``--config`` lists
    (tune writes the very files it counted there, an eval set's too where planned); another run's,
    the spec's ``data.path``. Empty where there is none, or the config cannot be read."""
    if argv is None:
        return [str(spec.data_path)] if spec.data_path else []
    import yaml

    config = flags(argv).get("config")
    if not config:
        return []
    try:
        loaded = yaml.safe_load(Path(config).read_text())
    except (OSError, yaml.YAMLError):
        return []
    datasets = loaded.get("datasets") if isinstance(loaded, dict) else None
    files: list[str] = []
    for dataset in datasets if isinstance(datasets, list) else []:
        listed = dataset.get("data_files") if isinstance(dataset, dict) else None
        for entry in listed.values() if isinstance(listed, dict) else [listed]:
            files += [entry] if isinstance(entry, str) else [f for f in entry or [] if isinstance(f, str)]
    return files


def identity(files: Sequence[str]) -> str | None:
    """One fingerprint of ``files``' content (each file's size and bytes sampled through it, not
    its modification time: a copy or a ``touch`` is the same data); None without files, or where
    one cannot be read (the run's own reading then says why)."""
    try:
        return "+".join(fingerprint(f, times=False) for f in files) if files else None
    except (OSError, ValueError, TrainfitError):
        return None


def refuse_changed(files: Sequence[str], output: Path, *, readable: bool) -> NoReturn:
    """The error for a resume of the run in ``output`` on data that changed since its first start."""
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    raise TrainfitError(f"the data the run in {output} trains on ({shown}) changed since it started ("
                        + ("its size or content differ" if readable else "it cannot be read now")
                        + "): a resume would not see the same samples in the same order, and would repeat or skip some",
                        "put the data back as it was and resume, or train into a new --output")
