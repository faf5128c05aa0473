"""The study behind ``tune``: resume from the output folder's journal, a study's identity, the
folder lock, and a shared ``--storage`` (a real SQLite file) that several runs join, split the
work of and retry abandoned trials in. Probes are the synthetic Surface of tune_helpers."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA, make_spec_file
from tune_helpers import Slow, Surface, store_for, synthetic_spec

from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.search.events import SharedStudy, TuneEvent
from trainfit.tune.options import TuneOptions, TuneResult
from trainfit.spec import load_spec, with_tune
from trainfit.tune import tune


def test_resume_continues_without_reprobing(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    first = Surface()
    tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "out", probe_fn=first))
    with pytest.raises(TrainfitError, match="--resume"):
        tune(with_tune(spec, max_trials=6), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    second = Surface()
    result = tune(with_tune(spec, max_trials=6), TuneOptions(output=tmp_path / "out", probe_fn=second, resume=True))
    assert len(first.calls) == 3 and len(second.calls) == 3
    assert not any(c in first.calls for c in second.calls)
    assert result.summary.to_json()["total_tested"] == 6


def test_a_trial_cut_off_by_a_crash_is_retried(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    crashing = Surface()

    def probe(p: Params, number: int) -> Measurement:
        if len(crashing.calls) == 2:
            crashing.calls.append(p.to_dict())
            raise KeyboardInterrupt  # the tuner dies mid-probe
        return crashing(p, number)

    with pytest.raises(KeyboardInterrupt):
        tune(with_tune(spec, max_trials=5), TuneOptions(output=tmp_path / "out", probe_fn=probe))
    interrupted = crashing.calls[2]
    again = Surface()
    result = tune(with_tune(spec, max_trials=5), TuneOptions(output=tmp_path / "out", probe_fn=again, resume=True))
    assert again.calls[0] == interrupted  # retried first
    assert result.summary.to_json()["total_tested"] == 5


def test_a_studys_identity_leaves_defaults_out_so_it_survives_new_settings(tmp_path: Path) -> None:
    """The study name is pinned: a setting or knob a later trainfit adds at its default must not
    change it (a study started before could no longer --resume). Change this literal only with a
    change that really makes old trials inapplicable."""
    from trainfit.search.storage import study_name

    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "batch_size": 2},
                          budget={"memory_gb": 4})
    spec = load_spec(path, ["search.batch_size=[1,2]"])
    assert study_name(spec) == "trainfit-37e1a45c1ac3"
    # a default written out is the same study; a value that differs from the default is another
    assert study_name(load_spec(path, ["search.batch_size=[1,2]", "lora_dropout=0.0", "probe.seed=0"])) == \
        study_name(spec)
    assert study_name(load_spec(path, ["search.batch_size=[1,2]", "probe.seed=1"])) != study_name(spec)


def test_a_changed_spec_does_not_resume_a_foreign_study(tmp_path: Path) -> None:
    tune(with_tune(synthetic_spec(tmp_path, "grid"), max_trials=2), TuneOptions(output=tmp_path / "out",
                                                                                probe_fn=Surface()))
    changed = synthetic_spec(tmp_path / "c", "grid")
    changed = load_spec(changed.source, ["budget.memory_gb=30"])
    with pytest.raises(TrainfitError, match="spec changed") as info:
        tune(changed, TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True))
    assert "budget.memory_gb" in str(info.value)  # it names what changed


def test_a_resume_of_a_folder_that_holds_no_study_leaves_nothing_behind(tmp_path: Path) -> None:
    """Refused before anything is made there: no folder, lock or empty journal that a later plain
    run would take for a study (a newcomer's typo in --output, then the same command again)."""
    spec = with_tune(synthetic_spec(tmp_path, "grid"), max_trials=2)
    for folder in (tmp_path / "typo", tmp_path):  # missing, and a folder of other files
        before = sorted(p.name for p in tmp_path.rglob("*"))
        with pytest.raises(TrainfitError, match=r"nothing to resume in .*: it holds no study\.journal"):
            tune(spec, TuneOptions(output=folder, probe_fn=Surface(), resume=True))
        assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_running_tune_holds_its_output_folder(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    running = store_for(spec, tmp_path / "out")  # as a tune in another terminal holds it
    with pytest.raises(TrainfitError, match=r"in use by a running trainfit tune \(pid \d+"):
        tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True))
    running.close()
    result = tune(with_tune(spec, max_trials=2), TuneOptions(output=tmp_path / "out", probe_fn=Surface(), resume=True))
    assert result.summary.to_json()["total_tested"] == 2
    # and a finished tune released it
    assert tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "out", probe_fn=Surface(),
                                                           resume=True)).new_trials == 1


def test_the_output_folder_stays_held_until_the_tunes_last_write(tmp_path: Path, monkeypatch: Any) -> None:
    """``tune --calibrate`` writes the outputs again after the search: a run started on the folder
    while the calibration runs is refused, and the folder is free once the tune returns. (The
    calibration itself, a real trainer's run, stands aside: what is tested is the folder's hold.)"""
    import trainfit.tune

    spec = load_spec(synthetic_spec(tmp_path, "grid").source, ["tune.command_template=train --steps {max_steps}"])
    out = tmp_path / "out"
    refused: list[str] = []

    def calibrating(result: TuneResult, steps: int, options: TuneOptions, rewrite: Any) -> TuneResult:
        with pytest.raises(TrainfitError, match=r"in use by a running trainfit tune") as err:
            tune(with_tune(spec, max_trials=3), TuneOptions(output=out, probe_fn=Surface(), resume=True))
        refused.append(str(err.value))
        rewrite(None)  # the outputs written again, as the calibration does
        return result

    monkeypatch.setattr(trainfit.tune, "calibrated", calibrating)
    tune(with_tune(spec, max_trials=2), TuneOptions(output=out, probe_fn=Surface(), calibrate_steps=2))
    assert len(refused) == 1
    assert tune(with_tune(spec, max_trials=3), TuneOptions(output=out, probe_fn=Surface(), resume=True)).new_trials == 1


def test_a_shared_storage_holds_several_studies_and_resumes_by_spec(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"  # a real database file, as several machines would share
    spec_a = synthetic_spec(tmp_path / "a", "grid")
    spec_b = load_spec(spec_a.source, ["budget.memory_gb=30"])
    tune(with_tune(spec_a, max_trials=2), TuneOptions(output=tmp_path / "out-a", probe_fn=Surface(), storage=url))
    tune(with_tune(spec_b, max_trials=2), TuneOptions(output=tmp_path / "out-b", probe_fn=Surface(budget_gb=30),
                                                      storage=url))
    again = Surface()
    events: list[TuneEvent] = []
    result = tune(with_tune(spec_a, max_trials=4), TuneOptions(output=tmp_path / "out-a2", probe_fn=again, storage=url,
                                                               resume=True, on_event=events.append))
    assert len(again.calls) == 2 and result.summary.to_json()["total_tested"] == 4
    # the same spec file under another budget is another study: the run names it and what differs
    [study] = [e for e in events if isinstance(e, SharedStudy)]
    assert [o["differs"] for o in study.others] == [["budget.memory_gb"]]
    with pytest.raises(TrainfitError, match="already holds this tuning study"):
        tune(spec_b, TuneOptions(output=tmp_path / "out-b2", probe_fn=Surface(), storage=url))


def test_a_shared_storage_retries_only_trials_whose_owner_is_gone(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    machine_a = store_for(spec, tmp_path / "a", storage=url)
    in_flight = machine_a.ask({"batch_size": 1, "gradient_checkpointing": False, "lora_r": 8})
    # Machine B joins while A's probe runs: A's trial is not B's to retry.
    assert store_for(spec, tmp_path / "b", storage=url, resume=True).retried == 0
    # A dies mid-probe (its process is gone): the next one to join retries the trial.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    host = in_flight.user_attrs["owner"].split(":")[0]
    in_flight.set_user_attr("owner", f"{host}:{gone.stdout.strip()}")
    assert store_for(spec, tmp_path / "c", storage=url, resume=True).retried == 1


def age_heartbeat(db: Path, trial: Any, seconds: int) -> None:
    """Move ``trial``'s last heartbeat, as Optuna recorded it in the database, ``seconds`` back: as
    if its run had recorded none since (the database's clock, which Optuna reads, is left alone)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as con, con:
        changed = con.execute("UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, ?) WHERE trial_id = ?",
                              (f"-{seconds} seconds", trial._trial_id)).rowcount
    assert changed == 1, "the trial has no heartbeat recorded"


def heartbeat_age_s(db: Path, trial: Any) -> float:
    """Seconds since ``trial``'s last heartbeat, on the database's clock."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as con:
        [(age,)] = con.execute("SELECT (julianday('now') - julianday(heartbeat)) * 86400 FROM trial_heartbeats "
                               "WHERE trial_id = ?", (trial._trial_id,)).fetchall()
    return float(age)


def test_optunas_heartbeat_tells_a_live_trial_on_another_machine_from_a_dead_one(tmp_path: Path) -> None:
    """Two trials of another machine, which this host cannot check: both recorded a heartbeat when
    asked for. One's run stops beating; the other's probe runs on. Once the dead one's last beat is
    older than the grace period, the next run closes it as Optuna's heartbeat says, and its config is
    open again, while the live one (its beat recorded meanwhile) stays claimed."""
    from trainfit.search import claims

    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    spec = synthetic_spec(tmp_path, "grid")
    machine_a = store_for(spec, tmp_path / "a", storage=url)
    live = machine_a.ask({"batch_size": 1, "gradient_checkpointing": False, "lora_r": 8})
    dead = machine_a.ask({"batch_size": 2, "gradient_checkpointing": False, "lora_r": 8})
    for t in (live, dead):
        t.set_user_attr("owner", "another-host:1")  # a pid this host cannot check

    def stored(trial: Any) -> Any:
        return {t.number: t for t in machine_a.study.get_trials()}[trial.number]

    b = store_for(spec, tmp_path / "b", storage=url, resume=True)
    assert b.retried == 0 and b.in_flight() == {b._key(live), b._key(dead)}  # no beat missed yet
    grace = 3 * claims.HEARTBEAT_S
    for t in (live, dead):  # no beat for longer than the grace period ...
        age_heartbeat(db, t, grace + 10)
    with machine_a.beating(live):  # ... but the live machine's probe runs, and records one at once
        deadline = time.monotonic() + 60  # a hang guard only
        while heartbeat_age_s(db, live) > grace:
            assert time.monotonic() < deadline, "beating never recorded the live trial's heartbeat"
            time.sleep(0.01)
        c = store_for(spec, tmp_path / "c", storage=url, resume=True)
        assert c.retried == 1 and c.in_flight() == {c._key(live)}  # the dead one's config is open again
    assert stored(dead).state.name == "FAIL" and stored(live).state.name == "RUNNING"
    assert b.in_flight() == {b._key(live)}  # a run that joined before sees it too


def test_a_trial_whose_run_died_before_its_first_heartbeat_is_retried(tmp_path: Path) -> None:
    """Optuna never calls a trial without a heartbeat stale: one whose run died while asking for
    it (before its first beat and its owner) is closed once it started longer ago than the grace
    period."""
    import sqlite3

    from trainfit.search import claims

    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    spec = synthetic_spec(tmp_path, "grid")
    machine_a = store_for(spec, tmp_path / "a", storage=url)
    with pytest.warns(UserWarning, match="supposed to be used with Study.optimize"):  # what TrialStore.ask hides
        asking = machine_a.study.ask()  # what a run cut off inside TrialStore.ask leaves behind
    assert store_for(spec, tmp_path / "b", storage=url, resume=True).retried == 0  # it may still be asking
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE trials SET datetime_start = datetime(datetime_start, ?) WHERE trial_id = ?",
                    (f"-{3 * claims.HEARTBEAT_S + 10} seconds", asking._trial_id))
    assert store_for(spec, tmp_path / "c", storage=url, resume=True).retried == 1
    assert {t.number: t for t in machine_a.study.get_trials()}[asking.number].state.name == "FAIL"


def test_a_trials_first_heartbeat_waits_out_an_outage_so_its_run_dying_frees_it(tmp_path: Path,
                                                                                   monkeypatch: Any) -> None:
    """The first beat, recorded before the trial gets its owner, meets a database that does not
    answer: it is retried, not skipped. Skipped, the trial would carry an owner and no beat: Optuna
    calls no such trial stale and another machine cannot check the owner's process, so once its run
    died its config would be in flight for ever."""
    import optuna
    import sqlalchemy.exc

    from trainfit.search import claims

    record = optuna.storages.RDBStorage.record_heartbeat
    failures: list[int] = []

    def lost_once(self: Any, trial_id: int) -> None:
        if not failures:
            failures.append(trial_id)
            raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("server closed the connection"))
        record(self, trial_id)

    monkeypatch.setattr(optuna.storages.RDBStorage, "record_heartbeat", lost_once)
    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    spec = synthetic_spec(tmp_path, "grid")
    machine_a = store_for(spec, tmp_path / "a", storage=url)
    trial = machine_a.ask(VALUES)
    assert failures == [trial._trial_id] and "owner" in trial.user_attrs  # the first try failed
    trial.set_user_attr("owner", "another-host:1")  # its run on a machine this host cannot check ...
    age_heartbeat(db, trial, 3 * claims.HEARTBEAT_S + 10)  # ... died: no beat since
    assert store_for(spec, tmp_path / "b", storage=url, resume=True).retried == 1
    assert machine_a.storage.get_trial(trial._trial_id).state.name == "FAIL"


def _join(spec: Any, url: str, output: Path, log: Path, summary: Path, rendezvous: Path) -> None:
    """One machine of several started with the same command (run in a child process)."""
    import importlib

    importlib.import_module("trainfit.search.loop").BUSY_WAIT_S = 0.05  # the module, not the function
    result = tune(with_tune(spec, max_trials=64), TuneOptions(output=output, probe_fn=Slow(log, rendezvous),
                                                              storage=url, join=True))
    summary.write_text(json.dumps(result.summary.to_json()["best_config"]["searched"]))


@pytest.mark.integration  # two tune processes at once on one database
@pytest.mark.parametrize("strategy", ["grid", "auto", pytest.param("bayes", marks=pytest.mark.slow)])
def test_runs_sharing_a_storage_split_the_work_without_probing_a_config_twice(tmp_path: Path, strategy: str) -> None:
    """Two runs started at once with `--join` on a fresh storage: one creates the study, the
    other joins it, and between them every config is probed once. Each run's first probe waits
    for the other's to start (Slow's rendezvous): the runs overlap whatever the machine's speed."""
    import multiprocessing

    url = f"sqlite:///{tmp_path / 'shared.db'}"  # a real database file, as several machines would share
    spec = synthetic_spec(tmp_path, strategy)
    # spawned, not forked: a fork of this process copies whatever lock another of its threads held at that
    # moment (earlier tests leave threads), and a slow-tier run saw a child hang past the timeout that way
    spawn = multiprocessing.get_context("spawn")
    runs = [spawn.Process(target=_join, args=(spec, url, tmp_path / f"m{i}", tmp_path / f"calls{i}.json",
                                             tmp_path / f"best{i}.json", tmp_path / "rendezvous"))
            for i in range(2)]
    for r in runs:
        r.start()
    for r in runs:
        r.join(timeout=120)
        assert r.exitcode == 0
    calls = [json.loads((tmp_path / f"calls{i}.json").read_text()) for i in range(2)]
    probed = [tuple(c[k] for k in ("batch_size", "gradient_checkpointing", "lora_r")) for c in calls[0] + calls[1]]
    assert len(probed) == len(set(probed))  # no config probed twice
    assert all(calls)  # both runs did part of the work
    if strategy == "grid":
        assert len(probed) == 32
    best = [json.loads((tmp_path / f"best{i}.json").read_text()) for i in range(2)]
    assert best[0] == best[1]  # both saw every result
    if strategy == "grid":  # every config probed: what one run finds
        alone = tune(synthetic_spec(tmp_path / "alone", strategy), TuneOptions(output=tmp_path / "alone-out",
                                                                               probe_fn=Surface()))
        assert best[0] == alone.best.values
    else:  # which configs a guided search asks for depends on how the two runs' results interleave
        union = calls[0] + calls[1]
        chosen = next(c for c in union if all(c[k] == v for k, v in best[0].items()))
        assert Surface().throughput(Params(**chosen)) == Surface().best_feasible(union)  # the best of what was probed


VALUES = {"batch_size": 32, "gradient_checkpointing": True, "lora_r": 16}


def test_a_trial_another_run_closed_while_it_was_probed_keeps_its_measurement(tmp_path: Path) -> None:
    """A run whose machine paused past the heartbeat's grace period finds its trial closed by the
    others (as abandoned): its measurement goes in a new trial of the same values, not lost to a
    crash ("Cannot tell a FAIL trial"); dropping such a trial is a no-op."""
    from optuna.trial import TrialState

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    store = store_for(spec, tmp_path / "a", storage=url)
    closed = store.ask(VALUES)
    store.storage.set_trial_state_values(closed._trial_id, TrialState.FAIL)  # another run judged it abandoned
    told = store.tell(closed, VALUES, Surface()(Params(**VALUES), closed.number), store.history())
    assert told.number != closed.number and [t.values for t in store.history()] == [VALUES]
    dropped = store.ask({**VALUES, "lora_r": 8})
    store.storage.set_trial_state_values(dropped._trial_id, TrialState.FAIL)
    store.drop(dropped)
    assert store.storage.get_trial(dropped._trial_id).state == TrialState.FAIL


def test_a_trial_closed_by_another_run_while_it_is_asked_for_is_asked_for_again(tmp_path: Path) -> None:
    """Another run judges a trial with no owner yet by its start, on its own clock (a machine in
    another time zone sees it hours old) and may close it while it is asked for: the asking run
    gets a new trial instead of a crash."""
    from optuna.trial import TrialState

    from trainfit.search.trial_records import ask_trial

    store = store_for(synthetic_spec(tmp_path, "grid"), tmp_path / "a", storage=f"sqlite:///{tmp_path / 'shared.db'}")
    ask = store.study.ask
    first: list[Any] = []

    def closed_by_another_run_once(*args: Any) -> Any:
        trial = ask(*args)
        if not first:
            first.append(trial)
            store.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        return trial

    store.study.ask = closed_by_another_run_once
    trial = ask_trial(store.study, store.distributions, VALUES, heartbeat_in=store.storage)
    assert trial._trial_id != first[0]._trial_id and trial.params == VALUES and "owner" in trial.user_attrs
    assert store.storage.get_trial(trial._trial_id).state == TrialState.RUNNING


def test_a_config_asked_for_at_once_by_two_runs_waits_for_the_earlier_trials_values(tmp_path: Path) -> None:
    """The earlier trial of two runs that proposed one config keeps it, however long its run takes
    to store the values (a Bayesian fit can take seconds; this check used to give up after 1 s and
    let both probe it). Until then that trial is a config of its own in flight."""
    import threading

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    store = store_for(spec, tmp_path / "a", storage=url)
    other = store.storage.create_new_trial(store.study._study_id)  # another run, still asking: no values yet
    assert store.in_flight() == {store._key(store.storage.get_trial(other))} and len(store.in_flight()) == 1
    trial = store.ask(VALUES)

    def the_other_run_stores_its_values() -> None:
        time.sleep(1.5)
        for name, value in VALUES.items():
            given = store.distributions[name]
            store.storage.set_trial_param(other, name, given.to_internal_repr(value), given)

    writer = threading.Thread(target=the_other_run_stores_its_values)
    writer.start()
    try:
        assert store.claimed_elsewhere(trial)
    finally:
        writer.join()


def test_a_wait_for_an_earlier_trials_values_keeps_this_trial_alive_and_ends(tmp_path: Path, monkeypatch: Any) -> None:
    """An earlier trial that never gets its values (its run died asking, and its start, read on
    another clock, does not look old): the wait beats for this trial and ends after the grace
    period, leaving the config to the earlier trial (proposed again if it never probes it)."""
    import sqlite3

    from trainfit.search import claims

    store = store_for(synthetic_spec(tmp_path, "grid"), tmp_path / "a", storage=f"sqlite:///{tmp_path / 'shared.db'}")
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.2)  # the wait's grace: three beats
    asking = store.storage.create_new_trial(store.study._study_id)  # no values, ever
    with contextlib.closing(sqlite3.connect(tmp_path / "shared.db")) as con, con:  # its machine's clock, an hour ahead
        con.execute("UPDATE trials SET datetime_start = datetime(datetime_start, '+1 hour') WHERE trial_id = ?", (asking,))
    trial = store.ask(VALUES)
    beats: list[int] = []
    record = store.storage.record_heartbeat
    monkeypatch.setattr(store.storage, "record_heartbeat", lambda trial_id: (beats.append(trial_id), record(trial_id)))
    began = time.monotonic()
    assert store.claimed_elsewhere(trial)
    assert time.monotonic() - began >= 0.6
    assert len(beats) >= 2 and set(beats) == {trial._trial_id}  # it beat while it waited (about 3 times)


def test_a_study_the_default_search_ran_before_it_changed_says_how_to_resume_it() -> None:
    """A knob added since a study began is no difference at its default; a study whose only change
    is its search (the default search grew a knob the data calls for) is told the search it ran."""
    from types import SimpleNamespace

    from trainfit.search.storage import other_studies, refuse_to_open

    before = {"params": {"batch_size": 4}, "search": {"batch_size": [1, 2], "gradient_checkpointing": [False, True]},
              "tune": {"target_effective_batch": 8}}
    now = {"params": {"batch_size": 4, "packing": False},
           "search": {**before["search"], "group_by_length": [False, True]}, "tune": {"target_effective_batch": 8}}
    others = other_studies([SimpleNamespace(study_name="old", user_attrs={"spec": before})], "new", now)
    assert others[0]["differs"] == ["search.group_by_length"]  # not params.packing, a knob added since, at its default
    with pytest.raises(TrainfitError) as err:
        refuse_to_open("new", output=Path("out"), storage=None, existing=["old"], others=others, resume=True, join=False)
    assert "the spec changed since this study started (changed: search.group_by_length)" in str(err.value)
    assert ('give the one that study ran, search: {"batch_size": [1, 2], "gradient_checkpointing": [false, true]} '
            "and tune: {target_effective_batch: 8}") in (err.value.hint or "")
