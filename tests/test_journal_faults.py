"""Faults found from outside (Hardening 2, issue #35) in the study journal, the tune loop and its
reports: a journal record of the wrong type, an emptied journal, a lost line, a refused write, and
a search whose every probe fails with an error. Each test failed before its fix. The probes are the
deterministic ``Surface`` of tune_helpers (the search logic is under test, not the probe) but for
the error report's, which is a real probe; every journal is a real file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TESTS, make_spec_file
from tune_helpers import Surface, synthetic_spec

from trainfit.cli import main
from trainfit.cli.tune_render import TuneView
from trainfit.errors import TrainfitError
from trainfit.search.events import TrialsLost, TuneEvent
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune
from trainfit.tune import tune


def tuned(tmp_path: Path, trials: int = 3) -> tuple[Any, Path]:
    """A spec and its output folder's journal after a real short tune: ``trials`` measured."""
    spec = synthetic_spec(tmp_path, "grid")
    tune(with_tune(spec, max_trials=trials), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    return spec, tmp_path / "out" / "study.journal"


def entries(journal: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in journal.read_text().splitlines()]


def write_entries(journal: Path, logs: list[dict[str, Any]]) -> None:
    journal.write_text("".join(json.dumps(e) + "\n" for e in logs))


def attr_line(logs: list[dict[str, Any]], trial_id: int, attr: str) -> int:
    """The index of the last entry that set trial ``trial_id``'s user attr ``attr`` (``values`` is set
    when the trial is asked for and again when it is told: the last is what it holds)."""
    return [i for i, e in enumerate(logs) if e.get("trial_id") == trial_id and attr in e.get("user_attr", {})][-1]


def resumed(spec: Any, tmp_path: Path, capsys: Any, max_trials: int = 3) -> tuple[Any, Surface, list[TuneEvent], str]:
    """The study resumed, with the events, the probes made and what the terminal showed."""
    events: list[TuneEvent] = []
    view = TuneView(False, "samples_per_second")
    surface = Surface()

    def on_event(event: TuneEvent) -> None:
        events.append(event)
        view(event)

    result = tune(with_tune(spec, max_trials=max_trials), TuneOptions(output=tmp_path / "out", probe_fn=surface,
                                                                      resume=True, on_event=on_event))
    return result, surface, events, capsys.readouterr().err


# -- item 1: a journal record of valid JSON but the wrong type ----------------------------------

@pytest.mark.parametrize("attr, value, reason", [
    ("measurement", "garbage", "measurement: the str 'garbage' where a JSON object belongs"),
    ("measurement", {"schema_version": 1, "status": "ok", "config": {}, "peak_memory_bytes": "lots"},
     "measurement.peak_memory_bytes: the str 'lots' where an integer belongs"),
    ("values", [1, 2], "values: the list [1, 2] where a JSON object belongs"),
    ("objective", "fast", "objective: the str 'fast' where a number belongs"),
    ("objective", float("nan"), "objective: NaN is not a finite number"),
])
def test_a_journal_record_of_the_wrong_type_is_left_out_with_a_warning_naming_it(
        tmp_path: Path, capsys: Any, attr: str, value: Any, reason: str) -> None:
    """A trial whose stored measurement (or values, or objective) is valid JSON of the wrong type
    was an AttributeError traceback (or a TypeError deep in the ranking): now the trial is left out,
    a warning names the journal, the trial and what is wrong, and its config is probed again."""
    spec, journal = tuned(tmp_path)
    logs = entries(journal)
    logs[attr_line(logs, 1, attr)]["user_attr"][attr] = value
    write_entries(journal, logs)
    result, surface, events, err = resumed(spec, tmp_path, capsys)
    [lost] = [e for e in events if isinstance(e, TrialsLost)]
    assert lost.storage == str(journal) and list(lost.trials) == [1] and reason in lost.trials[1]
    assert f"warning: {journal}" in err and f"trial 1 ({reason}" in err
    assert len(surface.calls) == 1 and result.summary.total_tested == 3  # that config, probed again


@pytest.mark.parametrize("key, value, reason", [
    ("samples_per_second", -50.0, "measurement.samples_per_second: -50 is below 0"),
    ("tokens_per_second", float("nan"), "measurement.tokens_per_second: NaN is not a finite number"),
    ("expected_step_time_s", float("inf"), "measurement.expected_step_time_s: Infinity is not a finite number"),
])
def test_a_measured_figure_below_0_or_no_number_is_left_out_as_plan_leaves_it_out(
        tmp_path: Path, capsys: Any, key: str, value: Any, reason: str) -> None:
    """A stored speed of -50 or NaN passed tune's check (only its type was checked), so tune ranked
    the trial while plan refused it. Both read a measurement by one check now: tune leaves it out,
    names it, and probes its config again."""
    spec, journal = tuned(tmp_path)
    logs = entries(journal)
    logs[attr_line(logs, 1, "measurement")]["user_attr"]["measurement"][key] = value
    write_entries(journal, logs)
    result, surface, events, err = resumed(spec, tmp_path, capsys)
    [lost] = [e for e in events if isinstance(e, TrialsLost)]
    assert dict(lost.trials) == {1: reason} and f"trial 1 ({reason})" in err
    assert len(surface.calls) == 1 and result.summary.total_tested == 3
    assert 1 not in {t.number for t in result.trials}  # not ranked


@pytest.mark.parametrize("damage", ["a record of the wrong type", "a lost line"])
def test_a_lost_trial_is_named_once_not_on_every_later_resume(tmp_path: Path, capsys: Any, damage: str) -> None:
    """A damaged record stays in the journal (a finished trial cannot change), so every later resume
    named it again, "and are probed again", though its config was measured again by the first. A
    lost trial is named until its config is measured again, and not after."""
    spec, journal = tuned(tmp_path)
    logs = entries(journal)
    if damage == "a lost line":
        del logs[attr_line(logs, 1, "measurement")]
    else:
        logs[attr_line(logs, 1, "measurement")]["user_attr"]["measurement"]["samples_per_second"] = "fast"
    write_entries(journal, logs)
    _, surface, events, _ = resumed(spec, tmp_path, capsys)
    assert [list(e.trials) for e in events if isinstance(e, TrialsLost)] == [[1]] and len(surface.calls) == 1
    result, surface, events, err = resumed(spec, tmp_path, capsys)
    assert not [e for e in events if isinstance(e, TrialsLost)] and "lacks the records" not in err
    assert not surface.calls and result.summary.total_tested == 3


# -- item 2: an emptied journal ------------------------------------------------------------------

def test_an_emptied_journal_is_begun_again_with_resume_and_said_so_without(tmp_path: Path, capsys: Any) -> None:
    """A 0-byte journal beside the results of its study sent the user in a circle (--resume: "drop
    --resume"; without: "use --output NEW_FOLDER"). Without --resume the refusal now says the journal
    is empty and that --resume begins the study again there; --resume does, naming the trials of
    trials.csv it probes again."""
    spec, journal = tuned(tmp_path)
    journal.write_bytes(b"")
    with pytest.raises(TrainfitError, match="study.journal is empty") as info:
        tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    assert "pass --resume to begin it again there" in str(info.value)
    result, surface, events, err = resumed(spec, tmp_path, capsys)
    [lost] = [e for e in events if isinstance(e, TrialsLost)]
    assert list(lost.trials) == [0, 1, 2] and "in trials.csv, not in the journal" in lost.trials[0]
    assert len(surface.calls) == 3 and result.summary.total_tested == 3 and "trial 0 (" in err


# -- item 3: a lost line of the journal ----------------------------------------------------------

@pytest.mark.parametrize("line", ["its measurement", "its creation"])
def test_a_deleted_middle_line_of_the_journal_says_which_trial_is_lost(
        tmp_path: Path, capsys: Any, line: str) -> None:
    """A journal line deleted mid-file lost a trial in silence (its measurement: the trial read as
    never measured; its creation: every later trial's entries then miss their trial). The trials
    that trials.csv shows and the journal lacks are now named, and probed again."""
    spec, journal = tuned(tmp_path)
    logs = entries(journal)
    if line == "its measurement":
        del logs[attr_line(logs, 1, "measurement")]
    else:
        del logs[[i for i, e in enumerate(logs) if e["op_code"] == 4][1]]  # CREATE_TRIAL of trial 1
    write_entries(journal, logs)
    result, surface, events, err = resumed(spec, tmp_path, capsys)
    [lost] = [e for e in events if isinstance(e, TrialsLost)]
    assert list(lost.trials) == ([1] if line == "its measurement" else [1, 2])
    assert "in trials.csv, not in the journal" in lost.trials[1] and "probed again" in err
    assert result.summary.total_tested == 3 and len(surface.calls) == len(lost.trials)


def test_an_intact_journal_reports_no_lost_trial(tmp_path: Path) -> None:
    """The guard on the check above: a resumed study whose journal is whole names nothing."""
    spec, _ = tuned(tmp_path)
    events: list[TuneEvent] = []
    tune(with_tune(spec, max_trials=4), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True,
                                                    on_event=events.append))
    assert not [e for e in events if isinstance(e, TrialsLost)]


# -- item 4: a refused write names its file ------------------------------------------------------

JOURNAL_REFUSED = """
import resource, sys
sys.path.insert(0, {tests!r})
from tune_helpers import Surface
from trainfit.errors import os_error
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec, with_tune
from trainfit.tune import tune

journal = {journal!r}

class Filling(Surface):
    def __call__(self, p, number):
        if number == 1:  # from now on the journal cannot grow: its next append is refused
            import os
            resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(journal), resource.RLIM_INFINITY))
        return super().__call__(p, number)

try:
    tune(with_tune(load_spec({spec!r}), max_trials=3), TuneOptions(output={out!r}, probe_fn=Filling()))
except OSError as err:
    print(os_error(err))
    sys.exit(2)
"""


@pytest.mark.integration
def test_a_refused_journal_write_names_the_journal(tmp_path: Path) -> None:
    """The kernel refusing the journal's append (a full disk; here the file-size limit, which the
    kernel enforces on the same write) gave a message naming no file: Optuna's append has no file
    name in its OSError. It names the journal now, and the run resumes with the trial before it."""
    spec = synthetic_spec(tmp_path, "grid")
    out = tmp_path / "out"
    script = JOURNAL_REFUSED.format(tests=str(TESTS), journal=str(out / "study.journal"), spec=str(spec.source),
                                    out=str(out))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stdout.strip() == f"File too large ({out / 'study.journal'})"
    result = tune(with_tune(spec, max_trials=3), TuneOptions(output=out, probe_fn=Surface(), resume=True))
    assert result.summary.total_tested == 3 and result.new_trials == 2  # trial 0 kept; the cut-off one retried


@pytest.mark.parametrize("name", ["trials.csv", "train_command.sh"])
def test_a_full_disk_while_an_output_is_written_names_it(tmp_path: Path, name: str, monkeypatch) -> None:
    """trials.csv and train_command.sh were written in place: a full disk failed at the write, with
    no file name (and left half a file). They are written whole or not at all now, as every other
    output is, and the error names the file the disk refused. The disk: /dev/full, opened where the
    write opens that output's temporary file (a link planted there is replaced, never written through)."""
    from trainfit import files

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    spec = synthetic_spec(tmp_path, "grid")
    out = tmp_path / "out"
    out.mkdir()
    full = out / f"{name}.{os.getpid()}.tmp"
    own = files.open_own
    monkeypatch.setattr(files, "open_own", lambda path, mode: open("/dev/full", "wb") if path == full else own(path, mode))
    with pytest.raises(OSError) as info:
        tune(with_tune(spec, max_trials=2), TuneOptions(output=out, probe_fn=Surface()))
    assert info.value.filename == str(full) and not full.exists() and not (out / name).exists()


@pytest.mark.integration
def test_a_full_disk_while_a_probe_writes_its_files_names_its_folder(tmp_path: Path, capsys: Any) -> None:
    """A probe writes its request, log and result in its own folder: a full disk there gave
    "No space left on device" naming no file. The error names the probe's folder now."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    spec = make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:broken"}, params={"max_length": 8})
    folder = tmp_path / "out" / "probes" / "trial-0000"
    folder.mkdir(parents=True)
    (folder / "request.json").symlink_to("/dev/full")
    assert main(["tune", str(spec), "--output", str(tmp_path / "out")]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first == f"trainfit tune: error: No space left on device ({folder})"


# -- item 5: every probe failed with an error ----------------------------------------------------

@pytest.mark.integration
def test_when_every_probe_errors_the_report_gives_the_error_and_its_log_not_memory_knobs(
        tmp_path: Path, capsys: Any) -> None:
    """Every probe failing with the same error (no OOM) gave "No configuration fits" and a list of
    memory knobs. Now the terminal, summary.json and report.html say every probe failed with an
    error, give its line and where its full log is, and suggest no memory knob."""
    spec = make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:broken"}, params={"max_length": 8})
    spec.write_text(spec.read_text() + "search:\n  batch_size: [1, 2]\n")
    out = tmp_path / "out"
    assert main(["tune", str(spec), "--output", str(out)]) == 1
    text = capsys.readouterr().out
    result = out / "probes" / "trial-0000" / "result.json"  # the whole message: a traceback
    assert "Traceback" not in text and "the factory could not read its config" in result.read_text()
    assert "No configuration fits: every probe failed with an error (none ran out of memory)" in text
    # one probe: the search tries no larger batch of a config whose smaller batch did not run
    assert "Fix this first (1 of 1 probes): ValueError: the factory could not read its config" in text
    assert f"the whole message of trial 0: {result};" in text
    assert "To lower peak memory" not in text and "gradient_checkpointing" not in text
    [advice] = json.loads((out / "summary.json").read_text())["all_failed"]["advice"]
    assert "ValueError: the factory could not read its config" in advice and "probes/trial-0000/result.json" in advice
    page = (out / "report.html").read_text()
    assert "Every probe failed with an error" in page and "the factory could not read its config" in page


# -- a torn record in a journal that several runs share (issue 45) --------------------------------

def test_a_torn_record_anywhere_in_a_shared_journal_stops_no_run_and_loses_no_record(tmp_path: Path, capsys) -> None:
    """A writer killed mid-append leaves a partial line. The next writer's record landed after the torn
    bytes on the same line, and Optuna's reader then raised a bare JSONDecodeError in every run sharing
    the file, for good: the live run died and each new --join was refused. Now an append ends a torn
    record first, and a line holding none is passed over with a warning naming it; a whole record glued
    after torn bytes (written before this fix) is read."""
    spec = synthetic_spec(tmp_path, "grid")
    journal = tmp_path / "shared.journal"
    first = tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "a", probe_fn=Surface(),
                                                           storage=str(journal), join=True))
    with journal.open("ab") as f:
        f.write(b'{"op_code":5,"worker_id":"killed","trial_id":0,"sta')  # a writer killed mid-append
    again = tune(with_tune(spec, max_trials=4), TuneOptions(output=tmp_path / "b", probe_fn=Surface(),
                                                           storage=str(journal), join=True))
    assert again.summary.total_tested == 4 and again.new_trials == 2
    lines = journal.read_bytes().split(b"\n")
    torn = next(n for n, line in enumerate(lines, start=1) if line.endswith(b'"sta'))  # ended, not glued to
    assert f"{journal} line {torn} holds a torn record" in capsys.readouterr().err
    assert [n for n, line in enumerate(lines[:-1], start=1) if not _is_record(line)] == [torn]
    # A record glued after torn bytes, as the next writer left it before this fix: its record is read.
    glued = lines[torn - 1] + lines[torn]
    journal.write_bytes(b"\n".join([*lines[:torn - 1], glued, *lines[torn + 1:]]))
    resumed = tune(with_tune(spec, max_trials=4), TuneOptions(output=tmp_path / "c", probe_fn=Surface(),
                                                             storage=str(journal), join=True))
    assert resumed.summary.total_tested == 4 and resumed.new_trials == 0
    assert "the whole record after it is read" in capsys.readouterr().err
    assert first.summary.total_tested == 2


def _is_record(line: bytes) -> bool:
    try:
        return "op_code" in json.loads(line)
    except ValueError:
        return False


def test_a_journal_path_that_is_no_file_is_named_as_such(tmp_path: Path) -> None:
    """A --storage journal that is a folder got a hint about --output; a link to /dev/null gave
    "Invalid argument" with no file named."""
    from trainfit.search.storage import open_storage

    (tmp_path / "dir.journal").mkdir()
    (tmp_path / "null.journal").symlink_to("/dev/null")
    for name, what in (("dir.journal", "a folder"), ("null.journal", "no regular file")):
        with pytest.raises(TrainfitError) as refused:
            open_storage(str(tmp_path / name))
        assert refused.value.message == f"the journal {tmp_path / name} is {what}"
        assert "--output" not in (refused.value.hint or "")
