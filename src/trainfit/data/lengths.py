"""Count every sample's length (tokens, or a numeric field) with caching and resume.

The count is the expensive pass over a dataset. It streams rows in batches, tokenizes each batch
with the fast tokenizer (which uses all cores), checkpoints to a cache folder every few seconds
and, when interrupted and run again, continues from the last checkpoint. A finished count is
keyed by (file fingerprint, tokenizer, fields), so a repeat is instant.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainfit.data.readers import (COMPRESSED, BadRow, data_files, detect_format, fingerprint, iter_rows,
                                   refuse_special)
from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.progress import Progress

if TYPE_CHECKING:
    from concurrent.futures import Future

BAD = -1  # length recorded for a row that could not be read
_WORDS = re.compile(r"\w+|[^\w\s]")
FALLBACK_DESCRIPTION = ("no tokenizer given: lengths are regex word pieces (runs of letters/digits and "
                        "single punctuation marks), an approximation of a subword tokenizer's count; "
                        "give a tokenizer (--tokenizer; in a spec, tokenizer:) for exact counts")


@dataclass(frozen=True, kw_only=True)
class LengthRecipe:
    """How one row's length is obtained."""

    text_fields: tuple[str, ...] = ()
    messages_field: str | None = None
    length_field: str | None = None
    length_scale: float = 1.0
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        given = sum(bool(x) for x in (self.text_fields, self.messages_field, self.length_field))
        if given != 1:
            raise TrainfitError("say how long a sample is: give one of a text field, a messages field "
                                "or a length field", "e.g. --text-field text or --length-field duration_s")

    @property
    def fields(self) -> list[str]:
        return list(self.text_fields) or [self.messages_field or self.length_field]  # type: ignore[list-item]

    @property
    def approximate(self) -> bool:
        """Text counted without a tokenizer (regex word pieces), not as training will count it."""
        return not self.length_field and not self.tokenizer

    def describe(self) -> str:
        if self.length_field:
            scale = f" x {self.length_scale:g}" if self.length_scale != 1 else ""
            return f"numeric field {self.length_field!r}{scale}, rounded up to whole positions"
        what = f"chat messages in {self.messages_field!r}" if self.messages_field else \
            f"text in {', '.join(map(repr, self.text_fields))}"
        how = f"tokenized with {self.tokenizer}" if self.tokenizer else FALLBACK_DESCRIPTION
        return f"{what}, {how}"


class _Tokenizer:
    """A uniform ``count(texts) -> lengths`` over tokenizers, transformers or the fallback."""

    def __init__(self, path: str | None, need_chat: bool) -> None:
        self.path = path
        self.fast = None  # tokenizers.Tokenizer
        self.hf = None  # transformers tokenizer, for chat templates
        self.chat_note: str | None = None
        if path is None:
            return
        p = Path(path)
        tok_json = p if p.is_file() else p / "tokenizer.json"
        if tok_json.is_file():
            from tokenizers import Tokenizer

            try:
                self.fast = Tokenizer.from_file(str(tok_json))
            except Exception as err:  # a corrupt or foreign file
                raise TrainfitError(f"cannot load tokenizer {tok_json}: {err}") from None
        if p.is_dir() and (need_chat or self.fast is None):
            from transformers import AutoTokenizer

            try:
                self.hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
            except Exception as err:
                raise TrainfitError(f"cannot load tokenizer folder {p}: {err}",
                                    "give a folder saved with tokenizer.save_pretrained (in a spec, `tokenizer:`; "
                                    "without it, a model folder's own tokenizer is used)") from None
        if self.fast is None and self.hf is None:
            raise TrainfitError(f"{path} is not a tokenizer", "give a tokenizer folder or a tokenizer.json file")
        if need_chat and (self.hf is None or not getattr(self.hf, "chat_template", None)):
            self.chat_note = "the tokenizer has no chat template: messages rendered as 'role: content' lines"

    def count(self, texts: list[str], add_special_tokens: bool = True) -> list[int]:
        if self.fast is not None:
            return [len(e) for e in self.fast.encode_batch(texts, add_special_tokens=add_special_tokens)]
        if self.hf is not None:
            return [len(ids) for ids in self.hf(texts, add_special_tokens=add_special_tokens)["input_ids"]]
        return [len(_WORDS.findall(t)) for t in texts]

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The messages as the chat template renders them; a ValueError (a bad row) where the
        template refuses them (its ``raise_exception``: roles that do not alternate, say)."""
        if self.hf is not None and not self.chat_note:
            from jinja2 import TemplateError

            try:
                # tokenize=False returns the text; transformers annotates the union of every mode's result.
                return self.hf.apply_chat_template(messages, tokenize=False)  # type: ignore[return-value]
            except TemplateError as err:
                raise ValueError(f"the chat template refused the messages: {err}") from None
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


@dataclass
class LengthTable:
    """Per-row lengths of one dataset (``BAD`` where a row was unreadable) and how they were made."""

    lengths: np.ndarray
    description: str
    source: str
    source_fingerprint: str
    approximate: bool = False
    """Counted without a tokenizer (see ``LengthRecipe.approximate``)."""
    bad_rows: int = 0
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    from_cache: bool = False

    @property
    def valid(self) -> np.ndarray:
        return self.lengths[self.lengths != BAD]


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


def estimate_rows(path: Path, fmt: str) -> int | None:
    """Row count for a progress ETA: exact for columnar formats, newline count for line formats."""
    kind = detect_format(path, fmt)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(f).metadata.num_rows for f in data_files(path))
    if kind in ("jsonl", "text", "csv", "tsv"):
        files = data_files(path)
        if any(f.suffix.lower() in COMPRESSED for f in files):
            return None  # counting a compressed file's lines means decompressing it twice
        total = 0
        for file in files:
            n = 0
            with file.open("rb") as f:
                while chunk := f.read(1 << 22):
                    n += chunk.count(b"\n")
            total += max(n - (1 if kind in ("csv", "tsv") else 0), 0)
        return total
    return None


def _row_value(row: dict[str, Any], name: str) -> Any:
    if name in row:
        return row[name]
    raise KeyError(name)


def _null(names: list[str] | tuple[str, ...]) -> ValueError:
    """A present but null field (JSON null, a missing Parquet value) holds no sample: the row is
    bad, not a sample of length 0."""
    return ValueError(f"{', '.join(map(repr, names))} {'is' if len(names) == 1 else 'are'} null")


def bad_row_error(path: Path, bad: dict[str, Any]) -> TrainfitError:
    """The ``on_bad_row='stop'`` error for one bad row (``{"row", "line", "reason"}``, as recorded)."""
    where = f"line {bad['line']}" if bad["line"] is not None else f"row {bad['row']}"
    return TrainfitError(f"{path.name}, {where}: {bad['reason']}",
                         "fix the row, or pass --on-bad-row skip (data.on_bad_row: skip) to count and skip such rows")


def _stop_at_recorded_bad_row(path: Path, on_bad_row: str, bad_examples: list[dict[str, Any]]) -> None:
    """A count cached (or checkpointed) under ``skip`` records its bad rows; under ``stop`` the
    first of them stops the run as counting would have, so the policy needs no cache of its own."""
    if on_bad_row == "stop" and bad_examples:
        raise bad_row_error(path, bad_examples[0])


class _Checkpoint:
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

        with self.lock.open("a") as f:
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
                with self.partial.open("r+b" if self.partial.exists() else "wb") as f:
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


def _batches(rows: Iterator[tuple[int, Any]], size: int) -> Iterator[list[tuple[int, Any]]]:
    batch: list[tuple[int, Any]] = []
    for item in rows:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def count_lengths(
    path: str | Path,
    recipe: LengthRecipe,
    *,
    fmt: str = "auto",
    on_bad_row: str = "stop",
    cache_dir: Path | None = None,
    use_cache: bool = True,
    batch_rows: int = 2000,
    checkpoint_every_s: float = 2.0,
    progress: bool = True,
    on_batch: Callable[[int], None] | None = None,
) -> LengthTable:
    """Length of every row of ``path``; resumes an interrupted count and reuses a finished one.

    Raises:
        TrainfitError: the file is missing or empty, the field does not exist (the message names
            the fields that do), or a row is malformed while ``on_bad_row='stop'``.
    """
    path = Path(path)
    fp = fingerprint(path)  # first: a clear error for a missing file, an empty folder, a pattern matching nothing
    ckpt = _Checkpoint((cache_dir or default_cache_dir()) / _cache_key(path, recipe, fp, fmt))
    if use_cache and (hit := ckpt.load_final()):
        return _cached_table(path, recipe, fp, on_bad_row, *hit)
    count = _start_count(path, recipe, ckpt, fmt=fmt, on_bad_row=on_bad_row, use_cache=use_cache,
                         progress=progress, checkpoint_every_s=checkpoint_every_s, on_batch=on_batch)
    rows = iter_rows(path, fmt, columns=recipe.fields, skip=count.resumed_at)
    _count_batches(count, _batches(rows, batch_rows))
    return _finish_count(count, fp)


def _cache_key(path: Path, recipe: LengthRecipe, fp: str, fmt: str) -> str:
    """The cache folder's name: what the lengths depend on (the file, the tokenizer, the fields, the format)."""
    key_src = json.dumps([fp, _tokenizer_id(recipe.tokenizer), recipe.text_fields, recipe.messages_field,
                          recipe.length_field, recipe.length_scale, detect_format(path, fmt)])
    return hashlib.sha256(key_src.encode()).hexdigest()[:20]


def _cached_table(path: Path, recipe: LengthRecipe, fp: str, on_bad_row: str, cached: np.ndarray,
                  meta: dict[str, Any]) -> LengthTable:
    """A finished count from the cache, under this run's bad-row policy."""
    _stop_at_recorded_bad_row(path, on_bad_row, meta["bad_examples"])
    return LengthTable(lengths=cached, description=recipe.describe(), source=str(path), source_fingerprint=fp,
                       approximate=recipe.approximate, bad_rows=meta["bad_rows"], bad_examples=meta["bad_examples"],
                       notes=meta["notes"], from_cache=True)


@dataclass(kw_only=True)
class _Count:
    """One count under way: how it runs, and what it has counted so far."""

    path: Path
    recipe: LengthRecipe
    on_bad_row: str
    """``stop`` (a bad row raises) or ``skip`` (it is recorded and counted as ``BAD``)."""
    tokenizer: _Tokenizer | None
    """None for a length field."""
    ckpt: _Checkpoint
    use_cache: bool
    """False when asked, or when the cache folder is not writable."""
    checkpoint_every_s: float
    """Seconds between checkpoints of the partial count."""
    on_batch: Callable[[int], None] | None
    """Called with the rows counted so far after each batch."""
    bar: Progress
    resumed_at: int
    """Rows the checkpoint this count resumed from held (0: counted from the start)."""
    lengths: list[int]
    """Every row's length so far, from row 0 (``BAD`` for a bad row)."""
    bad_rows: int
    bad_examples: list[dict[str, Any]]
    """The first 20 bad rows: ``{"row", "line", "reason"}``."""
    notes: list[str]
    last_checkpoint: float
    """``time.perf_counter()`` of the last checkpoint (or of the start)."""


def _start_count(path: Path, recipe: LengthRecipe, ckpt: _Checkpoint, *, fmt: str, on_bad_row: str,
                 use_cache: bool, progress: bool, checkpoint_every_s: float,
                 on_batch: Callable[[int], None] | None) -> _Count:
    """Load the tokenizer and pick the count up where an interrupted one checkpointed (a bad row it
    recorded stops a ``stop`` run, as counting it would have)."""
    tokenizer = None if recipe.length_field else _Tokenizer(recipe.tokenizer, need_chat=bool(recipe.messages_field))
    use_cache = use_cache and ckpt.check_writable()
    done, state = ckpt.load_partial() if use_cache else ([], {})
    _stop_at_recorded_bad_row(path, on_bad_row, state.get("bad_examples", []))
    notes: list[str] = [tokenizer.chat_note] if tokenizer is not None and tokenizer.chat_note else []
    resumed_at = len(done)
    bar = Progress(f"counting {path.name}", total=estimate_rows(path, fmt), enabled=progress, done=resumed_at)
    if resumed_at:
        notes.append(f"resumed an interrupted count at row {resumed_at:,}")
    return _Count(path=path, recipe=recipe, on_bad_row=on_bad_row, tokenizer=tokenizer, ckpt=ckpt,
                  use_cache=use_cache, checkpoint_every_s=checkpoint_every_s, on_batch=on_batch, bar=bar,
                  resumed_at=resumed_at, lengths=done, bad_rows=int(state.get("bad_rows", 0)),
                  bad_examples=list(state.get("bad_examples", [])), notes=notes,
                  last_checkpoint=time.perf_counter())


@dataclass
class _Batch:
    """One batch of rows, parsed; its lengths are known once the tokenizer has counted its texts."""

    lengths: list[int] = field(default_factory=list)
    """One per row: known without a tokenizer (a length field), else ``BAD`` until counted."""
    texts: list[str] = field(default_factory=list)
    """The texts to tokenize."""
    slots: list[int] = field(default_factory=list)
    """For each text, its row's position in ``lengths``."""
    bad: list[dict[str, Any]] = field(default_factory=list)
    """Its bad rows (under ``skip``): ``{"row", "line", "reason"}``."""
    counted: Future[list[int]] | None = None
    """The tokenizer's lengths of ``texts``; None when there are none."""


def _count_batches(count: _Count, batches: Iterator[list[tuple[int, Any]]]) -> None:
    """Count every batch into ``count``, checkpointing as it goes."""
    # Two-stage pipeline: the tokenizer (native code, GIL released, all cores) counts batch k in a
    # worker thread while this thread reads and parses batch k+1.
    from concurrent.futures import ThreadPoolExecutor

    tokenizer = count.tokenizer
    add_special = not count.recipe.messages_field or (tokenizer is not None and tokenizer.chat_note is not None)
    previous: _Batch | None = None
    first = count.resumed_at == 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        for rows in batches:
            batch = _parse_batch(count, rows, first)
            first = False
            if batch.texts:
                batch.counted = pool.submit(tokenizer.count, batch.texts, add_special)  # type: ignore[union-attr]
            if previous is not None:
                _add_batch(count, previous)
            previous = batch
        if previous is not None:
            _add_batch(count, previous)


def _parse_batch(count: _Count, rows: list[tuple[int, Any]], first: bool) -> _Batch:
    """Lengths known without a tokenizer, the texts to tokenize and where they go, bad rows.
    ``first``: the batch starts the dataset, whose first readable row names the fields there are."""
    recipe, batch = count.recipe, _Batch()
    for index, row in rows:
        batch.lengths.append(BAD)
        if isinstance(row, BadRow):
            _bad_row(count, batch, index, row)
            continue
        try:
            if recipe.length_field:
                length, value = _field_length(row, recipe)
                if length < 0:
                    _bad_row(count, batch, index, None, f"negative length {value!r} in {recipe.length_field!r}")
                else:
                    batch.lengths[-1] = length
                continue
            text = _row_text(row, recipe, count.tokenizer)
        except KeyError as err:
            if first:
                raise TrainfitError(f"{count.path.name} has no field {err.args[0]!r}",
                                    f"fields in the first row: {', '.join(map(str, row))}") from None
            _bad_row(count, batch, index, None, f"missing field {err.args[0]!r}")
            continue
        except (TypeError, ValueError) as err:
            _bad_row(count, batch, index, None, str(err))
            continue
        finally:
            first = False
        batch.texts.append(text)
        batch.slots.append(len(batch.lengths) - 1)
    return batch


def _field_length(row: dict[str, Any], recipe: LengthRecipe) -> tuple[int, Any]:
    """A row's length from its numeric field (scaled, rounded up), and the field's value."""
    assert recipe.length_field is not None
    value = _row_value(row, recipe.length_field)
    if value is None:
        raise _null([recipe.length_field])
    return int(np.ceil(float(value) * recipe.length_scale)), value


def _row_text(row: dict[str, Any], recipe: LengthRecipe, tokenizer: _Tokenizer | None) -> str:
    """The text a row's length is counted on: its chat messages rendered, or its text fields joined."""
    if recipe.messages_field:
        messages = _row_value(row, recipe.messages_field)
        if messages is None:
            raise _null([recipe.messages_field])
        _check_messages(recipe.messages_field, messages)
        return tokenizer.render_chat(messages)  # type: ignore[union-attr]
    parts = [_row_value(row, f) for f in recipe.text_fields]
    if all(p is None for p in parts):  # one null part of several joins as empty
        raise _null(recipe.text_fields)
    for name, part in zip(recipe.text_fields, parts, strict=True):
        if part is not None and not isinstance(part, str):  # 42 would count as the text "42"
            raise TypeError(f"{name!r} holds {_shown(part)}, not text")
    return "\n".join(p or "" for p in parts)


def _shown(value: Any) -> str:
    """``int 42``, ``list ['x', 'y']``: a value's type and a short view of it, for a bad row's reason."""
    import reprlib

    return f"{type(value).__name__} {reprlib.repr(value)}"


def _check_messages(name: str, messages: Any) -> None:
    """A messages field must be a list of messages, each an object whose ``content`` is text, a
    list of parts (text and images) or null (a tool call's turn): anything else is a bad row, where
    a string among them crashed the count and a number was rendered as its digits."""
    if not isinstance(messages, list):
        raise TypeError(f"{name!r} is not a list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise TypeError(f"{name!r} item {i} is {_shown(message)}, not a message ({{role, content}})")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise TypeError(f"{name!r} item {i} has content {_shown(content)}, not text, a list of parts or null")


def _bad_row(count: _Count, batch: _Batch, index: int, row: BadRow | None, reason: str | None = None) -> None:
    """Stop at a bad row (``on_bad_row='stop'``), or record it in ``batch``."""
    record = {"row": index, "line": row.line if row is not None else None,
              "reason": reason or (row.reason if row else "unreadable")}
    if count.on_bad_row == "stop":
        raise bad_row_error(count.path, record)
    batch.bad.append(record)


def _add_batch(count: _Count, batch: _Batch) -> None:
    """Append a parsed batch's lengths (waiting for its texts' counts) and bad rows to ``count``;
    report progress, and checkpoint when ``checkpoint_every_s`` has passed."""
    if batch.counted is not None:
        for slot, n in zip(batch.slots, batch.counted.result()):
            batch.lengths[slot] = n
    count.bad_rows += len(batch.bad)
    count.bad_examples.extend(batch.bad[: max(0, 20 - len(count.bad_examples))])
    count.lengths.extend(batch.lengths)
    count.bar.update(len(count.lengths))
    if count.on_batch is not None:
        count.on_batch(len(count.lengths))
    if count.use_cache and time.perf_counter() - count.last_checkpoint >= count.checkpoint_every_s:
        count.ckpt.save_partial(count.lengths, {"rows": len(count.lengths), "bad_rows": count.bad_rows,
                                                "bad_examples": count.bad_examples})
        count.last_checkpoint = time.perf_counter()


def _finish_count(count: _Count, fp: str) -> LengthTable:
    """The finished count as a table, saved as the cache's final count; an error when no row could be read."""
    count.bar.close()
    path, bad_examples = count.path, count.bad_examples
    if not count.lengths:
        raise TrainfitError(f"{path} has no rows", "check the file is the dataset you meant")
    array = np.asarray(count.lengths, dtype=np.int32)
    if (array == BAD).all():
        raise TrainfitError(f"no row of {path.name} could be read ({count.bad_rows} bad rows)",
                            f"first problem: {bad_examples[0]['reason'] if bad_examples else 'unknown'}")
    empty = int(np.count_nonzero(array == 0))
    if empty == int(np.count_nonzero(array != BAD)):
        raise TrainfitError(f"every row of {path.name} is 0 positions long, as read: {count.recipe.describe()}",
                            "check that the field read holds each sample: the spec's data.text_field (or "
                            "messages_field, length_field), analyze's --text-field")
    if empty:
        count.notes.append(f"rows 0 positions long: {empty:,} of them, empty as read ({count.recipe.describe()})")
    if count.use_cache:
        count.ckpt.save_final(array, {"bad_rows": count.bad_rows, "bad_examples": bad_examples,
                                      "notes": [n for n in count.notes if not n.startswith("resumed")]})
    return LengthTable(lengths=array, description=count.recipe.describe(), source=str(path), source_fingerprint=fp,
                       approximate=count.recipe.approximate, bad_rows=count.bad_rows, bad_examples=bad_examples,
                       notes=count.notes)
