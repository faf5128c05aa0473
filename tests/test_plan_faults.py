"""Faults a user meets with what `trainfit plan` reads (issue #35): a damaged trainer cost or summary
(numbers JSON cannot hold, values of the wrong type), an epoch count past any run, a folder whose
tune is still running. Each is one line naming the file and the fix, never a traceback, and nothing
measured is lost; a damaged trial in the journal is left out and named, as tune leaves it out. The
tune folders are made from fixed figures (these tests are about the files a tune leaves, never about
a measurement)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES

from trainfit.cli import main
from trainfit.data.analyze import analyze_spec
from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.plan import make_plan
from trainfit.plan.eta import estimate
from trainfit.plan.inputs import Candidate
from trainfit.plan.options import fewer_epochs
from trainfit.probe.measurement import Measurement
from trainfit.run_folder import TRAINER_COST_FILE
from trainfit.search.events import TrialsLost
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec
from trainfit.summary import Summary, TrainerCost
from trainfit.trainer.calibration import Calibration
from trainfit.tune import tune

TWO_CONFIGS = ["max_length=256", "search={batch_size: [1, 8]}", "tune.target_effective_batch=8", "tune.max_trials=2",
               "tune.strategy=grid"]
"""The bundled example at effective batch 8: batch 1 accumulating 8 micro-batches a step, or batch 8 in one."""


def measured(params: Params, number: int) -> Measurement:
    """Not a probe: a fitting config at a fixed speed (batch 1 the faster)."""
    sps = {1: 50.0, 8: 45.0}[params.batch_size]
    return Measurement(status="ok", config=params.to_dict(), samples_per_second=sps, tokens_per_second=sps * 100,
                       expected_step_time_s=params.effective_batch_size / sps, samples_per_step=8,
                       peak_memory_bytes=2**30 * params.batch_size, steps_measured=5, stable=True, device="cpu",
                       cpu_threads=2, step_time_ci95_rel=0.01)


def a_calibration() -> Calibration:
    """What ``tune --calibrate`` measured on batch 1 (8 micro-batches a step): 80 ms a step its own."""
    return Calibration(steps=20, seconds_per_step=0.18, samples_per_second=8 / 0.18, probe_samples_per_second=80.0,
                       ratio=0.1 / 0.18, spread_rel=0.02, startup_s=9.0, train_startup_s=7.0, model_step_s=0.1,
                       command="trl sft ...", device="cpu", trial=0, micro_batches=8)


def tune_into(out: Path, resume: bool = False) -> Any:
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_CONFIGS)
    return tune(spec, TuneOptions(output=out, probe_fn=measured, stats=analyze_spec(spec, progress=False),
                                  resume=resume))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("plan_faults") / "run"
    tune_into(out)
    return out


@pytest.fixture
def run_dir(tuned: Path, tmp_path: Path) -> Path:
    """A copy of the tune folder, for a test to damage."""
    return Path(shutil.copytree(tuned, tmp_path / "run", ignore=shutil.ignore_patterns(".lock")))


def strict_json(text: str) -> Any:
    """``text`` read as JSON is specified: NaN and Infinity are not JSON."""
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def with_value(doc: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``doc`` with the dotted ``key`` set to ``value``."""
    *outer, last = key.split(".")
    inner = doc
    for part in outer:
        inner = inner[part]
    inner[last] = value
    return doc


# 1. A damaged trainer_cost.json is refused, naming the file, the key and the fix, before it ranks anything.

@pytest.mark.parametrize(("key", "value", "words"), [
    ("per_micro_batch_s", math.nan, "per_micro_batch_s: NaN is not a finite number"),
    ("per_micro_batch_s", -1e9, "per_micro_batch_s: -1e+09 is below 0"),
    ("per_micro_batch_s", math.inf, "per_micro_batch_s: Infinity is not a finite number"),
    ("per_micro_batch_s", "0.01", "per_micro_batch_s: the str '0.01' where a number belongs"),
    ("calibration.startup_s", math.nan, "calibration.startup_s: NaN is not a finite number"),
    ("searched", [1], "searched: the list [1] where a JSON object belongs"),
    ("measured", None, "measured: null where a value belongs"),
    ("measured", [None], "measured[0]: null where a value belongs"),
    ("measured", [{"trial": 0}], "measured[0].searched: missing"),
])
def test_a_damaged_trainer_cost_file_is_refused_before_it_ranks_anything(run_dir: Path, key: str, value: Any,
                                                                         words: str) -> None:
    cost = TrainerCost(per_micro_batch_s=0.01, trial=0, searched={"batch_size": 1},
                       calibration=a_calibration().to_json())
    damaged = with_value(cost.to_json(), key, value)
    (run_dir / TRAINER_COST_FILE).write_text(json.dumps(damaged))  # a NaN as Python's json writes it
    before = (run_dir / "summary.json").read_text()
    with pytest.raises(TrainfitError) as err:
        tune_into(run_dir, resume=True)
    text = str(err.value)
    assert f"cannot read {run_dir / TRAINER_COST_FILE}: {words}" in text
    assert "delete it" in text and "--calibrate" in text
    assert (run_dir / "summary.json").read_text() == before  # nothing written with it
    (run_dir / TRAINER_COST_FILE).unlink()  # the fix it names: the measured trials stay, and rank again
    assert tune_into(run_dir, resume=True).new_trials == 0


def test_summary_json_is_never_written_with_a_number_json_cannot_hold(run_dir: Path) -> None:
    text = (run_dir / "summary.json").read_text()
    summary = Summary.from_json(strict_json(text))  # a tune's own summary.json is strict JSON
    assert summary.best_config is not None
    broken = dataclasses.replace(summary, best_config=dataclasses.replace(summary.best_config,
                                                                          samples_per_second=math.nan))
    with pytest.raises(TrainfitError, match=r"summary\.json cannot hold best_config\.samples_per_second = NaN"):
        broken.to_json()
    with pytest.raises(TrainfitError, match=r"per_micro_batch_s = -?Infinity"):
        dataclasses.replace(summary, trainer_cost=TrainerCost(per_micro_batch_s=-math.inf, trial=0, searched={},
                                                              calibration={})).to_json()


# 2. A summary.json of valid JSON but the wrong shape: one line naming the file, the key and the fix.

@pytest.mark.parametrize(("key", "value", "words"), [
    ("best_config", "oops", "best_config: the str 'oops' where a JSON object belongs"),
    ("best_config.trial", "3", "best_config.trial: the str '3' where an integer belongs"),
    ("best_config.searched", [], "best_config.searched: the list [] where a JSON object belongs"),
    ("runners_up", {"a": 1}, "runners_up: the dict {'a': 1} where a JSON list belongs"),
    ("dataset_samples", "200", "dataset_samples: the str '200' where an integer belongs"),
    ("epochs_for_estimate", -1, "epochs_for_estimate: -1 is not above 0"),
    ("best_config.samples_per_second", math.nan, "best_config.samples_per_second: NaN is not a finite number"),
    ("trainer_cost", 5, "trainer_cost: the int 5 where a JSON object belongs"),
    ("fastest_per_value", {"lora_r": {"8": "x"}}, "fastest_per_value.lora_r.8: the str 'x' where a JSON object"),
])
def test_a_summary_of_the_wrong_shape_is_refused_naming_the_key_and_the_fix(run_dir: Path, capsys: Any, key: str,
                                                                             value: Any, words: str) -> None:
    path = run_dir / "summary.json"
    path.write_text(json.dumps(with_value(json.loads(path.read_text()), key, value)))
    assert main(["plan", str(run_dir), "--max-hours", "2"]) == 2
    err = capsys.readouterr().err
    assert f"cannot read {path}: {words}" in err and "Traceback" not in err
    assert f"probing nothing again: trainfit tune YOUR_SPEC.yaml --output {run_dir} --resume" in err
    assert not (run_dir / "plan.json").exists()


@pytest.mark.parametrize(("key", "value", "words"), [
    ("startup_s", -5.0, "startup_s: -5 is below 0"),
    ("seconds_per_step", "fast", "seconds_per_step: the str 'fast' where a number belongs"),
    ("micro_batches", 0, "micro_batches: 0 is below 1"),
    ("command", None, "command: null where a string belongs"),
])
def test_a_damaged_calibration_in_the_summary_is_refused_naming_it_and_the_fix(run_dir: Path, capsys: Any, key: str,
                                                                               value: Any, words: str) -> None:
    """The calibration a plan reuses (``summary.json``'s ``trainer_cost``): a negative start-up would shorten the
    ETA, a string would end in a traceback."""
    path = run_dir / "summary.json"
    cost = TrainerCost(per_micro_batch_s=0.01, trial=0, searched={"batch_size": 1},
                       calibration={**a_calibration().to_json(), key: value})
    path.write_text(json.dumps({**json.loads(path.read_text()), "trainer_cost": cost.to_json()}))
    assert main(["plan", str(run_dir), "--max-hours", "2"]) == 2
    err = capsys.readouterr().err
    assert f"the calibration in {path} (trainer_cost.calibration) is damaged: {words}" in err
    assert "Traceback" not in err and "trainfit plan --calibrate N" in err and TRAINER_COST_FILE in err


def damage_measurement(journal: Path, trial_id: int, key: str, value: Any) -> None:
    """Set ``key`` of trial ``trial_id``'s stored measurement to ``value`` (valid JSON, NaN as Python writes it)."""
    lines = []
    for line in journal.read_text().splitlines():  # optuna's operations, one a line: set_trial_user_attr is 8
        op = json.loads(line)
        if op.get("op_code") == 8 and op["trial_id"] == trial_id and "measurement" in op["user_attr"]:
            op["user_attr"]["measurement"][key] = value
            line = json.dumps(op)
        lines.append(line)
    journal.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(("key", "value", "words"), [
    ("samples_per_second", "fast", "measurement.samples_per_second: the str 'fast' where a number belongs"),
    ("expected_step_time_s", math.nan, "measurement.expected_step_time_s: NaN is not a finite number"),
    ("samples_per_second", -50.0, "measurement.samples_per_second: -50 is below 0"),
    ("peak_memory_bytes", -1, "measurement.peak_memory_bytes: -1 is below 0"),
    ("shape_times", {}, "measurement.shape_times: the dict {} where a JSON list belongs"),
])
def test_a_damaged_measurement_is_left_out_as_tune_leaves_it_out_and_plans_once_resumed(
        run_dir: Path, capsys: Any, key: str, value: Any, words: str) -> None:
    """Plan refused the whole folder for one damaged trial ("restore the file, or tune again") while
    tune left the trial out and probed its config again; the record stays in the journal (a finished
    trial cannot change), so after `tune --resume` did that, plan still exited 2, every time. Now
    both read it by one check: tune names the trial and probes it again, plan leaves it out and
    names it, and plans from the config measured again."""
    journal = run_dir / "study.journal"
    damage_measurement(journal, 0, key, value)
    events: list[Any] = []
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_CONFIGS)
    result = tune(spec, TuneOptions(output=run_dir, probe_fn=measured, stats=analyze_spec(spec, progress=False),
                                    resume=True, on_event=events.append))
    [lost] = [e for e in events if isinstance(e, TrialsLost)]
    assert dict(lost.trials) == {0: words} and result.new_trials == 1  # tune: left out, its config probed again
    assert main(["plan", str(run_dir), "--max-hours", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    [left_out] = [line for line in plan["rests_on"] if line.startswith("left out:")]
    assert left_out.startswith(f"left out: trial 0 ({words}): damaged record(s) in {journal}")
    assert plan["trial"] == 2 and plan["searched"]["batch_size"] == 1  # trial 0's config, measured again


def test_a_plan_whose_only_fitting_configs_are_damaged_says_so_and_how_to_measure_them_again(run_dir: Path) -> None:
    """Every fitting trial damaged: the refusal names them and `tune --resume`, not an older trainfit."""
    journal = run_dir / "study.journal"
    for trial in (0, 1):
        damage_measurement(journal, trial, "samples_per_second", math.nan)
    with pytest.raises(TrainfitError, match="with a record that reads back: trial 0 .measurement.samples_per_second: "
                                            "NaN is not a finite number.; trial 1") as info:
        make_plan(run_dir, max_hours=2)
    assert f"--output {run_dir} --resume` probes their configs again" in str(info.value)


# 3. An epoch count past any run: a plan's price of fewer epochs is a bisection, not a walk over every count.

def test_fewer_epochs_is_found_in_few_prices_however_many_epochs_are_asked() -> None:
    c = Candidate(trial=0, searched={"batch_size": 10}, config={"batch_size": 10, "max_length": 64},
                  samples_per_second=10.0, step_time_s=1.0, samples_per_step=10, spread_rel=0.0, peak_gb=1.0,
                  optimizer_gb=0.1, model_gb=0.1, shape_times=[])
    priced: list[int] = []

    def eta(candidate: Candidate, samples: int) -> Any:
        priced.append(samples)
        return estimate(candidate, samples, write_bytes_per_s=1e12, checkpoint_every_s=1e9)

    for epochs, most in ((3, 2), (1e5, 2), (1e6, 2), (7.5, 2)):  # 1,000 samples, 250 s: 2,500 samples fit
        priced.clear()
        option = fewer_epochs(c, 1_000, epochs, 250.0, eta)
        assert option is not None and option.change == f"train {most} epochs instead of {epochs:g}"
        assert len(priced) <= 2 * math.ceil(math.log2(epochs + 1)) + 2
    window = 1e6 + 0.5  # 1e7 samples (and a save of no time): 10,000 epochs fit
    option = fewer_epochs(c, 1_000, 1e6, window, eta)
    assert option is not None and option.change == "train 10000 epochs instead of 1e+06"
    assert option.eta.fits(window) and not eta(c, 1_000 * 10_001).fits(window)


@pytest.mark.parametrize("epochs", ["1e9", "1e300"])
def test_an_epoch_count_past_any_run_is_refused_with_the_bound(run_dir: Path, capsys: Any, epochs: str) -> None:
    with pytest.raises(SystemExit):
        main(["plan", str(run_dir), "--max-hours", "2", "--epochs", epochs])
    assert "--epochs" in capsys.readouterr().err
    with pytest.raises(TrainfitError, match="at most 1,000,000 epochs"):
        make_plan(run_dir, max_hours=2, epochs=float(epochs))


def test_a_million_epochs_is_planned_with_the_most_that_fit(run_dir: Path, capsys: Any) -> None:
    assert main(["plan", str(run_dir), "--max-hours", "2", "--epochs", "1e6", "--json"]) == 1
    plan = json.loads(capsys.readouterr().out)
    fewer = next(o for o in plan["options"] if o["kind"] == "fewer_epochs")
    most = int(fewer["flags"].split()[-1])
    assert fewer["eta"]["high_s"] <= plan["window_s"] and most > 1


# 4. A folder whose tune is still running, before its first summary.json.

@pytest.mark.integration
def test_a_plan_of_a_folder_whose_tune_still_runs_says_so(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "running"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from trainfit.files import lock_folder; held = lock_folder(Path(sys.argv[1])); "
                               "print('held', flush=True); sys.stdin.read()", str(folder)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"  # a tune holds its folder
        assert main(["plan", str(folder), "--max-hours", "2"]) == 2
        err = capsys.readouterr().err
        assert f"a tune is still running in {folder} (pid {holder.pid} on" in err and "no summary.json yet" in err
        assert "wait for it to write its summary.json" in err and "Traceback" not in err
    finally:
        holder.communicate("")
    assert main(["plan", str(folder), "--max-hours", "2"]) == 2  # once it has ended: not a tune output folder
    assert "holds no summary.json: it is not a tune output folder" in capsys.readouterr().err
    bare = tmp_path / "bare"
    bare.mkdir()
    assert main(["plan", str(bare), "--max-hours", "2"]) == 2
    assert list(bare.iterdir()) == []  # asking who holds a folder leaves no .lock in one that has none
