"""`tune --calibrate N`: the trainer's own cost per micro-batch, timed once on real steps, is added to
every config's steps before the ranking, the speeds, the command and the plan (issue 19: the speed tune
optimizes is the speed of the real run). The ranking arithmetic runs on fixed figures; the calibration
itself, real `trl sft` steps, is tested in test_calibration.py and in the slow end-to-end test below."""

from __future__ import annotations

import json
import os
from dataclasses import replace
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
from trainfit.plan.inputs import load_run
from trainfit.probe.measurement import Measurement
from trainfit.run_folder import TRAINER_COST_FILE
from trainfit.tune.options import TuneOptions
from trainfit.search.ranking import with_trainer_cost
from trainfit.spec import load_spec, with_tune
from trainfit.summary import Summary, TrainerCost
from trainfit.trainer.calibration import Calibration
from trainfit.tune import tune

TWO_SPLITS = ["max_length=256", "search={batch_size: [1, 8]}", "tune.target_effective_batch=8", "tune.max_trials=2",
              "tune.strategy=grid"]
"""The bundled example at effective batch 8: batch 1 accumulating 8 micro-batches a step, or batch 8 in one."""

SPEED = {1: 50.0, 8: 45.0}
"""The probes' samples/s (the model's step alone): batch 1 is 11% faster (padding: its batches are shorter)."""

TRAINER_S = 0.010
"""The trainer's own cost per micro-batch: 8 of them a step at batch 1, 1 at batch 8."""


def measured(params: Params, number: int) -> Measurement:
    """Not a probe (these tests are about the ranking): a fitting config at the figures of :data:`SPEED`."""
    sps = SPEED[params.batch_size]
    return Measurement(status="ok", config=params.to_dict(), samples_per_second=sps, tokens_per_second=sps * 100,
                       expected_step_time_s=params.effective_batch_size / sps, samples_per_step=8,
                       peak_memory_bytes=2**30 * params.batch_size, steps_measured=5, stable=True, device="cpu",
                       cpu_threads=2, step_time_ci95_rel=0.01)


def calibration(per_step_s: float, micro_batches: int, trial: int) -> Calibration:
    """What a calibration of ``micro_batches`` micro-batches a step measured: the trainer's ``per_step_s``
    beyond the probe's cost of the very batches it timed (0.1 s)."""
    return Calibration(steps=20, seconds_per_step=0.1 + per_step_s, samples_per_second=8 / (0.1 + per_step_s),
                       probe_samples_per_second=80.0, ratio=0.1 / (0.1 + per_step_s), spread_rel=0.02, startup_s=9.0,
                       train_startup_s=7.0, model_step_s=0.1, command="trl sft ...", device="cpu", trial=trial,
                       micro_batches=micro_batches)


def probed(tmp_path: Path) -> tuple[Any, Path, Any, dict[int, int], TrainerCost]:
    """A tune of :data:`TWO_SPLITS` at the figures of :func:`measured` (its spec, folder, result and the trial of each
    batch size), and the trainer cost ``tune --calibrate`` leaves after timing its pick (batch 1), written in the
    folder: each later write of the outputs without ``--calibrate`` ranks with it."""
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_SPLITS)
    out = tmp_path / "run"
    first = again(spec, out, resume=False)
    trial_of = {t.values["batch_size"]: t.number for t in first.trials}
    cost = TrainerCost(per_micro_batch_s=TRAINER_S, trial=trial_of[1], searched={"batch_size": 1},
                       calibration=calibration(8 * TRAINER_S, 8, trial_of[1]).to_json())
    (out / TRAINER_COST_FILE).write_text(json.dumps(cost.to_json()))
    return spec, out, first, trial_of, cost


def again(spec: Any, out: Path, resume: bool = True, **options: Any) -> Any:
    """The tune of ``spec`` into ``out`` at the figures of :func:`measured` (``resume``: its study, continued)."""
    return tune(spec, TuneOptions(output=out, probe_fn=measured, stats=analyze_spec(spec, progress=False),
                                  resume=resume, **options))


def test_the_trainers_cost_is_added_per_micro_batch_to_each_step() -> None:
    m = measured(Params(batch_size=1, gradient_accumulation_steps=8), 0)
    # 8 samples a step in 0.16 s, plus 8 x 10 ms: 8 / 0.24 s.
    assert with_trainer_cost(50.0, m, "samples_per_second", TRAINER_S) == pytest.approx(8 / 0.24)
    assert with_trainer_cost(5000.0, m, "tokens_per_second", TRAINER_S) == pytest.approx(800 / 0.24)
    assert with_trainer_cost(50.0, m, "samples_per_second", 0.0) == 50.0
    # A confirmation median of 40 samples/s: its step is 0.2 s, plus the same 80 ms.
    assert with_trainer_cost(40.0, m, "samples_per_second", TRAINER_S) == pytest.approx(8 / 0.28)
    # Measured on a config of 4 micro-batches a step, 40 ms its own: 10 ms each, so 80 ms at 8 and 10 ms at 1.
    c = calibration(0.040, micro_batches=4, trial=0)
    assert c.step_overhead_s(1) == pytest.approx(0.010) and c.step_overhead_s(8) == pytest.approx(0.080)


def test_a_trainer_cost_reranks_the_configs_and_writes_the_command_for_the_new_pick(tmp_path: Path) -> None:
    """The probes put batch 1 first; at 10 ms a micro-batch its 8 micro-batches a step cost 80 ms against batch
    8's 10 ms, and batch 8 is the faster run (8 / 0.1878 s = 42.6 samples/s against 8 / 0.24 s = 33.3)."""
    spec, out, first, trial_of, cost = probed(tmp_path)
    assert first.best is not None and first.best.values["batch_size"] == 1
    assert "(trial %d)" % trial_of[1] in (out / "train_command.sh").read_text()
    assert first.summary.trainer_cost is None
    assert first.summary.best_config.probe_samples_per_second == first.summary.best_config.samples_per_second == 50.0

    # What `tune --calibrate` left (the calibration ran the probes' pick, batch 1), then the outputs written again.
    rewritten = again(spec, out)
    assert rewritten.new_trials == 0  # nothing probed again: the same measurements, ranked with the trainer's cost
    s = Summary.from_json(json.loads((out / "summary.json").read_text()))
    assert rewritten.best is not None and rewritten.best.number == trial_of[8] == s.best_config.trial
    assert s.best_config.samples_per_second == pytest.approx(8 / (8 / 45 + 0.010))
    assert s.best_config.probe_samples_per_second == 45.0
    assert s.best_config.estimated_full_runtime_hours == pytest.approx(
        s.dataset_samples * spec.tune.epochs / s.best_config.samples_per_second / 3600)
    runner_up = s.runners_up[0]
    assert runner_up.trial == trial_of[1] and runner_up.samples_per_second == pytest.approx(8 / 0.24)
    assert s.trainer_cost == cost
    script = (out / "train_command.sh").read_text()
    assert "(trial %d)" % trial_of[8] in script and "--per_device_train_batch_size 8" in script
    assert "with the trainer's own cost (calibrated; the probe's: 45)" in script
    assert "Its speed includes the trainer's own cost, 10 ms a micro-batch" in (out / "report.html").read_text()


@pytest.mark.parametrize(("batch_8_step_s", "pick"), [(0.12, 1), (0.01, 8)])
def test_a_pick_the_trainers_cost_moved_is_timed_too_and_each_ranked_by_its_own(
        tmp_path: Path, monkeypatch: Any, batch_8_step_s: float, pick: int) -> None:
    """Batch 1 (the probes' pick) is timed: 10 ms a micro-batch, 8 a step. Carried over per
    micro-batch, that cost makes batch 8 the faster run (42.6 samples/s against 33.3), which the
    trainer has not run: it is timed too. Where the trainer's work on batch 8 is heavier than one
    micro-batch's share (120 ms a step: 26.9 samples/s), batch 1 wins for real; where it is light,
    batch 8 stays the pick. Either way each is ranked by its own cost, the others by the pooled one."""
    import trainfit.tune.trainer_cost as calibrated_module
    from trainfit.run_folder import RunFolder

    timed: list[int] = []

    def calibrate(output: Path, steps: int, **kwargs: Any) -> Calibration:  # real steps: test_calibration.py
        summary = RunFolder(output).summary
        best = summary.best_config  # the config the folder's command now trains
        micro = best.config["gradient_accumulation_steps"]
        timed.append(best.config["batch_size"])
        return replace(calibration(8 * TRAINER_S if micro == 8 else batch_8_step_s, micro, best.trial),
                       device=summary.device)

    monkeypatch.setattr(calibrated_module, "calibrate", calibrate)
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_SPLITS)
    lines: list[str] = []
    result = again(spec, tmp_path / "run", resume=False, calibrate_steps=20, on_calibration=lines.append)
    trial_of = {t.values["batch_size"]: t.number for t in result.trials}
    assert timed == [1, 8] and any("moves the pick to trial %d" % trial_of[8] in line for line in lines)
    s = Summary.from_json(json.loads((tmp_path / "run" / "summary.json").read_text()))
    assert result.best is not None and result.best.number == s.best_config.trial == trial_of[pick]
    cost = RunFolder(tmp_path / "run").trainer_cost
    assert cost is not None and cost.trial == trial_of[pick] and s.trainer_cost == cost
    assert {m["trial"]: m["per_micro_batch_s"] for m in cost.measured} == pytest.approx(
        {trial_of[1]: TRAINER_S, trial_of[8]: batch_8_step_s})
    assert cost.per_micro_batch_s == pytest.approx((8 * TRAINER_S + batch_8_step_s) / 9)
    speeds = {e.config["batch_size"]: e.samples_per_second for e in (s.best_config, *s.runners_up)}
    assert speeds == pytest.approx({1: 8 / (8 / 50 + 8 * TRAINER_S), 8: 8 / (8 / 45 + batch_8_step_s)})
    assert "(trial %d)" % trial_of[pick] in (tmp_path / "run" / "train_command.sh").read_text()
    # A plan on the tune's calibration prices each timed config at its own cost, and picks as the tune did.
    plan = make_plan(tmp_path / "run", max_hours=100.0, priority="fast")
    assert plan.trial == trial_of[pick]
    assert plan.eta.trainer_overhead_s == pytest.approx(8 * TRAINER_S if pick == 1 else batch_8_step_s)
    # A resume with the default calibration keeps both configs' costs: nothing is timed again.
    lines.clear()
    again(spec, tmp_path / "run", calibrate_steps=20, calibration_optional=True, on_calibration=lines.append)
    assert timed == [1, 8] and RunFolder(tmp_path / "run").trainer_cost == cost
    assert lines[0].startswith(f"kept: the trainer's cost timed on trial {trial_of[1]} and {trial_of[8]}")


def test_a_plan_says_when_its_calibrations_steps_were_still_speeding_up(tmp_path: Path) -> None:
    from dataclasses import replace

    from trainfit.plan import make_plan

    spec, out, _, _, cost = probed(tmp_path)
    again(spec, out)
    tunes = Calibration.from_json(cost.calibration)
    assert "later steps ran" not in " ".join(make_plan(out, max_hours=10, epochs=1).rests_on)  # its pace held
    settling = " ".join(make_plan(out, max_hours=10, epochs=1, calibration=replace(tunes, pace_change_rel=-0.25)).rests_on)
    assert "the calibration's later steps ran 25% faster than its earlier ones" in settling
    assert "the ETA long; calibrate over more steps" in settling
    assert "calibrated (by `trainfit tune --calibrate`)" not in settling  # not the tune's own any more
    slowing = " ".join(make_plan(out, max_hours=10, epochs=1, calibration=replace(tunes, pace_change_rel=0.12)).rests_on)
    assert "ran 12% slower" in slowing and "the ETA may be short" in slowing
    # A noisy calibration widens the training time's interval past the probe's: the plan says whose spread it is.
    noisy = make_plan(out, max_hours=10, epochs=1, calibration=replace(tunes, spread_rel=0.8))
    assert "the calibration's own spread, +-80.0%, joins the probe's" in " ".join(noisy.rests_on)
    assert noisy.eta.spread_rel >= 0.8


def test_a_plan_on_a_probe_that_did_not_settle_says_so_with_the_way_on(tmp_path: Path) -> None:
    from dataclasses import replace

    from trainfit.plan import make_plan

    def unsettled(params: Params, number: int) -> Measurement:
        return replace(measured(params, number), step_time_ci95_rel=1.5, stable=False)

    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_SPLITS)
    out = tmp_path / "run"
    tune(spec, TuneOptions(output=out, probe_fn=unsettled, stats=analyze_spec(spec, progress=False)))
    rests_on = " ".join(make_plan(out, max_hours=10, epochs=1).rests_on)
    assert "probe did not settle (+-150%)" in rests_on and "--resume --confirm 3" in rests_on
    _, settled, *_ = probed(tmp_path / "settled")
    assert "did not settle" not in " ".join(make_plan(settled, max_hours=10, epochs=1).rests_on)


def test_a_plan_reuses_the_tunes_calibration_per_micro_batch(tmp_path: Path) -> None:
    from trainfit.plan import make_plan

    spec, out, _, trial_of, cost = probed(tmp_path)
    again(spec, out)
    plan = make_plan(out, max_hours=10, epochs=1, priority="fast")
    # Without --calibrate the plan takes the tune's: batch 8 pays 1 micro-batch's 10 ms a step, not batch 1's 80 ms.
    assert plan.trial == trial_of[8] and plan.calibration == cost.calibration
    assert plan.eta.trainer_overhead_s == pytest.approx(0.010)
    assert plan.eta.step_time_s == pytest.approx(8 / 45 + 0.010)
    assert plan.eta.startup_s == 7.0 and plan.eta.command_startup_s == 9.0
    rests_on = " ".join(plan.rests_on)
    assert "calibrated (by `trainfit tune --calibrate`)" in rests_on and "0.01 s a micro-batch" in rests_on
    assert f"the calibration ran trial {trial_of[1]}" in rests_on
    # Batch 1 pays its 8 micro-batches' 80 ms a step.
    run = load_run(out)
    batch_1 = next(c for c in run.candidates if c.trial == trial_of[1])
    e = estimate(batch_1, 1000, write_bytes_per_s=1e12, checkpoint_every_s=1e9,
                 calibration=Calibration.from_json(cost.calibration))
    assert e.trainer_overhead_s == pytest.approx(0.080) and e.step_time_s == pytest.approx(0.16 + 0.080)
    # The priorities rank by the run's speed: by the probes both are within 10% and batch 1 peaks lower, but with
    # the trainer's cost batch 1 runs 22% slower, so memory_efficient keeps batch 8 too.
    picks = {p.priority: p.trial for p in plan.priorities}
    assert picks["memory_efficient"] == picks["fast"] == trial_of[8]


def test_a_failed_calibration_leaves_the_outputs_ranked_by_the_probes(tmp_path: Path) -> None:
    """An earlier calibration in the folder is not applied while a new one is asked for: the search's outputs rank
    by the probes alone, so the calibration times the probes' pick; when it fails, the error says so."""
    spec, out, _, trial_of, earlier = probed(tmp_path)
    with pytest.raises(TrainfitError) as err:  # -1 steps: refused by the calibration, after the search
        again(spec, out, calibrate_steps=-1)
    text = str(err.value)
    assert "the search ended and wrote its outputs (ranked by the probes alone), then its calibration failed" in text
    assert "at least 1 optimizer step" in text and "with --resume calibrates again" in text
    s = Summary.from_json(json.loads((out / "summary.json").read_text()))
    assert s.trainer_cost is None and s.best_config.trial == trial_of[1]
    assert TrainerCost.from_json(json.loads((out / TRAINER_COST_FILE).read_text())) == earlier  # kept, not lost


def test_a_trainer_cost_whose_pick_searched_a_null_reads_back() -> None:
    """A searched knob's null (``lora_r: [null, 16]``: full fine-tuning) is a value of the config the
    trainer ran, not a damaged entry: the summary holding it must read back."""
    own = {"trial": 3, "searched": {"lora_r": None}, "config": {"lora_r": None}, "per_micro_batch_s": 0.01,
           "micro_batches": 2}
    cost = TrainerCost(per_micro_batch_s=0.03, trial=3, searched={"lora_r": None},  # 0.03: pooled with another's
                       calibration=calibration(0.02, 2, 3).to_json(), measured=[own])
    assert TrainerCost.from_json(json.loads(json.dumps(cost.to_json()))) == cost
    assert cost.per_micro_batch_for({"lora_r": None, "batch_size": 4}) == 0.01  # its own
    assert cost.per_micro_batch_for({"lora_r": 16}) == 0.03 and len(cost.timed()) == 1


def test_a_trainer_cost_file_of_another_version_is_refused_with_the_way_on(tmp_path: Path) -> None:
    from trainfit.run_folder import RunFolder

    (tmp_path / TRAINER_COST_FILE).write_text(json.dumps({"schema_version": 2, "per_micro_batch_s": 0.01}))
    with pytest.raises(TrainfitError, match="a trainer cost has schema version 2") as err:
        RunFolder(tmp_path).trainer_cost  # noqa: B018 (read, and refused)
    assert "tune --calibrate N --resume" in str(err.value)


@pytest.mark.parametrize("overrides, words", [
    (["tune.command_template=python train.py --bs {batch_size}"], "tune.command_template"),
    (["model.factory=trainfit.workloads.mlp:build", "model.config=null", "tokenizer=null"], "a custom model"),
    (["params.nproc_per_node=2", "params.parallel=ddp"], "trains on 2 processes (nproc_per_node: 2)"),  # trainfit train runs one
])
def test_tune_calibrate_refuses_a_command_it_cannot_time_before_the_search(
        tmp_path: Path, capsys: Any, overrides: list[str], words: str) -> None:
    args = ["tune", str(EXAMPLES / "tiny-llama.yaml"), "--output", str(tmp_path / "run"), "--calibrate", "10",
            *(x for o in overrides for x in ("--set", o))]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert words in err and "drop --calibrate" in err
    assert not (tmp_path / "run" / "study.journal").exists()  # refused before any probe


def test_tune_calibrate_with_budgets_is_refused(tmp_path: Path, capsys: Any) -> None:
    assert main(["tune", str(EXAMPLES / "tiny-llama.yaml"), "--output", str(tmp_path / "run"), "--calibrate", "10",
                 "--budgets", "4,8"]) == 2
    assert "--calibrate and --budgets together" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_tune_calibrate_times_real_trl_steps_and_ranks_with_them(tmp_path: Path, capsys: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A real tune of two configs, then 2 + 12 real steps of its pick (nothing downloaded)."""
    pytest.importorskip("trl")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in ("/usr/bin", "/bin") if os.path.isdir(p)))
    out = tmp_path / "run"
    args = ["tune", str(EXAMPLES / "tiny-llama.yaml"), "--output", str(out), "--calibrate", "12",
            *(x for o in [*TWO_SPLITS, "probe.max_seconds=3", "probe.burn_in_steps=1", "probe.min_steps=2",
                          "probe.max_steps=4"] for x in ("--set", o))]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "calibration: run 1 of 2: `trl sft` for 2 steps" in printed
    assert "calibration: run 2 of 2: `trainfit train` for 14 steps" in printed
    assert "trainer cost" in printed and "real `trl sft` steps of trial" in printed
    s = Summary.from_json(json.loads((out / "summary.json").read_text()))
    assert s.trainer_cost is not None and s.trainer_cost.per_micro_batch_s >= 0
    c = Calibration.from_json(s.trainer_cost.calibration)
    assert c.steps == 12 and c.trial == s.trainer_cost.trial and c.model_step_s is not None
    assert s.trainer_cost.per_micro_batch_s == pytest.approx(c.step_overhead_s(1))
    assert json.loads((out / TRAINER_COST_FILE).read_text()) == s.trainer_cost.to_json()
    best = s.best_config
    assert best is not None and best.probe_samples_per_second is not None
    # Its steps (8 micro-batches at batch 1, or 1 at batch 8) with the measured cost of each micro-batch. A
    # step's samples are the probe's expected speed times its expected step: 8, less at batch 8 the epoch's last
    # partial batch spread over its steps (a loaded CI machine picked batch 8: 7.99 samples, not 8).
    from trainfit.plan.inputs import load_run

    [probed] = [c.measurement for c in load_run(out).candidates if c.trial == best.trial]
    work = probed.samples_per_second * probed.expected_step_time_s
    assert work == pytest.approx(8, rel=0.01)
    micro = best.config["gradient_accumulation_steps"]
    assert best.samples_per_second == pytest.approx(
        work / (work / best.probe_samples_per_second + micro * s.trainer_cost.per_micro_batch_s))
    assert f"(trial {best.trial})" in (out / "train_command.sh").read_text()


def test_on_a_gpu_tune_times_the_trainer_by_default_and_says_why_not_where_it_cannot(tmp_path: Path) -> None:
    """The trainer's own cost is as large as the step on a GPU: the written command is timed by
    default there (``--calibrate 0`` turns it off), never by default on a CPU."""
    import dataclasses

    from conftest import TINY_LLAMA, make_spec_file, write_texts

    from trainfit.tune import GPU_CALIBRATION_STEPS, calibration_steps

    data = tmp_path / "train.jsonl"
    write_texts(data, n=20)
    trl = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, data={"path": str(data)},
                                   params={"max_length": 64}))
    steps, note = calibration_steps(trl, "cuda:0", None)
    assert steps == GPU_CALIBRATION_STEPS and note is not None and "--calibrate 0" in note
    assert calibration_steps(trl, "cpu", None) == (None, None)
    assert calibration_steps(trl, "cuda:0", 0) == (None, None)
    assert calibration_steps(trl, "cpu", 12) == (12, None)
    templated = dataclasses.replace(trl, tune=dataclasses.replace(trl.tune, command_template="python train.py"))
    steps, note = calibration_steps(templated, "cuda:0", None)
    assert steps is None and note is not None and "command_template" in note


def test_a_calibration_nobody_asked_for_that_fails_leaves_the_search_ranked_by_the_probes(
        tmp_path: Path, monkeypatch: Any) -> None:
    """On a GPU ``tune`` calibrates by default: a failure there (trl refusing the data, say) must
    not turn a search that succeeded into an error; asked for with ``--calibrate N``, it does."""
    from conftest import TINY_LLAMA, make_spec_file, write_texts
    from tune_helpers import Surface

    import trainfit.tune.trainer_cost as calibrated_module

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise TrainfitError("trl refused the data", "fix the data")

    monkeypatch.setattr(calibrated_module, "time_pick", fails)  # the calibration itself: not what is tested here
    data = tmp_path / "train.jsonl"
    write_texts(data, n=20)
    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, data={"path": str(data)},
                                    params={"max_length": 64}, budget={"memory_gb": 40.0, "headroom_gb": 2.0}))
    lines: list[str] = []
    result = tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "quiet", probe_fn=Surface(),
                                                             calibrate_steps=30, calibration_optional=True,
                                                             on_calibration=lines.append))
    assert result.best is not None and not (tmp_path / "quiet" / TRAINER_COST_FILE).exists()
    assert lines == ["note: not calibrated, the ranking rests on the probes alone: trl refused the data"]
    with pytest.raises(TrainfitError, match="trl refused the data"):
        tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "asked", probe_fn=Surface(),
                                                        calibrate_steps=30))

    def breaks(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("seconds")  # a bug inside the calibration, not a refusal it words

    monkeypatch.setattr(calibrated_module, "time_pick", breaks)
    lines.clear()
    result = tune(with_tune(spec, max_trials=3), TuneOptions(output=tmp_path / "bug", probe_fn=Surface(),
                                                             calibrate_steps=30, calibration_optional=True,
                                                             on_calibration=lines.append))
    assert result.best is not None and (tmp_path / "bug" / "summary.json").is_file()
    assert lines == [f"note: not calibrated, the ranking rests on the probes alone: KeyError: 'seconds' (a trainfit "
                     f"bug: please report it with {tmp_path / 'bug'})"]


def test_gpu_speeds_without_the_trainers_cost_say_the_eta_is_a_lower_bound(tmp_path: Path) -> None:
    """On an H100 a Hugging Face Trainer epoch took 2.1x the probes' estimate (docs/benchmarks.md): a
    summary whose GPU speeds leave the trainer out says so; a CPU's, or one with the trainer's cost, does not."""
    from trainfit.tune.outputs import UNCALIBRATED_GPU_NOTE

    def on_gpu(params: Params, number: int) -> Measurement:
        return Measurement.from_dict({**measured(params, number).to_dict(), "device": "cuda:0"})

    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_SPLITS)
    gpu = tune(spec, TuneOptions(output=tmp_path / "gpu", probe_fn=on_gpu, stats=analyze_spec(spec, progress=False)))
    [note] = [n for n in gpu.summary.notes if n.note == UNCALIBRATED_GPU_NOTE]
    assert sorted(note.trials) == sorted(t.number for t in gpu.trials)
    _, _, cpu, _, _ = probed(tmp_path)
    assert all(n.note != UNCALIBRATED_GPU_NOTE for n in cpu.summary.notes)
    cost = TrainerCost(per_micro_batch_s=TRAINER_S, trial=gpu.trials[0].number, searched={"batch_size": 1},
                       calibration=calibration(8 * TRAINER_S, 8, gpu.trials[0].number).to_json())
    (tmp_path / "gpu" / TRAINER_COST_FILE).write_text(json.dumps(cost.to_json()))
    calibrated = tune(spec, TuneOptions(output=tmp_path / "gpu", probe_fn=on_gpu,
                                        stats=analyze_spec(spec, progress=False), resume=True))
    assert all(n.note != UNCALIBRATED_GPU_NOTE for n in calibrated.summary.notes)


def test_a_resume_keeps_the_default_calibration_of_a_pick_that_did_not_change(tmp_path: Path, monkeypatch: Any) -> None:
    """A calibration costs a trainer's start-up and its steps: the default one on a GPU runs again on a
    ``--resume`` only where the probes' pick changed (asked for with ``--calibrate N``, it always runs)."""
    import trainfit.tune.trainer_cost as calibrated_module

    timed: list[int] = []

    def fake_calibration(result: Any, steps: int, say: Any) -> TrainerCost:  # the calibration itself: test_calibration.py
        assert result.best is not None
        timed.append(result.best.number)
        # Light enough that the pick stays (a pick it moved is timed too: the test above).
        timed_on = {**calibration(TRAINER_S / 100, 1, result.best.number).to_json(), "device": result.summary.device}
        return TrainerCost(per_micro_batch_s=TRAINER_S / 100, trial=result.best.number,
                           searched=dict(result.best.values), calibration=timed_on)

    monkeypatch.setattr(calibrated_module, "time_pick", fake_calibration)
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_SPLITS)
    out = tmp_path / "run"
    lines: list[str] = []
    again(spec, out, resume=False, calibrate_steps=30, calibration_optional=True, on_calibration=lines.append)
    assert len(timed) == 1 and (out / TRAINER_COST_FILE).is_file()
    resumed = again(spec, out, calibrate_steps=30, calibration_optional=True, on_calibration=lines.append)
    assert len(timed) == 1 and resumed.summary.trainer_cost is not None
    assert lines[-1].startswith(f"kept: the trainer's cost timed on trial {timed[0]}, the probes' pick still")
    again(spec, out, calibrate_steps=30, on_calibration=lines.append)  # --calibrate 30: asked for, timed again
    assert len(timed) == 2
    (out / TRAINER_COST_FILE).write_text("{")  # damaged: timed again rather than refused
    again(spec, out, calibrate_steps=30, calibration_optional=True, on_calibration=lines.append)
    assert len(timed) == 3
    kept = json.loads((out / TRAINER_COST_FILE).read_text())
    for stale in ({"trial": kept["trial"] + 1},  # timed on another pick
                  {"calibration": {**kept["calibration"], "device": "NVIDIA A10G"}}):  # on another GPU
        (out / TRAINER_COST_FILE).write_text(json.dumps({**kept, **stale}))
        again(spec, out, calibrate_steps=30, calibration_optional=True, on_calibration=lines.append)
    assert len(timed) == 5


def test_tune_budgets_on_a_gpu_says_it_is_not_calibrated(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    import argparse

    from conftest import TINY_LLAMA, make_spec_file, write_texts

    import trainfit.cli.tune as cli_tune
    from trainfit.cli.tune import print_plan
    from trainfit.tune import resolve

    data = tmp_path / "train.jsonl"
    write_texts(data, n=20)
    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, data={"path": str(data)},
                                    params={"max_length": 64}))
    monkeypatch.setattr(cli_tune, "resolve_device_name", lambda device: "cuda:0")  # what a GPU machine resolves
    plan = resolve(spec, TuneOptions(output=tmp_path / "out", calibrate_steps=0))  # as the CLI's --budgets resolves
    print_plan(argparse.Namespace(budgets="8,16", calibrate=None, spec=spec.source), plan)
    assert "not calibrated (--budgets" in capsys.readouterr().out
    print_plan(argparse.Namespace(budgets="8,16", calibrate=0, spec=spec.source), plan)  # --calibrate 0: nothing said
    assert "not calibrated" not in capsys.readouterr().out


def test_a_calibration_prices_the_timed_steps_with_the_probes_wait_for_data(tmp_path: Path, monkeypatch: Any) -> None:
    """The trainer's own cost is the timed step less what the pick's probe priced it at: the model's
    step and its wait for data. Every config's expected step holds its wait already, so a price of
    the model's step alone counted the wait twice (once in the trainer's cost)."""
    import trainfit.tune.trainer_cost as calibrated_module
    from trainfit.plan.inputs import best_step_cost

    priced_with: list[Any] = []

    def calibrate(output: Path, steps: int, **kwargs: Any) -> Any:  # stops where the price is given
        priced_with.append(kwargs["step_cost"])
        raise TrainfitError("stopped after the price", "")

    def probe(params: Params, number: int) -> Measurement:
        shapes = [{"rows": 1, "padded_length": n, "real_tokens": n, "seconds": n / 640, "steps": 2, "phase": "timed"}
                  for n in (64, 128, 256)]
        return Measurement.from_dict({**measured(params, number).to_dict(), "shape_times": shapes,
                                      "data_wait_s": 0.02})

    monkeypatch.setattr(calibrated_module, "calibrate", calibrate)
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", TWO_SPLITS)
    tune(spec, TuneOptions(output=tmp_path / "run", probe_fn=probe, calibrate_steps=5, calibration_optional=True))
    [cost] = priced_with
    assert float(cost(128)) == pytest.approx(128 / 640 + 0.02, rel=1e-6)
    assert float(best_step_cost(tmp_path / "run")(128)) == pytest.approx(128 / 640 + 0.02, rel=1e-6)  # plan's too


def test_calibrate_0_ranks_by_the_probes_alone_and_keeps_the_stored_cost(tmp_path: Path) -> None:
    """An explicit --calibrate 0 on a resume: no stored trainer cost applied this time; the file stays."""
    spec, out, _, _, _ = probed(tmp_path)
    assert again(spec, out).summary.trainer_cost is not None  # a resume without the flag applies it
    assert again(spec, out, calibrate_steps=0).summary.trainer_cost is None and (out / TRAINER_COST_FILE).is_file()


def test_a_trainer_cost_lengthens_the_step_the_probes_interval_is_a_share_of() -> None:
    """Two probes 4% apart, each +-2%: told apart. With a trainer cost as long as the step the
    speeds are 2% apart, and each probe's interval (of the model's step, in seconds) is now a share
    of a step twice as long: still told apart, not listed as a tie."""
    from trainfit.search.ranking import ranked, within_noise
    from trainfit.search.trials import Trial

    def trial(number: int, sps: float) -> Trial:
        m = Measurement(status="ok", config={"batch_size": 100}, samples_per_second=sps, expected_step_time_s=100 / sps,
                        step_time_ci95_rel=0.02, peak_memory_bytes=2**30)
        return Trial(number=number, values={"batch_size": 100}, measurement=m, objective=sps)

    trials = [trial(0, 100.0), trial(1, 96.0)]
    assert within_noise(ranked(trials)) == []
    order = ranked(trials, trainer_s=1.0)
    assert within_noise(order, trainer_s=1.0) == []
