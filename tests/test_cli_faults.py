"""Faults found from outside (the Hardening issue): the spec's validation and the tune command's
own handling of signals, full disks and what it prints. Each test failed before its fix."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA, make_spec_file

from trainfit.cli import build_parser, main
from trainfit.errors import SpecError, TrainfitError
from trainfit.probe.events import Phase
from trainfit.search.events import ProbeProgress
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec

CLI = [sys.executable, "-c", "import sys; from trainfit.cli import main; sys.exit(main())"]


def lora_spec(tmp_path: Path, search: str) -> Path:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          params={"max_length": 64, "lora_alpha": 16, "lora_target_modules": ["q_proj"]})
    path.write_text(path.read_text() + f"search:\n  {search}\n")
    return path


def test_lora_options_are_checked_against_the_searched_ranks(tmp_path: Path) -> None:
    """Searching lora_r while params set the other LoRA options is a LoRA search, not an error;
    a null rank among the choices is full fine-tuning, said as a note; only null is an error."""
    from trainfit.spec import unused_lora_note

    searched = load_spec(lora_spec(tmp_path, "lora_r: [4, 32]"))
    assert searched.search.params({"lora_r": 32}).lora_alpha == 16 and unused_lora_note(searched) is None
    ranged = load_spec(lora_spec(tmp_path, "lora_r: {low: 4, high: 32, log: true}"))
    assert ranged.search.dim("lora_r").grid_values() == (4, 8, 16, 32)
    mixed = load_spec(lora_spec(tmp_path, "lora_r: [null, 8]"))
    assert mixed.search.params({"lora_r": None}).lora_r is None  # the full fine-tuning config builds
    assert "lora_alpha, lora_target_modules apply only to the configs with a rank" in unused_lora_note(mixed)
    with pytest.raises(SpecError, match=r"search.lora_r: LoRA options are set \(lora_alpha, lora_target_modules\)"):
        load_spec(lora_spec(tmp_path, "lora_r: [null]"))
    no_rank = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "lora_alpha": 16},
                             name="no-rank.yaml")
    with pytest.raises(SpecError, match="params.lora_r: LoRA options are set"):
        load_spec(no_rank)


@pytest.mark.integration
def test_tune_passes_the_probe_phase_to_its_live_line(tmp_path: Path, capsys: Any) -> None:
    """A real probe's phases reach the view as probe events, and a terminal shows them as they come."""
    from trainfit.cli.tune_render import TuneView
    from trainfit.tune import tune

    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 32})
    spec = load_spec(path, ["search={batch_size: [1]}"])
    view = TuneView(quiet=False, objective="samples_per_second")
    view.tty = True
    events: list[Any] = []
    tune(spec, TuneOptions(output=tmp_path / "out", on_event=lambda e: (events.append(e), view(e))))
    phases = [e.event.phase for e in events if isinstance(e, ProbeProgress) and isinstance(e.event, Phase)]
    assert phases[-3:] == ["memory", "burn_in", "timed"]
    assert "probing batch_size=1 ..." in capsys.readouterr().err.replace(" build", "").split(" memory")[0]


def test_the_resume_hint_repeats_every_flag_the_user_gave() -> None:
    """Every option of `tune`, a new one included, survives into the printed resume command, which
    parses to the same options plus --resume and the run's folder."""
    import argparse

    tune_parser = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["tune"]
    argv = ["tune", "my spec.yaml"]
    for action in tune_parser._actions:
        flag = action.option_strings[-1] if action.option_strings else None
        if flag in (None, "--help", "-h", "--resume"):
            continue
        if action.nargs == 0:
            argv.append(flag)
        elif flag == "--output":
            argv.append("--output=runs/a b")
        else:
            argv += [flag, str(action.choices[0]) if action.choices else
                     {"--set": "run_name=bob's run", "--storage": "sqlite:///x.db"}.get(flag, "3")]
    from trainfit.cli.common import resume_command

    words = shlex.split(resume_command(argv, "runs/a b"))
    assert words[0] == "trainfit"
    again = vars(build_parser().parse_args(words[1:]))
    assert again == {**vars(build_parser().parse_args(argv)), "resume": True}


@pytest.mark.parametrize(("section", "key", "value"), [
    ("budget", "memory_gb", ".nan"), ("budget", "headroom_gb", ".nan"), ("probe", "timeout_s", ".nan"),
    ("probe", "max_seconds", ".inf"), ("params", "lora_dropout", ".nan"), ("tune", "confirm_margin", ".nan"),
])
def test_not_a_number_is_refused_where_a_number_is_expected(tmp_path: Path, section: str, key: str,
                                                            value: str) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    with pytest.raises(SpecError, match=f"{section}.{key}: must be a finite number"):
        load_spec(path, [f"{section}.{key}={value}"])


def test_huge_or_endless_values_are_refused_before_anything_is_built(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    with pytest.raises(SpecError, match="params.batch_size: must be <= 1,048,576, got 1,000,000,000"):
        load_spec(path, ["batch_size=1000000000"])
    with pytest.raises(SpecError, match=r"search.batch_size: low 1 and high \.nan|must be finite numbers"):
        load_spec(path, ["search={batch_size: {low: 1, high: .nan}}"])
    wide = load_spec(path, ["search={max_length: {low: 1, high: 1000000000}}"])
    assert len(wide.search.dim("max_length").grid_values()) == 8  # a few points across it, never the whole range


def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    """600 bytes of nested aliases would be billions of values once copied (merge_overrides copies)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nmodel: {config: {model_type: llama}}\n")
    assert len(bomb.read_bytes()) < 700
    with pytest.raises(TrainfitError, match="expands to more than 100,000 values"):
        load_spec(bomb)
    loop = tmp_path / "loop.yaml"
    loop.write_text("model: &m {config: {model_type: llama}, again: *m}\n")
    with pytest.raises(TrainfitError):
        load_spec(loop)
    with pytest.raises(TrainfitError, match="expands to more than"):
        load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 8}),
                  ["search=" + bomb.read_text().split("\nmodel:")[0].replace("\n", ", ").join("{}")])


def test_a_folder_given_as_the_spec_is_named_as_a_folder(tmp_path: Path, capsys: Any) -> None:
    assert main(["tune", str(tmp_path)]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err


def test_a_tokenizer_that_does_not_exist_is_named_as_the_tokenizer(tmp_path: Path, capsys: Any) -> None:
    from conftest import EXAMPLES

    assert main(["analyze", str(EXAMPLES / "data" / "chat.jsonl"), "--text-field", "text", "--tokenizer",
                 str(tmp_path / "nope"), "--no-cache"]) == 2
    assert f"the tokenizer {tmp_path / 'nope'} does not exist" in capsys.readouterr().err  # not a bare OS error


def test_a_nan_memory_budget_on_the_command_line_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    with pytest.raises(SystemExit) as exit_:
        main(["tune", str(path), "--memory-gb", "nan"])
    assert exit_.value.code == 2 and "'nan' is not a finite number" in capsys.readouterr().err


def test_an_error_line_shows_the_exception_not_the_frame_it_started_in() -> None:
    """What the progress line and trials.csv show of a failed probe."""
    from trainfit.probe.measurement import Measurement

    def headline(message: str) -> str:
        return Measurement(status="error", config={}, message=message).headline

    traceback = ('Traceback (most recent call last):\n  File "/x/worker.py", line 3, in run\n    step()\n'
                 "ValueError: the model wants input_ids")
    assert headline(traceback) == "ValueError: the model wants input_ids"
    assert headline('  File "/x/worker.py", line 3, in run\n    step()\nKeyError: \'labels\'') == "KeyError: 'labels'"
    assert headline("the worker was killed by signal 9\nlast output:\n...") == "the worker was killed by signal 9"


def small_search_spec(tmp_path: Path) -> Path:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 32})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2]\n")
    return path


@pytest.mark.integration
def test_a_closed_terminal_stops_tune_with_the_resume_line(tmp_path: Path) -> None:
    """SIGHUP (the terminal closed) is handled as SIGTERM is: the worker stopped, the way back printed."""
    out = tmp_path / "out"
    run = subprocess.Popen([*CLI, "tune", str(small_search_spec(tmp_path)), "--output", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "probes" / "trial-0000" / "probe.log"
    deadline = time.monotonic() + 120  # a hang guard only
    while not log.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the study exists and its first probe is running: there is a run to resume
    run.send_signal(signal.SIGHUP)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGHUP, err
    assert shlex.split(err.strip().splitlines()[-1])[-3:] == ["--output", str(out), "--resume"]


@pytest.mark.integration
@pytest.mark.slow
def test_a_full_disk_mid_tune_says_so_and_resumes_with_every_trial(tmp_path: Path, capsys: Any,
                                                                   monkeypatch: Any) -> None:
    """A write that the kernel refuses with ENOSPC (report.html's temporary file, named for this
    process, opened on /dev/full where the write opens it: a link planted there is replaced, never
    written through) after the first probe: one line naming the file and the cause, the resume
    line, and the trial kept."""
    from trainfit import files

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    out = tmp_path / "out"
    out.mkdir()
    full = out / f"report.html.{os.getpid()}.tmp"
    own = files.open_own
    monkeypatch.setattr(files, "open_own", lambda path, mode: open("/dev/full", "wb") if path == full else own(path, mode))
    spec = small_search_spec(tmp_path)
    assert main(["tune", str(spec), "--output", str(out)]) == 2
    first, *rest = capsys.readouterr().err.strip().splitlines()
    assert first == f"trainfit tune: error: No space left on device ({full})"
    assert "free some space" in rest[0] and "Traceback" not in "".join(rest)
    assert not full.exists() and not full.is_symlink()  # the temporary file does not outlive the failure
    monkeypatch.undo()  # the disk has room again
    assert main(shlex.split(rest[-1])[1:]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_tested"] == 2 and "resuming: 1 trials already measured" in capsys.readouterr().out


def test_a_missing_dataset_is_named_before_the_fields_are_asked_for(tmp_path: Path, capsys: Any) -> None:
    """A typo in the path, no field flag given: the missing file first (it once asked for a text field);
    a pattern is left to the reader, which says it matches nothing. A bad --lengths file says the fix."""
    assert main(["analyze", str(tmp_path / "trian.jsonl")]) == 2
    assert f"{tmp_path / 'trian.jsonl'} not found" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "*.jsonl"), "--text-field", "text"]) == 2
    assert "matches no file" in capsys.readouterr().err
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 16})
    assert main(["probe", str(path), "--lengths", str(path)]) == 2
    assert "is not a trainfit length analysis" in (err := capsys.readouterr().err) and "fix: give the file" in err


def test_a_path_longer_than_the_filesystem_allows_is_one_line(tmp_path: Path, capsys: Any) -> None:
    """A spec, a --lengths file or a dataset path no filesystem takes: one line naming the cause and
    the fix (each was an OSError traceback)."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 16})
    long = str(tmp_path / ("x" * 300))
    assert main(["tune", long + ".yaml"]) == 2
    assert main(["probe", str(path), "--lengths", long + ".json"]) == 2
    assert main(["analyze", long + ".jsonl", "--text-field", "text"]) == 2
    err = capsys.readouterr().err
    assert err.count("File name too long") == 3 and err.count("fix: use a shorter path") == 3
    assert "Traceback" not in err


def test_a_ctrl_c_whose_file_cleanup_then_fails_is_still_an_interrupt(tmp_path: Path, capsys: Any,
                                                                    monkeypatch: Any) -> None:
    """A Ctrl-C landing inside Optuna's journal lock (between its rename and its unlink) leaves the
    lock's cleanup to fail with FileNotFoundError, raised while the interrupt was handled: tune exits
    130 with its resume line, not 2 as for an error (seen once in about 15 stopped runs)."""
    import trainfit.cli.tune as tune_cli

    def interrupted_in_the_lock(*args: Any, **kwargs: Any) -> Any:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "study.journal.lock1.rename"))

    monkeypatch.setattr(tune_cli, "run_tune", interrupted_in_the_lock)  # the CLI's handling is what is tested
    out = tmp_path / "out"
    assert main(["tune", str(small_search_spec(tmp_path)), "--output", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and shlex.split(err.strip().splitlines()[-1])[-1] == "--resume"
    assert "while stopping: No such file" in err and "error:" not in err  # said, as what failed on the way


def test_json_outputs_never_write_over_a_run_folders_own_files(tmp_path: Path, capsys: Any) -> None:
    """`analyze ... --json runs/a/study.journal` destroyed every measurement, exit 0 (issue 45): an output
    path that is one of the files a run keeps in its folder is refused before any work, the file untouched;
    a file of one's own there is written, whole, and written again."""
    from conftest import EXAMPLES

    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / ".lock").write_text("")  # a tune leaves it, as every run does
    (run / "study.journal").write_text('{"op_code": 0}\n')
    data = ["analyze", str(EXAMPLES / "data" / "chat.jsonl"), "--text-field", "text", "--no-cache"]
    assert main([*data, "--json", str(run / "study.journal")]) == 2
    err = capsys.readouterr().err
    assert "would write over a file of the trainfit run folder" in err and "study.journal" in err
    assert (run / "study.journal").read_text() == '{"op_code": 0}\n'
    for _ in range(2):  # a file of one's own there, written and written again
        assert main([*data, "--json", str(run / "lengths.json")]) == 0
    assert json.loads((run / "lengths.json").read_text())["samples"] > 0
    assert sorted(p.name for p in run.iterdir()) == [".lock", "lengths.json", "study.journal"]  # no temporary left


def test_a_set_of_a_knob_the_search_searches_is_refused(tmp_path: Path, capsys: Any) -> None:
    """Issue 50: --set batch_size=8 beside `search: {batch_size: [...]}` was silently overridden by the
    search. It is refused before anything is probed, naming both and the way out; a --set of a knob
    the search leaves alone, or one that also replaces the search, runs."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    path.write_text(path.read_text() + "search: {batch_size: [1, 2, 4], gradient_checkpointing: [false, true]}\n")
    assert main(["tune", str(path), "--set", "batch_size=8", "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--set batch_size=8, but the spec's search: section searches batch_size over [1, 2, 4]" in err
    assert "take it out of the search" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()  # refused before a study or a probe
    from trainfit.cli.tune import check_sets_not_searched

    spec = load_spec(path, ["search={gradient_checkpointing: [false, true]}", "batch_size=8"])
    check_sets_not_searched(["search={gradient_checkpointing: [false, true]}", "batch_size=8", "lora_r=8"], spec)
