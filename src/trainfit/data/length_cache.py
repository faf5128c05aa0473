"""Where counted lengths are kept: a cache folder keyed by the file's fingerprint, the tokenizer and
the fields, written whole (a partial count every few seconds, so an interrupted count resumes)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from trainfit.data.readers import detect_format
from trainfit.data.row_length import LengthRecipe
from trainfit.data_paths import refuse_special
from trainfit.errors import TrainfitError
from trainfit.files import open_own, write_atomically


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRAINFIT_CACHE", Path.home() / ".cache" / "trainfit")) / "lengths"


def _tokenizer_id(path: str | None) -> str:
    if path is None:
        return "fallback-regex-v1"
    p = Path(path)
    if not p.exists():
        raise TrainfitError(f"the tokenizer {path} does not exist",
                            "give a tokenizer folder or a tokenizer.json file (--tokenizer; in a spec, tokenizer:)")
    refuse_special(p, "the tokenizer ")
    files = [p] if p.is_file() else sorted(q for q in p.iterdir()
                                           if q.is_file() and q.suffix in (".json", ".model", ".txt"))
    h = hashlib.sha256()
    for q in files:
        h.update(q.name.encode())
        h.update(q.read_bytes())
    return h.hexdigest()[:16]


class Checkpoint:
    """The cache folder of one count: ``lengths.npy`` when done, else partial lengths + progress.

    Several processes may count one dataset at once (two analyses, a tune beside an analyze); each
    may be interrupted. The partial count is only ever extended, under ``count.lock``, by whoever
    has counted further than it holds: counts are deterministic, so any process's rows are the
    rows, and none cuts another's checkpoint short.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.final = folder / "lengths.npy"
        self.meta = folder / "meta.json"
        self.partial = folder / "partial.i32"
        self.progress = folder / "progress.json"
        self.lock = folder / "count.lock"
        self.writable = True
        """False once a write failed: the count goes on without its cache (it is only a cache)."""

    def _failed(self, err: OSError) -> None:
        if self.writable:
            print(f"warning: cannot write the length cache at {self.folder} ({err.strerror or err}): counting "
                  "without it; set TRAINFIT_CACHE to a writable folder to keep and resume counts", file=sys.stderr)
        self.writable = False

    def check_writable(self) -> bool:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            self._failed(err)
        return self.writable

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold ``count.lock`` (released when closed, also by a process that dies holding it)."""
        import fcntl

        with open_own(self.lock, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def load_final(self) -> tuple[np.ndarray, dict[str, Any]] | None:
        """The finished count, or None; a torn or foreign file (e.g. left by an older version's
        concurrent writes) is a miss, counted again, not a crash."""
        if not (self.final.exists() and self.meta.exists()):
            return None
        try:
            lengths, meta = np.load(self.final, allow_pickle=False), json.loads(self.meta.read_text())
            if lengths.ndim != 1 or not {"bad_rows", "bad_examples", "notes"} <= set(meta):
                return None
        except (OSError, ValueError, TypeError, AttributeError):  # json.JSONDecodeError is a ValueError
            return None
        return lengths, meta

    def _on_disk(self) -> tuple[int, dict[str, Any]]:
        """How many rows the partial count holds, and its state (bad rows); (0, {}) for none.
        The progress file is written after the data, so it is never ahead of it."""
        try:
            state = json.loads(self.progress.read_text())
            rows = int(state["rows"])
            if self.partial.stat().st_size >= 4 * rows:
                return rows, state
        except (OSError, ValueError, TypeError, KeyError):
            pass
        return 0, {}

    def load_partial(self) -> tuple[list[int], dict[str, Any]]:
        with self._locked():
            rows, state = self._on_disk()
            return (np.fromfile(self.partial, dtype=np.int32, count=rows).tolist(), state) if rows else ([], {})

    def save_partial(self, lengths: list[int], state: dict[str, Any]) -> None:
        """Extend the partial count to ``lengths`` (every row counted so far, from row 0) with
        ``state`` (``rows``, bad rows) describing them. Only the rows beyond those on disk are
        written; nothing is written when another process has checkpointed as far or further."""
        if not self.writable:
            return
        try:
            with self._locked():
                saved, _ = self._on_disk()
                if len(lengths) <= saved or self.final.exists():
                    return
                with open_own(self.partial, "r+b" if self.partial.exists() else "wb") as f:
                    f.seek(4 * saved)
                    np.asarray(lengths[saved:], dtype=np.int32).tofile(f)
                    f.truncate()
                    f.flush()
                    os.fsync(f.fileno())
                write_atomically(self.progress, lambda f: f.write(json.dumps(state).encode()))
        except OSError as err:
            self._failed(err)

    def save_final(self, lengths: np.ndarray, meta: dict[str, Any]) -> None:
        if not self.writable:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomically(self.meta, lambda f: f.write(json.dumps(meta).encode()))
            write_atomically(self.final, lambda f: np.save(f, lengths))  # last: it marks the count done
            with self._locked():
                for p in (self.partial, self.progress):
                    p.unlink(missing_ok=True)
        except OSError as err:
            self._failed(err)


def cache_key(path: Path, recipe: LengthRecipe, fp: str, fmt: str) -> str:
    """The cache folder's name: what the lengths depend on (the file, the tokenizer, the fields, the format)."""
    key_src = json.dumps([fp, _tokenizer_id(recipe.tokenizer), recipe.text_fields, recipe.messages_field,
                          recipe.length_field, recipe.length_scale, detect_format(path, fmt),
                          *([recipe.audio_field, recipe.audio_root] if recipe.audio_field else [])])
    return hashlib.sha256(key_src.encode()).hexdigest()[:20]

