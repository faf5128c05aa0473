"""Stream rows out of dataset files, one at a time, in bounded memory.

Every reader yields ``(row_index, row)`` where ``row`` is a dict (or a :class:`BadRow` for a line
that could not be parsed), so callers can report exact positions and apply their own policy.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainfit.data_paths import COMPRESSED, SUFFIXES, data_files, data_suffix, is_hf_folder
from trainfit.errors import TrainfitError

FORMATS = ("jsonl", "json", "csv", "tsv", "parquet", "text", "hf")
def _open(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed on the fly when it is compressed."""
    suffix = path.suffix.lower()
    if suffix == ".gz":
        import gzip

        # typeshed types GzipFile as a BufferedIOBase only (bz2's and lzma's files are IO[bytes] there).
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if suffix == ".bz2":
        import bz2

        return bz2.open(path, "rb")
    if suffix == ".xz":
        import lzma

        return lzma.open(path, "rb")
    return path.open("rb")


@dataclass(frozen=True)
class BadRow:
    """A row that could not be read; ``line`` is 1-based in the file where that makes sense."""

    line: int | None
    reason: str


def detect_format(path: Path, fmt: str = "auto") -> str:
    """The reader to use for ``path`` (a file, shards or a pattern, see :func:`data_files`);
    ``fmt`` other than auto wins."""
    if fmt != "auto":
        return fmt
    if is_hf_folder(Path(path)):
        return "hf"
    kinds = {f: _file_format(f) for f in data_files(path)}
    if len(set(kinds.values())) > 1:
        mixed = ", ".join(f"{f.name} is {k}" for f, k in list(kinds.items())[:4])
        raise TrainfitError(f"{path} mixes formats: {mixed}",
                            "keep one format per dataset, or point at one kind (e.g. a *.parquet pattern)")
    return next(iter(kinds.values()))


def _file_format(path: Path) -> str:
    suffix = data_suffix(path)
    if suffix == ".parquet" and path.suffix.lower() in COMPRESSED:
        raise TrainfitError(f"{path.name}: Parquet compresses itself", "decompress the file")
    if suffix == ".json":
        # A .json file may still be JSON lines: peek at the first non-blank character.
        with _open(path) as f:
            head = f.read(4096).lstrip()
        return "json" if head.startswith(b"[") else "jsonl"
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    raise TrainfitError(f"cannot tell the format of {path.name}",
                        f"pass --format (one of {', '.join(FORMATS)})")


def _json_problem(err: json.JSONDecodeError) -> str:
    """What is wrong, without the dangling "at" that ends some of Python's messages ("Unterminated
    string starting at", "Invalid control character at"): callers say where themselves."""
    return err.msg.removesuffix(" at").removesuffix(" starting")


def _jsonl(path: Path, skip: int = 0) -> Iterator[tuple[int, Any]]:
    with _open(path) as f:
        index = 0
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            if index < skip:  # resuming: these rows are counted already, do not even parse them
                index += 1
                continue
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):  # what some editors write first; json refuses it
                yield index, BadRow(1, "starts with a UTF-8 byte-order mark (BOM), which JSON readers refuse: save "
                                       "the file as UTF-8 without one (e.g. sed -i '1s/^\\xEF\\xBB\\xBF//' FILE)")
                index += 1
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as err:
                row = BadRow(line_no, f"not UTF-8 ({err.reason} at byte {err.start})")
            except json.JSONDecodeError as err:
                row = BadRow(line_no, f"invalid JSON ({_json_problem(err)} at column {err.colno})")
            else:
                if not isinstance(row, dict):
                    row = BadRow(line_no, f"expected a JSON object, got {type(row).__name__}")
            yield index, row
            index += 1


def _json_array(path: Path, chunk_size: int = 1 << 20) -> Iterator[tuple[int, Any]]:
    """Stream the elements of a top-level JSON array without loading the whole file."""
    decoder = json.JSONDecoder()
    with io.TextIOWrapper(_open(path), encoding="utf-8", errors="strict") as f:
        buf, pos, index, started = "", 0, 0, False
        eof = False
        while True:
            # Skip separators; refill the buffer when it runs low.
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    pos += 1
                if pos < len(buf) or eof:
                    break
                try:
                    more = f.read(chunk_size)
                except UnicodeDecodeError as err:
                    raise TrainfitError(f"{path} is not UTF-8 ({err.reason})",
                                        "re-encode the file as UTF-8") from None
                buf, pos, eof = buf[pos:] + more, 0, not more
            if pos >= len(buf):
                if not started:
                    return
                raise TrainfitError(f"{path}: the JSON array is not closed", "check the end of the file")
            if not started:
                if buf[pos] != "[":
                    raise TrainfitError(f"{path} is not a JSON array", "use JSON lines or an array of objects")
                started, pos = True, pos + 1
                continue
            if buf[pos] == "]":
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as err:
                if eof:
                    raise TrainfitError(f"{path}: invalid JSON near element {index} ({_json_problem(err)})",
                                        "fix that element (or convert the file to JSON lines, where "
                                        "--on-bad-row skip passes over a broken row)") from None
                more = f.read(chunk_size)
                buf, pos, eof = buf[pos:] + more, 0, not more
                continue
            if end == len(buf) and not eof:  # a number may continue in the next chunk
                more = f.read(chunk_size)
                buf, pos, eof = buf[pos:] + more, 0, not more
                continue
            pos = end
            yield index, obj if isinstance(obj, dict) else BadRow(None, f"element {index} is not an object")
            index += 1


def _delimited(path: Path, delimiter: str) -> Iterator[tuple[int, Any]]:
    with _open(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="")
        reader = csv.DictReader(text, delimiter=delimiter)
        index = 0
        row: dict[str, Any] | BadRow
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError as err:
                raise TrainfitError(f"{path} is not UTF-8 near line {reader.line_num + 1} ({err.reason})",
                                    "re-encode the file as UTF-8") from None
            except csv.Error as err:
                row = BadRow(reader.line_num, f"malformed row ({err})")
            else:
                if None in row:
                    row = BadRow(reader.line_num, "more values than header columns")
            yield index, row
            index += 1


def _text(path: Path, skip: int = 0) -> Iterator[tuple[int, Any]]:
    with _open(path) as f:
        for index, raw in enumerate(f):
            if index < skip:
                continue
            try:
                yield index, {"text": raw.decode("utf-8").rstrip("\r\n")}
            except UnicodeDecodeError as err:
                yield index, BadRow(index + 1, f"not UTF-8 ({err.reason} at byte {err.start})")


def _record_batches(batches: Iterator[Any]) -> Iterator[tuple[int, Any]]:
    index = 0
    for batch in batches:
        for row in batch.to_pylist():
            yield index, row
            index += 1


def _parquet(path: Path, columns: list[str] | None) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    cols = [c for c in columns if c in names] if columns else None
    return _record_batches(pf.iter_batches(batch_size=4096, columns=cols or None))


def _hf_arrow_files(path: Path) -> list[Path]:
    state = path / "state.json"
    if state.exists():
        files = [path / d["filename"] for d in json.loads(state.read_text()).get("_data_files", [])]
        if files:
            return files
    files = sorted(path.glob("*.arrow"))
    if not files:
        raise TrainfitError(f"{path} holds no .arrow files", "save the dataset with Dataset.save_to_disk")
    return files


def _hf(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa

    def batches() -> Iterator[Any]:
        for file in _hf_arrow_files(path):
            with pa.memory_map(str(file)) as source:
                try:
                    reader = pa.ipc.open_stream(source)
                except pa.ArrowInvalid:
                    reader = pa.ipc.open_file(source)
                    yield from (reader.get_batch(i) for i in range(reader.num_record_batches))
                    continue
                yield from reader

    return _record_batches(batches())


def iter_rows(path: str | Path, fmt: str = "auto", columns: list[str] | None = None,
              skip: int = 0) -> Iterator[tuple[int, Any]]:
    """Yield ``(row_index, row)`` for every row; ``row`` is a dict or a :class:`BadRow`.

    ``columns`` is a hint: columnar formats read only those columns. ``skip`` rows are passed
    over (line formats without parsing them); indices stay those of the whole file.
    """
    kind = detect_format(Path(path), fmt)
    files = data_files(path)
    if len(files) == 1:
        return _file_rows(files[0], kind, columns, skip)

    def shards() -> Iterator[tuple[int, Any]]:  # one index over all files, in order
        offset = 0
        for file in files:
            last = -1
            for i, row in _file_rows(file, kind, columns, 0):
                last = i
                yield offset + i, row
            offset += last + 1

    return ((i, row) for i, row in shards() if i >= skip) if skip else shards()


def _file_rows(path: Path, kind: str, columns: list[str] | None, skip: int) -> Iterator[tuple[int, Any]]:
    if kind == "jsonl":
        return _jsonl(path, skip)
    if kind == "text":
        return _text(path, skip)
    if kind == "json":
        rows = _json_array(path)
    elif kind in ("csv", "tsv"):
        rows = _delimited(path, "," if kind == "csv" else "\t")
    elif kind == "parquet":
        rows = _parquet(path, columns)
    elif kind == "hf":
        rows = _hf(path)
    else:
        raise TrainfitError(f"unknown format {kind!r}", f"use one of {', '.join(FORMATS)}")
    return ((i, row) for i, row in rows if i >= skip) if skip else rows


def fingerprint(path: str | Path, *, times: bool = True) -> str:
    """Identity of a dataset's content: size and the bytes at both ends, plus the modification
    time (``times``: what the length cache keys on, cheap and strict), or instead of the time 16
    blocks spread through each file (a study's data check: a copy or a ``touch`` is the same data).
    Every read is bounded (a file that grows meanwhile is read no further than its blocks)."""
    import hashlib

    files: list[Path] = []
    for f in data_files(path):
        files += sorted(p for p in f.rglob("*") if p.is_file()) if f.is_dir() else [f]
    h = hashlib.sha256()
    block = 1 << 16
    for p in files:
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns if times else ''}".encode())
        with p.open("rb") as fh:
            if st.st_size <= 2 * block:
                h.update(fh.read(2 * block))
                continue
            h.update(fh.read(block))
            for offset in [] if times else [st.st_size * i // 17 for i in range(1, 17)]:
                fh.seek(offset)
                h.update(fh.read(4096))
            fh.seek(-block, 2)
            h.update(fh.read(block))
    return h.hexdigest()[:16]
