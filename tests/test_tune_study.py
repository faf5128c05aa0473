"""The study behind ``tune``: resume from the output folder's journal, a study's identity, the
folder lock, and a shared ``--storage`` (a real SQLite file) that several runs join, split the
work of and retry abandoned trials in. Probes are the synthetic Surface of tune_helpers."""

from __future__ import annotations

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
from trainfit.spec import load_spec
from trainfit.tune import tune


def test_resume_continues_without_reprobing(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    first = Surface()
    tune(spec, output=tmp_path / "out", probe_fn=first, max_trials=3)
    with pytest.raises(TrainfitError, match="--resume"):
        tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=6)
    second = Surface()
    result = tune(spec, output=tmp_path / "out", probe_fn=second, max_trials=6, resume=True)
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
        tune(spec, output=tmp_path / "out", probe_fn=probe, max_trials=5)
    interrupted = crashing.calls[2]
    again = Surface()
    result = tune(spec, output=tmp_path / "out", probe_fn=again, max_trials=5, resume=True)
    assert again.calls[0] == interrupted  # retried first
    assert result.summary.to_json()["total_tested"] == 5


def test_a_studys_identity_leaves_defaults_out_so_it_survives_new_settings(tmp_path: Path) -> None:
    """The study name is pinned: a setting or knob a later trainfit adds at its default must not
    change it (a study started before could no longer --resume). Change this literal only with a
    change that really makes old trials inapplicable."""
    from trainfit.search.study import study_name

    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "batch_size": 2},
                          budget={"memory_gb": 4})
    spec = load_spec(path, ["search.batch_size=[1,2]"])
    assert study_name(spec) == "trainfit-37e1a45c1ac3"
    # a default written out is the same study; a value that differs from the default is another
    assert study_name(load_spec(path, ["search.batch_size=[1,2]", "lora_dropout=0.0", "probe.seed=0"])) == \
        study_name(spec)
    assert study_name(load_spec(path, ["search.batch_size=[1,2]", "probe.seed=1"])) != study_name(spec)


def test_a_changed_spec_does_not_resume_a_foreign_study(tmp_path: Path) -> None:
    tune(synthetic_spec(tmp_path, "grid"), output=tmp_path / "out", probe_fn=Surface(), max_trials=2)
    changed = synthetic_spec(tmp_path / "c", "grid")
    changed = load_spec(changed.source, ["budget.memory_gb=30"])
    with pytest.raises(TrainfitError, match="spec changed") as info:
        tune(changed, output=tmp_path / "out", probe_fn=Surface(), resume=True)
    assert "budget.memory_gb" in str(info.value)  # it names what changed


def test_a_running_tune_holds_its_output_folder(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    running = store_for(spec, tmp_path / "out")  # as a tune in another terminal holds it
    with pytest.raises(TrainfitError, match=r"in use by a running trainfit tune \(pid \d+"):
        tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=2, resume=True)
    running.close()
    result = tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=2, resume=True)
    assert result.summary.to_json()["total_tested"] == 2
    # and a finished tune released it
    assert tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=3, resume=True).new_trials == 1


def test_a_shared_storage_holds_several_studies_and_resumes_by_spec(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"  # a real database file, as several machines would share
    spec_a = synthetic_spec(tmp_path / "a", "grid")
    spec_b = load_spec(spec_a.source, ["budget.memory_gb=30"])
    tune(spec_a, output=tmp_path / "out-a", probe_fn=Surface(), max_trials=2, storage=url)
    tune(spec_b, output=tmp_path / "out-b", probe_fn=Surface(budget_gb=30), max_trials=2, storage=url)
    again = Surface()
    events: list[TuneEvent] = []
    result = tune(spec_a, output=tmp_path / "out-a2", probe_fn=again, max_trials=4, storage=url, resume=True,
                  on_event=events.append)
    assert len(again.calls) == 2 and result.summary.to_json()["total_tested"] == 4
    # the same spec file under another budget is another study: the run names it and what differs
    [study] = [e for e in events if isinstance(e, SharedStudy)]
    assert [o["differs"] for o in study.others] == [["budget.memory_gb"]]
    with pytest.raises(TrainfitError, match="already holds this tuning study"):
        tune(spec_b, output=tmp_path / "out-b2", probe_fn=Surface(), storage=url)


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


class Clock:
    """``time`` as the study module sees it: ``time()`` returns ``now``, which the test moves;
    everything else is the real module (the heartbeat thread still waits in real seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_heartbeat_tells_a_live_trial_on_another_machine_from_a_dead_one(tmp_path: Path, monkeypatch: Any) -> None:
    """The age of a trial's last beat is read on the study's clock, which the test moves: the
    outcome does not depend on how fast this machine runs the heartbeat thread."""
    from trainfit.search import study

    clock = Clock(1_000.0)
    monkeypatch.setattr(study, "time", clock)
    monkeypatch.setattr(study, "HEARTBEAT_S", 0.01)  # the beating thread's real wait, and the clock's unit
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    machine_a = store_for(spec, tmp_path / "a", storage=url)
    live = machine_a.ask({"batch_size": 1, "gradient_checkpointing": False, "lora_r": 8})
    dead = machine_a.ask({"batch_size": 2, "gradient_checkpointing": False, "lora_r": 8})
    for t in (live, dead):
        t.set_user_attr("owner", "another-host:1")  # a pid this host cannot check

    def stored(trial: Any) -> Any:
        return {t.number: t for t in machine_a.study.get_trials()}[trial.number]

    with machine_a.beating(live):  # the live machine's probe runs ...
        # both stamped at their start, no beat missed yet: neither is another run's to retry
        assert store_for(spec, tmp_path / "b", storage=url, resume=True).retried == 0
        clock.now += 100 * study.HEARTBEAT_S  # ... and time passes: the dead one misses 100 beats
        deadline = time.monotonic() + 60  # a hang guard only
        while stored(live).user_attrs["heartbeat"] != clock.now:  # the live one's next beat is stored
            assert time.monotonic() < deadline, "the heartbeat thread never stamped the live trial"
            time.sleep(0.01)
        assert store_for(spec, tmp_path / "c", storage=url, resume=True).retried == 1
    assert stored(dead).state.name == "FAIL" and stored(live).state.name == "RUNNING"
    assert stored(dead).user_attrs["heartbeat"] == 1_000.0 and stored(live).user_attrs["heartbeat"] == clock.now


def _join(spec: Any, url: str, output: Path, log: Path, summary: Path, rendezvous: Path) -> None:
    """One machine of several started with the same command (run in a child process)."""
    import importlib

    importlib.import_module("trainfit.search.tune").BUSY_WAIT_S = 0.05  # the module, not the function
    result = tune(spec, output=output, probe_fn=Slow(log, rendezvous), storage=url, join=True, max_trials=64)
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
    fork = multiprocessing.get_context("fork")
    runs = [fork.Process(target=_join, args=(spec, url, tmp_path / f"m{i}", tmp_path / f"calls{i}.json",
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
    alone = tune(synthetic_spec(tmp_path / "alone", strategy), output=tmp_path / "alone-out", probe_fn=Surface())
    assert best[0] == best[1] == alone.best.values  # both saw every result, and found what one run finds
