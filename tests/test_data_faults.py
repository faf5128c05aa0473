"""Faults of the length count found from outside: the bad-row policy and the cache, concurrent
interrupted counts, null texts, JSON error wording, a torn cache. Real files and processes; each
case failed before its fix."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_texts

from trainfit.cli import main
from trainfit.data import LengthRecipe, count_lengths
from trainfit.data.row_length import BAD
from trainfit.errors import TrainfitError

WORDS = LengthRecipe(text_fields=("text",))  # the fallback count: one per word here


def write_rows(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\n" for r in rows))
    return path


def test_a_stop_run_stops_at_the_bad_row_a_skip_run_cached(tmp_path: Path, capsys) -> None:
    path = write_rows(tmp_path / "d.jsonl", ['{"text": "a b"}', '{"text": broken', '{"text": "c"}'])
    cache = tmp_path / "cache"
    skipped = count_lengths(path, WORDS, on_bad_row="skip", cache_dir=cache, progress=False)
    assert skipped.lengths.tolist() == [2, BAD, 1]
    with pytest.raises(TrainfitError, match=r"d.jsonl, line 2: invalid JSON") as info:
        count_lengths(path, WORDS, cache_dir=cache, progress=False)  # the default policy: stop
    assert "--on-bad-row skip" in str(info.value)
    again = count_lengths(path, WORDS, on_bad_row="skip", cache_dir=cache, progress=False)
    assert again.from_cache and again.lengths.tolist() == [2, BAD, 1]  # the skip count is kept

    # The same through the CLI: a one-line error and status 2, after a skip run cached the count.
    assert main(["analyze", str(path), "--text-field", "text", "--on-bad-row", "skip", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(path), "--text-field", "text", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainfit analyze: error: d.jsonl, line 2: invalid JSON") and "Traceback" not in err


def test_a_stop_run_stops_at_a_bad_row_in_an_interrupted_skip_count(tmp_path: Path) -> None:
    rows = [json.dumps({"text": "w " * (i % 5 + 1)}) for i in range(3000)]
    rows[700] = '{"text": broken'
    path = write_rows(tmp_path / "d.jsonl", rows)
    cache = tmp_path / "cache"

    def stop(rows_done: int) -> None:
        if rows_done >= 2000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # checkpointed past the bad row under skip
        count_lengths(path, WORDS, on_bad_row="skip", cache_dir=cache, batch_rows=500, checkpoint_every_s=0,
                      progress=False, on_batch=stop)
    with pytest.raises(TrainfitError, match=r"d.jsonl, line 701: invalid JSON"):
        count_lengths(path, WORDS, cache_dir=cache, batch_rows=500, progress=False)
    resumed = count_lengths(path, WORDS, on_bad_row="skip", cache_dir=cache, batch_rows=500, progress=False)
    assert any("resumed" in n for n in resumed.notes)  # the stop run kept the partial count
    assert resumed.lengths.tolist() == count_lengths(path, WORDS, on_bad_row="skip", use_cache=False,
                                                     progress=False).lengths.tolist()


CHILD = """
import sys, time
from pathlib import Path
from trainfit.data.row_length import LengthRecipe
from trainfit.data.lengths import count_lengths

data, cache, signals, name = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
pauses = {int(x) for x in sys.argv[5].split(",")}

def hook(rows_done):
    if rows_done in pauses:  # say where this count is, then wait for the test's go-ahead (or a signal)
        (signals / f"{name}-at-{rows_done}").touch()
        while not (signals / f"go-{name}-{rows_done}").exists():
            time.sleep(0.01)

count_lengths(data, LengthRecipe(text_fields=("text",)), cache_dir=cache, batch_rows=500, checkpoint_every_s=0,
              progress=False, on_batch=hook)
"""


def test_two_interrupted_concurrent_counts_leave_the_right_lengths(tmp_path: Path) -> None:
    """Two processes count one dataset from the start; the one behind checkpoints after the one
    ahead did; both are interrupted (Ctrl-C and kill). The partial count they leave must hold the
    right lengths: before the fix the one behind truncated the shared file at its own position and
    the one ahead then wrote past a hole of zero lengths."""
    path = tmp_path / "d.jsonl"
    counts = write_texts(path, n=8000)
    cache, signals = tmp_path / "cache", tmp_path / "signals"
    signals.mkdir()

    def start(name: str, pauses: str) -> subprocess.Popen:
        # Ctrl-C as a terminal delivers it: a run started in the background (`nohup ... &`) inherits SIGINT ignored.
        return subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(cache), str(signals), name, pauses],
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def reached(name: str, rows: int, *others: subprocess.Popen) -> None:
        deadline = time.monotonic() + 120  # a hang guard only
        while not (signals / f"{name}-at-{rows}").exists():
            for p in others:
                assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, f"{name} never reached row {rows}"
            time.sleep(0.01)

    behind = start("behind", "500,1000")
    ahead = None
    try:
        reached("behind", 500, behind)  # counted 500 rows, not checkpointed yet
        ahead = start("ahead", "6000,6500")
        reached("ahead", 6000, behind, ahead)  # checkpointed up to 5,500
        (signals / "go-behind-500").touch()
        reached("behind", 1000, behind, ahead)  # checkpointed (or not) its 500
        (signals / "go-ahead-6000").touch()
        reached("ahead", 6500, behind, ahead)  # checkpointed up to 6,000
        behind.send_signal(signal.SIGINT)
        ahead.kill()
        assert behind.wait(60) != 0 and ahead.wait(60) != 0
    finally:
        for p in (behind, ahead):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

    table = count_lengths(path, WORDS, cache_dir=cache, progress=False)
    assert any("resumed" in n for n in table.notes)  # the partial count was used, not thrown away
    assert table.lengths.tolist() == counts
    assert count_lengths(path, WORDS, use_cache=False, progress=False).lengths.tolist() == counts


def test_null_text_is_a_bad_row_not_an_empty_sample(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "d.jsonl", ['{"text": "a b"}', '{"text": null}', '{"text": ""}'])
    with pytest.raises(TrainfitError, match=r"d.jsonl, row 1: 'text' is null") as info:
        count_lengths(path, WORDS, progress=False)
    assert "--on-bad-row skip" in str(info.value)
    table = count_lengths(path, WORDS, on_bad_row="skip", progress=False)
    assert table.lengths.tolist() == [2, BAD, 0]  # an empty string is a real, empty sample
    assert table.bad_rows == 1 and table.bad_examples[0]["reason"] == "'text' is null"

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"q": ["a b", None, None], "a": ["c", "d e", None]}), tmp_path / "d.parquet")
    joined = count_lengths(tmp_path / "d.parquet", LengthRecipe(text_fields=("q", "a")), on_bad_row="skip",
                           progress=False)
    assert joined.lengths.tolist() == [3, 2, BAD]  # one null part of several joins as empty; all null is bad
    assert joined.bad_examples[0]["reason"] == "'q', 'a' are null"
    durations = write_rows(tmp_path / "m.jsonl", ['{"duration_s": 1.5}', '{"duration_s": null}'])
    with pytest.raises(TrainfitError, match=r"row 1: 'duration_s' is null"):
        count_lengths(durations, LengthRecipe(length_field="duration_s"), progress=False)


def test_invalid_json_messages_read_cleanly(tmp_path: Path) -> None:
    """Python's JSON messages end in "at" ("Unterminated string starting at"): said once, with the column."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a b"}\n{"text": "unterminated')  # the last line has no newline
    with pytest.raises(TrainfitError) as info:
        count_lengths(path, WORDS, progress=False)
    assert "line 2: invalid JSON (Unterminated string at column 10)" in str(info.value)  # was "starting at at"
    path.write_text('{"text": "a b"}\n{"text": "tab\there"}\n')
    with pytest.raises(TrainfitError) as info:
        count_lengths(path, WORDS, progress=False)
    assert "line 2: invalid JSON (Invalid control character at column 14)" in str(info.value)
    array = tmp_path / "d.json"
    array.write_text('[{"text": "a b"}, {"text": "unterminated')
    with pytest.raises(TrainfitError) as info:
        count_lengths(array, WORDS, progress=False)
    assert "invalid JSON near element 1 (Unterminated string)" in str(info.value)  # was a dangling "at"


def test_a_torn_cache_file_is_counted_again_not_a_crash(tmp_path: Path) -> None:
    """Caches written before the counts were made safe for concurrent writers may be torn."""
    path = write_rows(tmp_path / "d.jsonl", ['{"text": "a b"}', '{"text": "c"}'])
    cache = tmp_path / "cache"
    count_lengths(path, WORDS, cache_dir=cache, progress=False)
    (final,) = cache.glob("*/lengths.npy")
    final.write_bytes(final.read_bytes()[:20])
    again = count_lengths(path, WORDS, cache_dir=cache, progress=False)
    assert again.lengths.tolist() == [2, 1] and not again.from_cache
    assert count_lengths(path, WORDS, cache_dir=cache, progress=False).from_cache  # and cached again
