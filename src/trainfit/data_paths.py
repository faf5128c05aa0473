"""What a dataset path names, before anything is read from it: one file, a folder of shards, a glob
pattern or a ``save_to_disk`` folder (:func:`data_files`), and the paths refused because a file
read more than once cannot be one (a pipe, a device: :func:`refuse_special`). The spec checks its
paths with these rules, and the readers (``trainfit.data.readers``) read by them."""

from __future__ import annotations

import glob
import json
import stat
from collections.abc import Iterable
from pathlib import Path

from trainfit.errors import TrainfitError
from trainfit.files import file_kind

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv",
            ".parquet": "parquet", ".txt": "text", ".text": "text"}
COMPRESSED = (".gz", ".bz2", ".xz")
"""Line and JSON files may be compressed (``train.jsonl.gz``): read through the stdlib's codecs."""


def data_suffix(path: Path) -> str:
    """``.jsonl`` for ``train.jsonl`` and for ``train.jsonl.gz``."""
    suffixes = [x.lower() for x in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


class NotRegularFile(TrainfitError):
    """A device, pipe or socket given where a file is read. trainfit reads a dataset several times
    (fingerprint, count, probe, training) and bounds each read by the file's size: ``/dev/zero`` has
    no size and never ends (the fingerprint grew to 24 GB), and a pipe (``<(cat train.jsonl)``)
    is empty once read."""


def special_kind(path: str | Path) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a folder (symbolic links
    followed): ``a pipe (FIFO)``, ``a character device``...; None otherwise."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:  # missing, or not ours to look at: the caller's own check says so
        return None
    return None if stat.S_ISDIR(mode) else file_kind(mode)


def refuse_special(path: Path, what: str = "") -> None:
    """Raise :class:`NotRegularFile` when ``path`` is a device, pipe or socket (``what``: how to
    name it, e.g. "the tokenizer "); the fix is a file of its content."""
    kind = special_kind(path)
    if kind is not None:
        raise NotRegularFile(f"{what}{path} is {kind}, not a regular file",
                             "save its content as a file first and give that file (trainfit reads it more than once)")


def is_hf_folder(path: Path) -> bool:
    """A ``datasets`` ``save_to_disk`` folder (read as one dataset)."""
    return path.is_dir() and ((path / "state.json").exists() or (path / "dataset_info.json").exists())


def data_files(path: str | Path) -> list[Path]:
    """The files a dataset path stands for, in reading order: one file; a folder of shards (every
    data file under it, sorted, e.g. ``train-00000-of-00004.parquet``...); a glob pattern
    (``data/*.jsonl``, ``**`` recursive); or a ``save_to_disk`` folder, read as one. A pipe or a
    device among a folder's data files or a pattern's matches is refused (:func:`_regular`)."""
    text = str(path)
    if any(c in text for c in "*?["):
        files = _regular(Path(f) for f in glob.glob(text, recursive=True))
        if not files:
            raise TrainfitError(f"{text} matches no file", "check the pattern (a spec's relative paths start at "
                                                           "its folder)")
        return files
    path = Path(path)
    if not path.exists():
        raise TrainfitError(f"{path} does not exist", "check the dataset path")
    refuse_special(path)
    if not path.is_dir() or is_hf_folder(path):
        return [path]
    if (path / "dataset_dict.json").exists():  # DatasetDict.save_to_disk: one folder per split
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits") or ["train"]
        raise TrainfitError(f"{path} is a DatasetDict with the splits {', '.join(splits)}",
                            f"point at the split you train on, e.g. {path / splits[0]}")
    files = _regular(f for f in path.rglob("*") if data_suffix(f) in SUFFIXES
                     and not any(part.startswith(".") for part in f.relative_to(path).parts))
    if not files:
        raise TrainfitError(f"{path} is a folder with no data files ({', '.join(sorted(SUFFIXES))}) and not a "
                            "Hugging Face save_to_disk dataset",
                            "point at a file, a folder of shards, a glob pattern, or a save_to_disk folder")
    return files


def _regular(paths: Iterable[Path]) -> list[Path]:
    """The regular files of ``paths`` (a folder's listing, a pattern's matches), sorted; folders
    (and links that lead nowhere) are passed over, a pipe or a device is refused, naming it
    (:func:`refuse_special`): left out, its rows would be missing from every count without a word."""
    files = sorted(paths)
    for path in files:
        refuse_special(path)
    return [path for path in files if path.is_file()]
