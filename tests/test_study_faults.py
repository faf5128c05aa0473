"""Faults found from outside (the Hardening issue) in the study storage and the tune stop rules:
a damaged journal, results without a study, a changed dataset, and runs sharing a storage that
end together. Each test of a bug failed before its fix. The probes are the deterministic ``Surface`` of
tune_helpers (the search logic is under test, not the probe); every storage is a real file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA, make_spec_file, write_texts
from tune_helpers import Slow, Surface, store_for, synthetic_spec

from trainfit.cli import main
from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.plan.inputs import load_run
from trainfit.search import loop as search_loop
from trainfit.search.events import JournalRepaired, TuneEvent, Waiting
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec, with_tune
from trainfit.tune import tune

VALUES = ("batch_size", "gradient_checkpointing", "lora_r")


def tuned(tmp_path: Path, trials: int = 3) -> tuple[Any, Path]:
    """A spec and its output folder after a real short tune: ``trials`` measured, in study.journal."""
    spec = synthetic_spec(tmp_path, "grid")
    tune(with_tune(spec, max_trials=trials), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    return spec, tmp_path / "out" / "study.journal"


def backups(journal: Path) -> list[Path]:
    return sorted(journal.parent.glob(f"{journal.name}.bak-*"))


# -- item 9: a damaged study.journal ------------------------------------------------------------

@pytest.mark.parametrize("damage", ["torn last line", "appended garbage"])
def test_a_damaged_last_line_is_dropped_with_a_backup_and_the_study_resumes(tmp_path: Path, damage: str) -> None:
    """A write cut off by a crash (or junk appended after the last entry) is the journal's tail:
    the resumed run keeps a backup of the file as it was, drops that line, says so, and goes on;
    before, the run appended to the damaged line and the next load failed with a traceback."""
    spec, journal = tuned(tmp_path)
    whole = journal.read_bytes()
    good = whole[:whole.rindex(b"\n", 0, len(whole) - 1) + 1]  # every line but the last
    damaged = whole[:-25] if damage == "torn last line" else whole + b"\x00garbage\n"
    journal.write_bytes(damaged)
    events: list[TuneEvent] = []
    surface = Surface()
    result = tune(with_tune(spec, max_trials=5), TuneOptions(output=tmp_path / "out", probe_fn=surface, resume=True,
                                                             on_event=events.append))
    [backup] = backups(journal)
    assert backup.read_bytes() == damaged  # the file as it was, byte for byte
    [note] = [e for e in events if isinstance(e, JournalRepaired)]
    assert note.backup == str(backup) and note.line == damaged.count(b"\n") + (damage == "torn last line")
    kept = whole if damage == "appended garbage" else good
    assert journal.read_bytes().startswith(kept)  # the lines before it are untouched, the run appended after
    assert result.summary.to_json()["total_tested"] == 5
    # nothing measured was lost: only the torn write's trial (its last entry) is probed again
    assert len(surface.calls) == (2 if damage == "appended garbage" else 3)
    again = tune(with_tune(spec, max_trials=5), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True))
    assert again.new_trials == 0 and len(backups(journal)) == 1  # the repaired journal loads as it is


@pytest.mark.parametrize("damage", ["bad byte", "bad json"])
def test_a_journal_damaged_mid_file_is_refused_unchanged_with_the_line_and_the_recovery(
        tmp_path: Path, capsys: Any, damage: str) -> None:
    """A bad line with good ones after it cannot be dropped without losing what follows: the run
    refuses, names the line and how to keep the lines before it, and leaves the file as it is."""
    spec, journal = tuned(tmp_path)
    lines = journal.read_bytes().split(b"\n")
    lines[9] = lines[9][:40] + b"\xff" + lines[9][41:] if damage == "bad byte" else b"[" + lines[9][1:]
    journal.write_bytes(b"\n".join(lines))
    damaged = journal.read_bytes()
    with pytest.raises(TrainfitError, match=rf"study.journal is damaged at line 10 of {len(lines) - 1}\b") as info:
        tune(with_tune(spec, max_trials=5), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True))
    assert "head -n 9" in str(info.value) and "--output NEW_FOLDER" in str(info.value)
    assert journal.read_bytes() == damaged and not backups(journal)
    # the command line: one clear error, no traceback; without --resume the folder is refused as a study
    assert main(["tune", str(spec.source), "--output", str(tmp_path / "out"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainfit tune: error: ") and "line 10" in err and "Traceback" not in err
    with pytest.raises(TrainfitError, match="already holds a tuning study"):
        tune(with_tune(spec, max_trials=5), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    assert journal.read_bytes() == damaged and not backups(journal)


def test_without_resume_a_torn_journal_is_left_as_it_is(tmp_path: Path) -> None:
    """Only --resume repairs: a run told to start afresh must not touch another study's file (a guard
    on the repair above, not a bug of its own)."""
    spec, journal = tuned(tmp_path)
    journal.write_bytes(journal.read_bytes()[:-25])
    damaged = journal.read_bytes()
    with pytest.raises(TrainfitError, match="already holds a tuning study") as info:
        tune(with_tune(spec, max_trials=5), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    assert "--resume" in str(info.value)
    assert journal.read_bytes() == damaged and not backups(journal)


# -- item 10: results without a study ----------------------------------------------------------

def test_results_without_a_journal_are_not_overwritten(tmp_path: Path) -> None:
    """After a --storage run (its study lives in the database) or with a lost journal, the
    folder's trials.csv and summary.json are an earlier run's results: refused as a study is."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), storage=url))
    assert not (tmp_path / "out" / "study.journal").exists()
    before = {name: (tmp_path / "out" / name).read_bytes() for name in ("trials.csv", "summary.json")}
    with pytest.raises(TrainfitError, match="holds the results of an earlier run") as info:
        tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    assert "--output NEW_FOLDER" in str(info.value)
    with pytest.raises(TrainfitError, match="holds the results of an earlier run"):  # another study of the storage
        tune(with_tune(load_spec(spec.source, ["budget.memory_gb=30"]), max_trials=2),
                                 TuneOptions(output=tmp_path / "out", probe_fn=Surface(), storage=url))
    assert {name: (tmp_path / "out" / name).read_bytes() for name in before} == before
    # continuing the same study there is what the folder is for
    resumed = tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), storage=url,
                                                              resume=True))
    assert resumed.summary.to_json()["total_tested"] == 3
    # a lost journal: its results stay too
    tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "j", probe_fn=Surface()))
    (tmp_path / "j" / "study.journal").unlink()
    with pytest.raises(TrainfitError, match="holds the results of an earlier run"):
        tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "j", probe_fn=Surface()))


# -- item 16: the data changed under --resume ---------------------------------------------------

def data_spec(tmp_path: Path) -> Any:
    """A grid spec on a real data file (its lengths are never counted: the probe is synthetic)."""
    write_texts(tmp_path / "train.jsonl", n=50)
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          data={"path": "train.jsonl", "text_field": "text"},
                          budget={"memory_gb": 40.0, "headroom_gb": 2.0})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4, 8]\ntune:\n  strategy: grid\n")
    return load_spec(path)


def test_resume_refuses_data_that_changed_since_the_study_began(tmp_path: Path) -> None:
    spec = data_spec(tmp_path)
    tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    os.utime(tmp_path / "train.jsonl", ns=(0, 0))  # touched, or copied without its times: the same data
    assert tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "out", probe_fn=Surface(),
                                                           resume=True)).new_trials == 1
    journal = (tmp_path / "out" / "study.journal").read_bytes()
    write_texts(tmp_path / "train.jsonl", n=50, seed=1)  # new content at the same path
    with pytest.raises(TrainfitError, match="the data at .*train.jsonl changed since this study began") as info:
        tune(with_tune(spec, max_trials=4), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True))
    assert "--output NEW_FOLDER" in str(info.value)
    assert (tmp_path / "out" / "study.journal").read_bytes() == journal  # nothing recorded against it
    # a new folder starts a new study on the new data
    assert tune(with_tune(spec, max_trials=1), TuneOptions(output=tmp_path / "new", probe_fn=Surface())).new_trials == 1


def test_a_study_begun_before_data_fingerprints_still_resumes(tmp_path: Path) -> None:
    """A journal written before the fingerprint was stored (its entry taken out of a real one):
    accepted as it is, and from then on it holds the data's fingerprint."""
    spec = data_spec(tmp_path)
    tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    journal = tmp_path / "out" / "study.journal"
    lines = journal.read_text().splitlines(keepends=True)
    old = [line for line in lines if '"data_fingerprint"' not in line]
    assert len(old) == len(lines) - 1
    journal.write_text("".join(old))
    assert tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "out", probe_fn=Surface(),
                                                           resume=True)).new_trials == 1
    write_texts(tmp_path / "train.jsonl", n=50, seed=1)
    with pytest.raises(TrainfitError, match="changed since this study began"):
        tune(with_tune(spec, max_trials=4), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True))


# -- item 14: runs sharing a storage, ending together ------------------------------------------

def claim(spec: Any, output: Path, url: str, values: dict[str, Any], owner: subprocess.Popen[bytes]) -> Any:
    """A trial of ``values`` that another machine (``owner``, alive) has started probing."""
    other = store_for(spec, output, storage=url, resume=True)
    trial = other.ask(values)
    trial.set_user_attr("owner", f"{trial.user_attrs['owner'].split(':')[0]}:{owner.pid}")
    return other, trial


def test_a_trial_another_run_probes_counts_against_max_trials_and_goes_in_the_summary(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Two trials measured, a third in flight on another machine, --max-trials 3: a run joining
    now starts no trial, waits for the other's, and its summary holds all three."""
    monkeypatch.setattr(search_loop, "BUSY_WAIT_S", 0.01)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "a", probe_fn=Surface(), storage=url))
    values = {"batch_size": 32, "gradient_checkpointing": True, "lora_r": 16}
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        other, trial = claim(spec, tmp_path / "b", url, values, alive)

        def on_event(event: TuneEvent) -> None:
            if isinstance(event, Waiting) and trial.number not in {t.number for t in other.history()}:
                other.tell(trial, values, Surface()(Params(**values), trial.number), other.history())

        result = tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "c", probe_fn=Surface(), storage=url,
                                                                 join=True, on_event=on_event))
    finally:
        alive.kill()
        alive.wait()
    assert result.new_trials == 0 and result.stop_reason == "trial budget reached (3)"
    assert result.summary.to_json()["total_tested"] == 3
    assert values in [t.values for t in result.trials]


def test_of_two_trials_asked_for_the_last_slot_the_later_one_is_over_budget(tmp_path: Path) -> None:
    """Two runs that both saw one trial left ask at the same moment: the storage numbers their
    trials, and only the first asked counts; the other is over the budget and is not probed."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "a", probe_fn=Surface(), storage=url))
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        first_store, first = claim(spec, tmp_path / "b", url, dict(zip(VALUES, (32, True, 16), strict=True)), alive)
        later_store, later = claim(spec, tmp_path / "c", url, dict(zip(VALUES, (24, True, 16), strict=True)), alive)
        assert first.number < later.number
        assert not first_store.over_budget(first, 3) and later_store.over_budget(later, 3)
        assert not later_store.over_budget(later, 4)  # a budget with room for both
    finally:
        alive.kill()
        alive.wait()


def _join(spec: Any, url: str, output: Path, log: Path) -> int:
    """One machine of two started with the same command and --max-trials 5 (in a child process):
    the trials its summary counts."""
    search_loop.BUSY_WAIT_S = 0.05
    result = tune(with_tune(spec, max_trials=5), TuneOptions(output=output, probe_fn=Slow(log), storage=url, join=True))
    return result.summary.to_json()["total_tested"]


@pytest.mark.integration
def test_runs_sharing_a_storage_stop_at_max_trials_between_them(tmp_path: Path) -> None:
    """Before, each run counted only finished trials, so the one that finished last started one
    more while the other's was in flight: six trials for --max-trials 5."""
    import multiprocessing

    import optuna

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    logs = [tmp_path / f"calls{i}.json" for i in range(2)]
    with multiprocessing.get_context("spawn").Pool(2) as machines:  # not fork: see test_tune_study's _join
        totals = machines.starmap_async(_join, [(spec, url, tmp_path / f"m{i}", log) for i, log in enumerate(logs)]
                                        ).get(timeout=120)
    probed = [c for log in logs if log.exists() for c in json.loads(log.read_text())]  # a run may probe nothing
    study = optuna.load_study(study_name=None, storage=url)
    measured = [t for t in study.trials if t.state.name == "COMPLETE" and not t.user_attrs.get("reused")]
    assert len(probed) == len(measured) == 5
    assert max(totals) == 5  # the run that ended last saw every trial


# -- a measured trial's memory constraint of the wrong type, read by the bayes sampler ------------

@pytest.mark.parametrize("constraint", ["x", None, [1.0], "no constraint"])
def test_a_memory_constraint_the_sampler_cannot_read_refuses_bayes_and_leaves_auto_resuming(
        tmp_path: Path, constraint: Any) -> None:
    """A journal edited by hand: a measured trial's ``constraints:memory`` of another type than a
    number, or none. Optuna's GPSampler read it inside ``ask`` and raised a bare TypeError or
    ValueError (a traceback, and a trial left running). A finished trial cannot change and the
    sampler reads every one, so a bayes resume is refused naming the trial and the way on; the
    strategies that fix every value (auto here) do not ask the sampler and resume."""
    spec, journal = tuned(tmp_path, trials=6)
    logs = [json.loads(line) for line in journal.read_text().splitlines()]
    line = next(i for i, e in enumerate(logs)
                if e.get("trial_id") == 2 and "constraints:memory" in e.get("system_attr", {}))
    if constraint == "no constraint":
        del logs[line]
    else:
        logs[line]["system_attr"]["constraints:memory"] = constraint
    journal.write_text("".join(json.dumps(e) + "\n" for e in logs))
    surface = Surface()
    with pytest.raises(TrainfitError) as refused:
        tune(with_tune(spec, strategy="bayes", max_trials=9), TuneOptions(output=tmp_path / "out", probe_fn=surface,
                                                                          resume=True))
    assert "trial 2 of" in refused.value.message and "--strategy auto" in (refused.value.hint or "")
    store = store_for(spec, tmp_path / "out", resume=True)
    trials = store.study.trials
    store.close()
    assert len(trials) == 6 and surface.calls == []  # no trial asked for (none left running), nothing probed
    again = tune(with_tune(spec, strategy="auto", max_trials=9), TuneOptions(output=tmp_path / "out", probe_fn=surface,
                                                                             resume=True))
    assert len(again.trials) > 6 and 2 in {t.number for t in again.trials}  # its record reads: it stays measured
    # plan reads the same journal's trials (through Optuna 5.1's study summaries it raised a bare TypeError)
    assert load_run(tmp_path / "out").left_out == {}  # its record reads there too
