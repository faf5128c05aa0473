"""Count every sample's length (tokens, or a numeric field) with caching and resume.

The count is the expensive pass over a dataset. It streams rows in batches, tokenizes each batch
with the fast tokenizer (which uses all cores), checkpoints to a cache folder every few seconds
and, when interrupted and run again, continues from the last checkpoint. A finished count is
keyed by (file fingerprint, tokenizer, fields), so a repeat is instant.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainfit.data.length_cache import Checkpoint, cache_key, default_cache_dir
from trainfit.data.readers import BadRow, detect_format, fingerprint, iter_rows
from trainfit.data.row_length import BAD, LengthRecipe, Tokenizer, field_length, row_text
from trainfit.data_paths import COMPRESSED, data_files
from trainfit.errors import TrainfitError
from trainfit.progress import Progress

if TYPE_CHECKING:
    from concurrent.futures import Future


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
    parts: dict[str, np.ndarray] = field(default_factory=dict)
    """Text and audio both (``LengthRecipe.combined``): each row's ``text`` tokens and ``audio``
    frames (``BAD`` where that part could not be read), of which ``lengths`` is made."""

    @property
    def valid(self) -> np.ndarray:
        return self.lengths[self.lengths != BAD]


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
    if recipe.combined:
        parts = {name: count_lengths(path, part, fmt=fmt, on_bad_row=on_bad_row, cache_dir=cache_dir,
                                     use_cache=use_cache, batch_rows=batch_rows, checkpoint_every_s=checkpoint_every_s,
                                     progress=progress, on_batch=on_batch)
                 for name, part in recipe.parts().items()}
        return combined_table(recipe, parts)
    if recipe.audio_field and recipe.audio_root is None:  # a manifest's relative paths start at its folder
        recipe = dataclasses.replace(recipe, audio_root=str((path if path.is_dir() else path.parent).resolve()))
    ckpt = Checkpoint((cache_dir or default_cache_dir()) / cache_key(path, recipe, fp, fmt))
    if use_cache and (hit := ckpt.load_final()):
        return _cached_table(path, recipe, fp, on_bad_row, *hit)
    count = _start_count(path, recipe, ckpt, fmt=fmt, on_bad_row=on_bad_row, use_cache=use_cache,
                         progress=progress, checkpoint_every_s=checkpoint_every_s, on_batch=on_batch)
    rows = iter_rows(path, fmt, columns=recipe.fields, skip=count.resumed_at)
    _count_batches(count, _batches(rows, batch_rows))
    return _finish_count(count, fp)


def combined_table(recipe: LengthRecipe, parts: dict[str, LengthTable]) -> LengthTable:
    """One table of the text and audio counts of the same rows, each row's length made of its two
    as ``recipe.length_by`` says (``BAD`` where either part is)."""
    text, audio = parts["text"].lengths.astype(np.int64), parts["audio"].lengths.astype(np.int64)
    made = {"sum": text + audio, "max": np.maximum(text, audio), "text": text, "audio": audio}[recipe.length_by]
    lengths = np.where((text == BAD) | (audio == BAD), BAD, made).astype(np.int32)
    bad = [e for t in parts.values() for e in t.bad_examples]
    return LengthTable(lengths=lengths, description=recipe.describe(), source=parts["text"].source,
                       source_fingerprint=parts["text"].source_fingerprint, approximate=recipe.approximate,
                       bad_rows=int(np.count_nonzero(lengths == BAD)), bad_examples=bad[:20],
                       notes=[n for t in parts.values() for n in t.notes],
                       from_cache=all(t.from_cache for t in parts.values()),
                       parts={name: t.lengths for name, t in parts.items()})


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
    tokenizer: Tokenizer | None
    """None for a length field."""
    ckpt: Checkpoint
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


def _start_count(path: Path, recipe: LengthRecipe, ckpt: Checkpoint, *, fmt: str, on_bad_row: str,
                 use_cache: bool, progress: bool, checkpoint_every_s: float,
                 on_batch: Callable[[int], None] | None) -> _Count:
    """Load the tokenizer and pick the count up where an interrupted one checkpointed (a bad row it
    recorded stops a ``stop`` run, as counting it would have)."""
    tokenizer = None if recipe.counted else Tokenizer(recipe.tokenizer, need_chat=bool(recipe.messages_field))
    use_cache = use_cache and ckpt.check_writable()
    done, state = ckpt.load_partial() if use_cache else ([], {})
    _stop_at_recorded_bad_row(path, on_bad_row, state.get("bad_examples", []))
    notes: list[str] = [tokenizer.chat_note] if tokenizer is not None and tokenizer.chat_note else []
    resumed_at = len(done)
    bar = Progress(f"counting {path.name}", total=estimate_rows(path, fmt), enabled=progress, done=resumed_at)
    if resumed_at:
        notes.append(f"resumed an interrupted count at row {resumed_at:,}")
    if recipe.audio_field and recipe.length_scale == 1:
        notes.append("audio lengths are in seconds (length_scale 1): give the frames a second your model makes of "
                     "them (--frames-per-second; in a spec, data.length_scale)")
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
    add_special = tokenizer is None or tokenizer.adds_special_tokens(count.recipe)
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
            if recipe.counted:
                length, value = field_length(row, recipe)
                if length < 0:
                    _bad_row(count, batch, index, None, f"negative length {value!r} in {recipe.fields[0]!r}")
                else:
                    batch.lengths[-1] = length
                continue
            text = row_text(row, recipe, count.tokenizer)
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

