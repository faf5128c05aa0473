"""The progress line (tqdm underneath): one line per interval in a log, redrawn in place on a
terminal, silent when disabled."""

from __future__ import annotations

import io

from trainfit.format import format_duration
from trainfit.progress import Progress, progress_words


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_interval_and_the_closing_line() -> None:
    log = io.StringIO()
    bar = Progress("counting d.jsonl", total=5000, stream=log, log_every_s=3600)
    for done in range(0, 5001, 500):
        bar.update(done)
    bar.close("done")
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in log.getvalue()  # no interval passed: the closing line only
    assert lines[0].startswith("counting d.jsonl | 5,000/5,000 rows (100%) | ")
    assert " rows/s, ETA 0s | elapsed 0s | done" in lines[0]

    log = io.StringIO()
    bar = Progress("counting d.jsonl", total=None, stream=log, log_every_s=0)
    for done in (100, 200, 300):
        bar.update(done, note="shard 1")
    bar.close()
    lines = log.getvalue().splitlines()  # interval 0: a first line, one per update, the closing one
    assert len(lines) == 5 and lines[0].startswith("counting d.jsonl | 0 rows, 0 rows/s | elapsed 0s")
    assert lines[1].startswith("counting d.jsonl | 100 rows, ") and lines[1].endswith(" | shard 1")
    assert lines[-1].startswith("counting d.jsonl | 300 rows, ") and "shard" not in lines[-1]


def test_a_terminal_line_is_redrawn_in_place() -> None:
    tty = Terminal()
    bar = Progress("counting d.jsonl", total=1000, stream=tty, done=400)  # resumed at row 400
    bar.update(700)
    bar.close()
    text = tty.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn with \r until it closes
    assert "| 400/1,000 rows (40%) | 0 rows/s, ETA ? |" in text.split("\r")[1]
    assert "| 700/1,000 rows (70%) |" in text.split("\r")[-1]


def test_disabled_prints_nothing() -> None:
    for stream in (io.StringIO(), Terminal()):
        bar = Progress("counting d.jsonl", total=10, stream=stream, enabled=False, log_every_s=0)
        bar.update(5)
        bar.close("done")
        assert stream.getvalue() == ""


def test_a_count_cut_short_leaves_no_line_in_a_log() -> None:
    log = io.StringIO()
    bar = Progress("counting d.jsonl", total=10, stream=log, log_every_s=0)
    bar.update(5)
    before = log.getvalue()
    del bar  # an error ended the count before close(): tqdm clears the line, and a log gets nothing
    import gc

    gc.collect()
    assert log.getvalue() == before and before.splitlines()[-1].startswith("counting d.jsonl | 5/10 rows (50%)")


def test_words() -> None:
    assert progress_words(1200, 5000, "rows", 400.0, 3.0) == "1,200/5,000 rows (24%) | 400 rows/s, ETA 10s | elapsed 3s"
    assert progress_words(6000, 5000, "rows", 0.0, 83.0, "x") == "6,000 rows, 0 rows/s | elapsed 1m23s | x"
    # A slow count keeps its digits: a training loop's 0.17 steps/s once read "0 steps/s" (issue 34).
    assert progress_words(3, 100, "steps", 0.17, 18.0).startswith("3/100 steps (3%) | 0.17 steps/s, ETA 9m31s")
    assert progress_words(3, None, "steps", 2.456, 1.0) == "3 steps, 2.5 steps/s | elapsed 1s"
    assert format_duration(None) == "?" and format_duration(3700) == "1h01m"
