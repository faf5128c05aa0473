"""What the command line leaves for its reader (Hardening 2 review, issue #35): the words of a search
whose every probe failed, said once (console, summary.json and report.html say the same), the
paths summary.json names, which hold from any folder, and output piped into a reader that stops
early (``trainfit ... | head``). Each test failed before its fix; the searches run real probes."""

from __future__ import annotations

import contextlib
import html
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import TESTS, make_spec_file

from trainfit.cli import main


class FailedSearch(NamedTuple):
    folder: Path
    """The run folder, absolute; the search was given it as ``--output out`` from its parent."""
    console: str
    """What the search printed."""
    advice: str
    """summary.json's one ``all_failed.advice``."""


@pytest.fixture(scope="module")
def every_probe_failed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FailedSearch]:
    """One search (real probes) whose every probe fails with the same error, given a relative --output."""
    tmp_path = tmp_path_factory.mktemp("failed")
    spec = make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:broken"}, params={"max_length": 8})
    spec.write_text(spec.read_text() + "search:\n  batch_size: [1, 2]\n")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.chdir(tmp_path)
        assert main(["tune", str(spec), "--output", "out"]) == 1
    folder = (tmp_path / "out").resolve()
    [advice] = json.loads((folder / "summary.json").read_text())["all_failed"]["advice"]
    yield FailedSearch(folder, printed.getvalue(), advice)


@pytest.mark.integration
def test_the_summary_names_the_failed_probe_s_files_by_paths_that_hold_from_any_folder(
        every_probe_failed: FailedSearch) -> None:
    """summary.json's advice named ``probes/trial-0000/result.json``, relative to wherever tune ran:
    wrong for whoever reads the summary from another folder. It names the absolute path now, as the
    summary's other paths (the command's model and data config) do."""
    probe = every_probe_failed.folder / "probes" / "trial-0000"
    assert (probe / "result.json").is_file() and (probe / "probe.log").is_file()
    advice = every_probe_failed.advice
    assert f"the whole message of trial 0: {probe / 'result.json'}" in advice
    assert str(probe / "probe.log") in advice


@pytest.mark.integration
def test_the_console_and_the_page_say_what_the_summary_advises_when_every_probe_failed(
        every_probe_failed: FailedSearch) -> None:
    """The words for "every probe failed with an error" were written three times (the advice in
    summary.json, the console, report.html), and had drifted apart. The console and the page say the
    summary's advice now: the console with the run folder as it was given, the page from its own
    folder (the probes' files beside it)."""
    advice, folder = every_probe_failed.advice, every_probe_failed.folder
    assert advice.startswith("every probe failed with an error (none ran out of memory)")
    assert f"\nNo configuration fits: {advice.replace(str(folder), 'out')}\n" in every_probe_failed.console
    from_page = advice.replace(f"{folder}/", "")
    page = (folder / "report.html").read_text()
    assert f"<b>No configuration fits.</b> {html.escape(from_page[:1].upper() + from_page[1:])}</p>" in page


@pytest.mark.integration
def test_output_closed_by_its_reader_ends_quietly_with_141() -> None:
    """``trainfit env | head`` with the reader gone before trainfit wrote: the broken pipe was caught
    as any OSError (``except OSError`` came first), so it printed "error: [Errno 32] Broken pipe" and
    exited 2. It ends quietly now with 141 (128 + SIGPIPE, what a shell reports for a command a closed
    pipe stopped), and nothing buffered is flushed into the closed pipe at exit."""
    child = subprocess.Popen([sys.executable, "-m", "trainfit", "env"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the only reader: every write of the child now meets a closed pipe
    errors = child.stderr.read()
    assert child.wait(timeout=120) == 141, errors
    assert "Broken pipe" not in errors and "BrokenPipeError" not in errors and "error" not in errors.lower(), errors


def test_full_fine_tuning_is_said_where_lora_r_is_none() -> None:
    """Issue 50: `lora_r=—` read as a missing value; None is a choice, full fine-tuning."""
    from trainfit.format import values_line

    assert values_line({"batch_size": 4, "lora_r": None}) == "batch_size=4 lora_r=None (full fine-tuning)"
    assert values_line({"lora_r": 8, "dropout": None}) == "lora_r=8 dropout=None"
