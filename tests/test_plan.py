"""``trainfit plan``: the priorities as rules over measured configs, the ETA and its parts, the
options when a run does not fit, and the command on a real tune folder (integration)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_LLAMA, make_spec_file

from trainfit.cli import main
from trainfit.errors import TrainfitError
from trainfit.format import format_duration as dur
from trainfit.params import Params
from trainfit.plan import Plan, planned_command
from trainfit.plan.choose import choose
from trainfit.plan.eta import Eta, checkpoint_bytes, estimate, write_speed
from trainfit.plan.eval_pass import Evaluation
from trainfit.plan.inputs import Candidate, load_run
from trainfit.plan.options import fewer_epochs, shorter_max_length, subset
from trainfit.tune.options import TuneOptions

FAST_DISK = 1e9  # bytes/s: checkpoints cost ~nothing in the tests of the rules


def candidate(trial: int, sps: float, *, lora_r: int | None = 8, peak: float = 10.0, max_length: int = 512,
              batch: int = 8, spread: float = 0.02, shapes: list[dict] | None = None) -> Candidate:
    return Candidate(trial=trial, searched={"batch_size": batch, "lora_r": lora_r},
                     config={"batch_size": batch, "lora_r": lora_r, "max_length": max_length,
                             "gradient_accumulation_steps": 1},
                     samples_per_second=sps, step_time_s=batch / sps, samples_per_step=batch, spread_rel=spread,
                     peak_gb=peak, optimizer_gb=0.1, model_gb=2.0, shape_times=shapes or [])


def eta_of(samples: int, every_s: float = 1800.0):
    return lambda c, n=samples: estimate(c, n, write_bytes_per_s=FAST_DISK, checkpoint_every_s=every_s)


# Fastest first, as load_run orders them: A fastest; B within 10% with a larger rank; C within 10%
# with the lowest peak; D full fine-tuning at half the speed.
A, B, C, D = (candidate(0, 100.0, lora_r=8, peak=10.0), candidate(1, 95.0, lora_r=16, peak=12.0),
              candidate(2, 92.0, lora_r=8, peak=6.0), candidate(3, 50.0, lora_r=None, peak=20.0))
ALL = [A, B, C, D]


@pytest.mark.parametrize(("priority", "window_s", "picked"), [
    ("fast", 1e9, A),
    ("balanced", 1e9, B),  # the highest capacity within 10% of the fastest
    ("memory_efficient", 1e9, C),  # the lowest peak within 10% of the fastest
    ("quality", 1e9, D),  # full fine-tuning, as its run fits
    ("quality", 150.0, B),  # D's 200 s do not fit 150 s: the highest capacity whose run does
])
def test_each_priority_is_a_rule_over_the_measured_configs(priority: str, window_s: float, picked: Candidate) -> None:
    assert choose(priority, ALL, eta_of(10_000), window_s) == picked


def test_a_run_of_several_epochs_pays_its_padded_lengths_first_sight_once() -> None:
    """The probe's step shares out one epoch's first sights (40 lengths at 0.05 s): a later epoch
    meets no new length, so 3 epochs take 3 epochs of warm steps and the first sights once."""
    c = dataclasses.replace(candidate(0, 10.0, batch=8), first_sight_s=0.05, first_sights_s=2.0, epoch_shapes=40)
    one = estimate(c, 1_000, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e9, epochs=1.0)
    three = estimate(c, 3_000, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e9, epochs=3.0)
    assert one.train_s == pytest.approx(125 * 0.8)
    assert three.train_s == pytest.approx(3 * (125 * 0.8 - 2.0) + 2.0)
    assert three.for_steps(125, checkpoint_every_s=1e9, evaluation=None, epochs=3.0).train_s == pytest.approx(100.0)
    # A run of 10 steps of one micro-batch meets at most 10 of the 40 lengths: it pays those, not the epoch's.
    short = estimate(c, 80, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e9, epochs=0.08)
    assert short.train_s == pytest.approx(10 * 0.8 - 2.0 * 0.08 + (2.0 - 30 * 0.05))
    assert three.for_steps(10, checkpoint_every_s=1e9, evaluation=None, epochs=3.0).train_s == pytest.approx(
        short.train_s)


def test_the_eta_is_the_steps_at_the_measured_step_plus_the_saves_with_an_interval() -> None:
    c = candidate(0, 10.0, batch=8, spread=0.05)  # 0.8 s a step
    e = estimate(c, 1_000, write_bytes_per_s=2**20, checkpoint_every_s=30.0)
    assert e.steps == 125 and e.train_s == pytest.approx(100.0)
    assert e.checkpoints == math.ceil(100.0 / 30.0)
    assert e.checkpoint_s == pytest.approx(4 * checkpoint_bytes(c) / 2**20)
    assert e.total_s == pytest.approx(e.train_s + e.checkpoint_s)
    assert (e.low_s, e.high_s) == (pytest.approx(95.0 + e.checkpoint_s), pytest.approx(105.0 + e.checkpoint_s))
    assert e.trainer_overhead_s is None


def test_a_calibration_adds_the_trainers_cost_per_step_and_its_start_up() -> None:
    from trainfit.trainer.calibration import Calibration

    c = candidate(0, 10.0, batch=8, spread=0.03)  # 0.8 s a step in the probe
    # The trainer ran the calibrated config at 1.0 s a step where its probe said 0.8: 0.2 s its own.
    cal = Calibration(steps=20, seconds_per_step=1.0, samples_per_second=8.0, probe_samples_per_second=10.0,
                      ratio=0.8, spread_rel=0.04, startup_s=12.0, command="trl sft ...", device="cpu")
    e = estimate(c, 1_000, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e9, calibration=cal)
    assert e.trainer_overhead_s == pytest.approx(0.2) and e.step_time_s == pytest.approx(1.0)
    assert e.train_s == pytest.approx(125.0) and e.startup_s == 12.0
    assert e.total_s == pytest.approx(125.0 + 12.0 + e.checkpoint_s)
    assert e.spread_rel == pytest.approx(0.05)  # the probe's 3% and the calibration's 4%, combined
    assert e.high_s - e.total_s == pytest.approx(125.0 * 0.05)
    assert e.command_startup_s == 12.0 and e.command_total_s == pytest.approx(e.total_s)  # one start-up measured


def test_trainfit_train_and_the_written_command_are_each_priced_at_their_own_start_up() -> None:
    from trainfit.trainer.calibration import Calibration

    cal = Calibration(steps=20, seconds_per_step=1.0, samples_per_second=8.0, probe_samples_per_second=10.0,
                      ratio=0.8, spread_rel=0.04, startup_s=11.0, train_startup_s=6.5, command="trl sft ...",
                      device="cpu")
    e = estimate(candidate(0, 10.0, batch=8, spread=0.03), 1_000, write_bytes_per_s=FAST_DISK,
                 checkpoint_every_s=1e9, calibration=cal)
    assert e.startup_s == 6.5 and e.total_s == pytest.approx(125.0 + 6.5 + e.checkpoint_s)
    assert e.command_startup_s == 11.0 and e.command_total_s == pytest.approx(125.0 + 11.0 + e.checkpoint_s)
    assert Eta.from_json(json.loads(json.dumps(e.to_json()))) == e


def test_a_calibration_whose_spread_is_unknown_leaves_the_interval_to_the_probe() -> None:
    from trainfit.trainer.calibration import Calibration

    cal = Calibration(steps=2, seconds_per_step=1.0, samples_per_second=8.0, probe_samples_per_second=10.0,
                      ratio=0.8, spread_rel=math.inf, startup_s=5.0, command="trl sft ...", device="cpu")
    e = estimate(candidate(0, 10.0, spread=0.03), 800, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e9,
                 calibration=cal)
    assert e.spread_rel == pytest.approx(0.03) and math.isfinite(e.high_s)
    assert json.loads(json.dumps(e.to_json(), allow_nan=False)) == e.to_json()  # valid JSON, no Infinity


def test_a_faster_config_says_whether_it_changes_what_is_learned() -> None:
    from trainfit.plan.options import faster_config, ranked

    quality, same_kind, other_rank = candidate(0, 50.0, lora_r=16), candidate(1, 100.0, lora_r=16, batch=16), \
        candidate(2, 100.0, lora_r=8)
    eta = eta_of(1_000)
    kept = faster_config(quality, same_kind, 1_000, 1e9, eta)
    changed = faster_config(quality, other_rank, 1_000, 1e9, eta)
    assert kept is not None and kept.cost.startswith("nothing learned changes") and kept.change == "use batch_size=16"
    assert changed is not None and changed.cost.startswith("changes what is learned (lora_r)")
    assert faster_config(quality, quality, 1_000, 1e9, eta) is None  # the chosen one is the fastest
    shorter = fewer_epochs(quality, 1_000, 3, 1e9, eta)
    assert [o.trial for o in ranked([changed, shorter, kept])] == [1, 2, 0]


def test_a_lora_checkpoint_holds_the_optimizer_state_and_the_adapters_a_full_one_the_model() -> None:
    lora, full = candidate(0, 10.0, lora_r=8), candidate(1, 10.0, lora_r=None)
    assert checkpoint_bytes(lora) == int(0.1 * 2**30 * 1.5)
    assert checkpoint_bytes(full) == int((0.1 + 2.0) * 2**30)


def test_fewer_epochs_and_a_subset_are_the_most_that_fit() -> None:
    c = candidate(0, 10.0, batch=10, spread=0.0)  # 1 s a step, 10 samples/s
    eta = eta_of(0, every_s=1e9)
    window = 250.0  # 2,500 samples of training
    epochs = fewer_epochs(c, 1_000, 3, window, eta)
    assert epochs is not None and epochs.change == "train 2 epochs instead of 3" and epochs.eta.fits(window)
    assert epochs.flags == "--num_train_epochs 2"
    part = subset(c, 1_000, 3, window, eta)
    assert part is not None and part.eta.fits(window)
    low = part.eta.samples // 3
    assert 820 <= low <= 833  # 833 samples x 3 epochs fit, to the search's resolution (1 sample in 1,000)
    assert not eta(c, int((low + 10) * 3)).fits(window)
    assert part.flags == f"--max_steps {math.ceil(low * 3 / 10)}"  # a subset is a step count to trl sft
    assert fewer_epochs(c, 1_000, 3, 50.0, eta) is None  # not even one epoch fits


def test_a_shorter_max_length_is_priced_by_the_fitted_step_cost_and_says_what_it_truncates() -> None:
    lengths = np.random.default_rng(0).lognormal(4.5, 0.8, 2_000).astype(int) + 1
    shapes = [{"padded_length": n, "seconds": 0.01 + 2e-4 * n} for n in (64, 128, 256, 512)]  # per step, batch 8
    c = candidate(0, 100.0, batch=8, max_length=1024, shapes=shapes)
    options = shorter_max_length(c, Params(max_length=1024), lengths.tolist(), 0, 8_000, 1e9, eta_of(8_000))
    assert [o.kind for o in options] == ["shorter_max_length"] * len(options) and options
    times = [o.eta.train_s for o in options]
    assert times == sorted(times, reverse=True)  # shorter max_length, shorter run
    for o in options:
        length = int(o.change.split()[1])
        assert length % 64 == 0 and length < 1024
        assert f"{np.mean(lengths > length):.1%}" in o.cost and o.flags == f"--max_length {length}"


def test_the_disk_write_speed_is_measured_on_the_output_folder(tmp_path: Path) -> None:
    assert write_speed(tmp_path, 4 * 2**20) > 0
    assert not list(tmp_path.iterdir())  # the timing file is gone


def test_the_planned_command_trains_the_plans_epochs_and_checkpoints_on_its_interval() -> None:
    cmd = "trl sft --model_name_or_path m --num_train_epochs 1 --output_dir trainfit-run"
    assert planned_command(cmd, 3, 120) == ("trl sft --model_name_or_path m --num_train_epochs 3 --output_dir "
                                            "trainfit-run --save_strategy steps --save_steps 120 --save_total_limit 3")
    assert planned_command("python train.py --bs 8", 3, 120, template=True) == "python train.py --bs 8"  # as written
    assert planned_command(None, 3, 120) is None


def evaluation(every: int | None, pass_s: float = 2.0, spread: float = 0.1) -> Evaluation:
    return Evaluation(path="eval.jsonl", every=every, batch_size=4, samples=40, batches=10, padding_share=0.0,
                      pass_s=pass_s, spread_rel=spread, trial=0, shapes=[])


def test_evaluation_passes_fall_where_the_trainer_runs_them() -> None:
    assert evaluation(10).passes(100, 1.0) == 10  # at steps 10, 20, ..., 100
    assert evaluation(10).passes(101, 1.0) == 11  # ... and after the last step, which is no multiple of 10
    assert evaluation(None).passes(300, 3.0) == 3 and evaluation(None).passes(150, 1.5) == 2  # each epoch's end
    assert evaluation(10).trl_args() == ["--eval_strategy", "steps", "--eval_steps", "10",
                                         "--per_device_eval_batch_size", "4", "--dataset_test_split", "test"]


def test_the_eta_adds_each_evaluation_pass_with_its_own_spread() -> None:
    c = candidate(0, 10.0, batch=8, spread=0.05)  # 0.8 s a step, 125 steps: 100 s
    e = estimate(c, 1_000, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e9, evaluation=evaluation(50), epochs=1.0)
    assert e.evals == 3 and e.eval_s == pytest.approx(6.0)  # steps 50, 100 and the last (125): 3 x 2 s
    assert e.total_s == pytest.approx(100.0 + 6.0 + e.checkpoint_s)
    assert e.high_s == pytest.approx(105.0 + 6.6 + e.checkpoint_s) and e.low_s == pytest.approx(95.0 + 5.4 + e.checkpoint_s)
    twice = estimate(c, 2_000, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e9, evaluation=evaluation(None),
                     epochs=2.0)
    assert twice.evals == 2 and twice.eval_s == pytest.approx(4.0)
    assert Eta.from_json(e.to_json()) == e


def test_the_planned_command_evaluates_on_the_eval_split_of_a_dataset_folder_trls_parser_accepts(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from trainfit.train.sft import parse

    cmd = ("OMP_NUM_THREADS=2 trl sft --model_name_or_path m --config /runs/a/trl_data.yaml --dataset_text_field text "
           "--bf16 false --use_cpu true --num_train_epochs 1 --output_dir trainfit-run")
    folder = tmp_path / "with space" / "trl_dataset"
    planned = planned_command(cmd, 2, 50, evaluation=(evaluation(25), folder))
    assert planned is not None and "--config" not in planned
    import shlex

    words = shlex.split(planned)
    script, training, _, _ = parse(words[3:])
    assert script.dataset_name == str(folder) and script.dataset_test_split == "test"
    assert training.eval_strategy == "steps" and training.eval_steps == 25 and training.per_device_eval_batch_size == 4
    assert training.num_train_epochs == 2 and training.save_steps == 50


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tune of the tiny Llama (four configs, each a real probe), with the bundled tokenizer
    (saved beside the random-init model, so the written `trl sft` command runs)."""
    from conftest import EXAMPLES, write_texts

    root = tmp_path_factory.mktemp("plan")
    data = root / "train.jsonl"
    write_texts(data)
    spec = make_spec_file(root, model={"config": {**TINY_LLAMA, "vocab_size": 2000}},
                          data={"path": str(data), "text_field": "text"}, params={"max_length": 64})
    spec.write_text(spec.read_text() + f"tokenizer: {EXAMPLES / 'data' / 'tokenizer.json'}\n"
                    "search:\n  batch_size: [1, 4]\n  lora_r: [null, 4]\n")
    out = root / "out"
    assert main(["tune", str(spec), "--output", str(out), "--strategy", "grid"]) == 0
    return out


@pytest.mark.integration
def test_plan_of_a_real_tune_writes_a_plan_that_reads_back_and_fits(tune_dir: Path, capsys) -> None:
    assert main(["plan", str(tune_dir), "--max-hours", "10", "--epochs", "2", "--priority", "fast"]) == 0
    printed = capsys.readouterr().out
    plan = Plan.from_json(json.loads((tune_dir / "plan.json").read_text()))
    assert plan.fits and plan.to_json() == json.loads((tune_dir / "plan.json").read_text())
    summary = json.loads((tune_dir / "summary.json").read_text())
    assert plan.trial == summary["best_config"]["trial"]  # fast: tune's own pick
    assert plan.eta.samples == 2 * summary["dataset_samples"]
    # The step shares out an epoch's first sights of new lengths; the run of 2 epochs pays them once.
    chosen = next(c for c in load_run(tune_dir).candidates if c.trial == plan.trial)
    assert plan.eta.first_sights.epoch_s == chosen.first_sights_s >= 0
    assert plan.eta.first_sights.shapes == chosen.epoch_shapes > 0
    assert plan.eta.train_s == pytest.approx(plan.eta.steps * plan.eta.step_time_s - plan.eta.first_sights.epoch_s)
    assert [c.priority for c in plan.priorities] == ["fast", "balanced", "quality", "memory_efficient"]
    assert "not calibrated" in " ".join(plan.rests_on)
    assert plan.command is not None and "--num_train_epochs 2" in plan.command and "--save_steps" in plan.command
    assert "FITS" in printed and (tune_dir / "plan.txt").read_text().startswith("PLAN: 2 epochs of 200 samples")
    assert "note: this plan trains trial" not in printed  # the tune's pick: train_command.sh runs it
    for priority in ("quality", "memory_efficient"):  # where a priority picks another, the plan says which to run
        assert main(["plan", str(tune_dir), "--max-hours", "10", "--priority", priority]) == 0
        other = json.loads((tune_dir / "plan.json").read_text())["trial"]
        note = f"note: this plan trains trial {other}, the one priority {priority} picks ("
        assert (note in capsys.readouterr().out) == (other != summary["best_config"]["trial"]), priority
    # report.html gains the plan's section; a second plan replaces it
    assert main(["plan", str(tune_dir), "--max-hours", "5", "--epochs", "1"]) == 0
    page = (tune_dir / "report.html").read_text()
    assert page.count("<h3>Plan:") == 1 and "<h3>Plan: 1 epoch(s) in 5 h" in page and page.index("Plan:") < page.index(
        "<h3>Trials</h3>")
    assert "the spec's tune.epochs" not in capsys.readouterr().out  # --epochs given
    assert main(["plan", str(tune_dir), "--max-hours", "5"]) == 0  # the count from the spec: said where it came from
    assert "(1: the spec's tune.epochs; --epochs N plans another count)" in capsys.readouterr().out.splitlines()[1]


@pytest.mark.integration
def test_a_run_that_does_not_fit_gets_options_that_each_fit(tune_dir: Path, capsys) -> None:
    fastest = json.loads((tune_dir / "summary.json").read_text())["best_config"]["samples_per_second"]
    hours = 200 * 50 / fastest / 3600 / 4  # a quarter of 50 epochs' time
    assert main(["plan", str(tune_dir), "--max-hours", f"{hours:.6f}", "--margin-minutes", "0",
                 "--epochs", "50", "--priority", "quality"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    plan = Plan.from_json(json.loads((tune_dir / "plan.json").read_text()))
    assert not plan.fits and plan.options
    assert all(o.eta.fits(plan.window_s) for o in plan.options)
    assert {"fewer_epochs", "subset"} <= {o.kind for o in plan.options}
    # A window shorter than one step, or a margin that eats the window: errors that say what to change.
    assert main(["plan", str(tune_dir), "--max-hours", "0.0000001", "--margin-minutes", "0"]) == 2
    err = capsys.readouterr().err
    assert "shorter than one optimizer step of any measured config" in err and "more --max-hours" in err
    assert main(["plan", str(tune_dir), "--max-hours", "1", "--margin-minutes", "60"]) == 2
    assert "leaves no time in a 1 h window" in capsys.readouterr().err


@pytest.mark.integration
def test_a_run_with_room_to_spare_is_offered_the_quality_config_a_longer_max_length_and_more_epochs(
        tune_dir: Path, tmp_path: Path, capsys) -> None:
    """Guide 002: a run of under half its window could buy quality. Each option fits, with its ETA;
    the quality config and more epochs apply; a longer max_length, whose memory was not measured, is
    refused with the way on."""
    run = tmp_path / "run"
    shutil.copytree(tune_dir, run)
    assert main(["plan", str(run), "--max-hours", "10", "--epochs", "1", "--priority", "fast"]) == 0
    printed = capsys.readouterr().out
    plan = Plan.from_json(json.loads((run / "plan.json").read_text()))
    assert plan.fits and "room to spare (the run takes under half the window)" in printed
    # the quality priority's pick, where it is another config (which is the fastest varies on a busy CPU)
    quality = next(c.trial for c in plan.priorities if c.priority == "quality")
    offered = ["quality_config"] if quality != plan.trial else []
    kinds = [o.kind for o in plan.options]
    assert kinds == [*offered, "longer_max_length", "longer_max_length", "more_epochs"]
    assert all(o.eta.fits(plan.window_s) and o.eta.total_s >= plan.eta.total_s for o in plan.options), printed
    if offered:
        assert plan.options[0].trial == quality and plan.options[0].sets == {"trial": quality}
    n_longer, n_more = len(offered) + 1, len(plan.options)
    longer = plan.options[n_longer - 1]
    assert longer.sets["max_length"] > plan.config["max_length"] and "probe it first" in longer.cost
    assert plan.options[-1].sets == {"epochs": 5}  # up to 5 passes (the guide's 4-5 for a small dataset)
    common = ["--max-hours", "10", "--epochs", "1", "--priority", "fast"]
    assert main(["plan", str(run), *common, "--apply", str(n_more)]) == 0
    assert Plan.from_json(json.loads((run / "plan.json").read_text())).epochs == 5
    if offered:
        assert main(["plan", str(run), *common, "--apply", "1"]) == 0
        assert Plan.from_json(json.loads((run / "plan.json").read_text())).trial == quality
    capsys.readouterr()
    assert main(["plan", str(run), *common, "--apply", str(n_longer)]) == 2
    assert f"tune it first (trainfit tune SPEC --set max_length={longer.sets['max_length']})" in capsys.readouterr().err
    # The spec's plan: section, as the tune recorded it, stands in for the flags not given.
    summary = json.loads((run / "summary.json").read_text())
    assert summary["spec"]["plan"] == {"max_hours": None, "priority": "balanced", "margin_minutes": 30.0,
                                       "checkpoint_minutes": 30.0}
    summary["spec"]["plan"] = {"max_hours": 3, "priority": "memory_efficient", "margin_minutes": 0}
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["plan", str(run)]) == 0
    plan = Plan.from_json(json.loads((run / "plan.json").read_text()))
    assert (plan.max_hours, plan.window_s, plan.priority) == (3, 3 * 3600, "memory_efficient")


@pytest.mark.integration
def test_each_option_applied_is_a_plan_that_fits_and_train_runs_exactly_that(tune_dir: Path, tmp_path: Path,
                                                                              capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(tune_dir, run)
    # balanced: a pick that does not depend on the window (quality's takes one that fits where one does)
    assert main(["plan", str(run), "--max-hours", "10", "--epochs", "2", "--priority", "balanced"]) == 0
    whole = Plan.from_json(json.loads((run / "plan.json").read_text()))
    # 3/4 of the 2 epochs' ETA at its interval's high end: 2 epochs do not fit, 1 does, however noisy the probe
    window = ["--max-hours", f"{whole.eta.high_s * 0.75 / 3600:.8f}", "--margin-minutes", "0", "--epochs", "2",
              "--priority", "balanced"]
    assert main(["plan", str(run), *window]) == 1
    over = Plan.from_json(json.loads((run / "plan.json").read_text()))
    assert {"fewer_epochs", "subset"} <= {o.kind for o in over.options}
    capsys.readouterr()
    applied = {}
    for n, option in enumerate(over.options, 1):
        assert main(["plan", str(run), *window, "--apply", str(n)]) == 0, capsys.readouterr().err
        plan = Plan.from_json(json.loads((run / "plan.json").read_text()))
        # planned again to apply it: the same option (its ETA's disk write timed again)
        assert plan.fits and plan.applied is not None and not plan.options
        assert (plan.applied.kind, plan.applied.sets) == (option.kind, option.sets)
        assert f"option {n} applied: {plan.applied.change}" in capsys.readouterr().out
        applied[option.kind] = plan
        assert plan.command is not None and f"--save_steps {plan.save_steps}" in plan.command
        if option.kind == "faster_config":
            assert plan.trial == option.trial != over.trial  # planned anew for that config
            continue
        assert plan.eta == plan.applied.eta and plan.trial == over.trial
        for flag in option.flags.split(" --"):
            assert f"--{flag.lstrip('-')}" in plan.command
    assert applied["fewer_epochs"].epochs == 1 and "--num_train_epochs 1 " in applied["fewer_epochs"].command + " "
    subset = applied["subset"]
    assert subset.max_steps == subset.eta.steps and subset.epochs == 2
    # No such option, or a plan that fits: nothing to apply, said with the way on.
    capsys.readouterr()
    assert main(["plan", str(run), *window, "--apply", "99"]) == 2
    err = capsys.readouterr().err
    assert f"the plan lists {len(over.options)} option(s): 1. {over.options[0].change}" in err
    no_room = ["--max-hours", f"{whole.eta.high_s * 1.5 / 3600:.8f}", "--margin-minutes", "0", "--epochs", "2"]
    assert main(["plan", str(run), *no_room, "--apply", "1"]) == 2
    assert "with less than half of it to spare, so the plan lists no option" in capsys.readouterr().err
    # The subset's plan is what train runs: its steps, and its actual time written as the plan's.
    assert main(["plan", str(run), *window, "--apply", str(list(applied).index("subset") + 1)]) == 0
    trained = Plan.from_json(json.loads((run / "plan.json").read_text()))
    assert main(["train", str(run), "--output", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "train_result.json").read_text())
    assert result["step"] == result["max_steps"] == trained.max_steps == subset.max_steps
    assert json.loads((run / "actual.json").read_text())["planned_s"] == trained.eta.total_s

    # A shorter max_length changes the config and the command; a faster config is planned anew for its
    # trial; your command template is run as written, so an option it would need is refused.
    from trainfit.plan.apply import apply_option

    base = over.options[0]
    shorter = dataclasses.replace(base, kind="shorter_max_length", change="max_length 32 instead of 64",
                                  flags="--max_length 32", sets={"max_length": 32})
    cut = apply_option(dataclasses.replace(over, options=[shorter]), 1, replan=lambda trial: pytest.fail(trial))
    assert cut.config["max_length"] == 32 and "--max_length 32 " in cut.command and "--max_length 64" not in cut.command
    assert cut.epochs == over.epochs and cut.eta == base.eta and cut.priorities == []
    for kind, change in (("faster_config", "use batch_size=1"), ("quality_config", "use lora_r=None (the quality ...)")):
        other = dataclasses.replace(base, kind=kind, change=change, sets={"trial": 0})
        asked: list[int] = []
        planned = apply_option(dataclasses.replace(over, options=[other]), 1, replan=lambda trial: (
            asked.append(trial), dataclasses.replace(over, trial=trial, options=[]))[1])
        assert asked == [0] and planned.trial == 0 and planned.applied == other  # planned anew for that trial
        assert planned.rule == (f"option 1 of the plan before: {change}, in place of trial {over.trial}, the one "
                                f"priority {over.priority} picks")
        assert planned.rests_on[-1] == f"option 1 applied: {change} ({other.cost})"
    template = dataclasses.replace(over, options=[base], command="python train.py --epochs 3")
    with pytest.raises(TrainfitError, match="tune.command_template, which trainfit runs as written"):
        apply_option(template, 1, replan=lambda trial: pytest.fail(trial))


@pytest.mark.integration
@pytest.mark.slow
def test_a_calibrated_plan_prints_valid_json_and_adds_the_trainers_cost(tune_dir: Path, capsys) -> None:
    assert main(["plan", str(tune_dir), "--max-hours", "10", "--epochs", "1", "--calibrate", "20", "--json"]) == 0
    captured = capsys.readouterr()
    plan = Plan.from_json(json.loads(captured.out))  # stdout is the plan alone: progress went to stderr
    assert "calibrating: 20 real trainer steps" in captured.err
    assert plan.calibration is not None and plan.calibration["steps"] == 20
    assert plan.eta.startup_s is not None and plan.eta.startup_s > 0 and plan.eta.trainer_overhead_s is not None
    assert plan.eta.total_s == pytest.approx(plan.eta.train_s + plan.eta.startup_s + plan.eta.checkpoint_s)
    assert plan.eta.startup_s == plan.calibration["train_startup_s"]  # `trainfit train`'s, measured by its own run
    assert plan.eta.command_startup_s == plan.calibration["startup_s"]
    from trainfit.plan.outputs import render

    assert "the written command, with its own start-up: ETA" in render(plan)
    moved = render(dataclasses.replace(plan, run_dir="runs/tune a"))  # a folder with a space: quoted
    assert "watched against this plan: trainfit train 'runs/tune a'" in moved


@pytest.mark.integration
def test_an_eval_set_is_timed_forward_only_priced_into_the_eta_and_given_to_the_command(
        tune_dir: Path, tmp_path: Path, capsys) -> None:
    from conftest import write_texts
    from datasets import load_dataset  # type: ignore[import-untyped]

    eval_data = tmp_path / "eval.jsonl"
    write_texts(eval_data, n=30)
    import os

    assert main(["plan", str(tune_dir), "--max-hours", "10", "--epochs", "1", "--priority", "fast",
                 "--eval-data", os.path.relpath(eval_data), "--eval-every", "7", "--eval-batch-size", "4"]) == 0
    printed = capsys.readouterr().out
    plan = Plan.from_json(json.loads((tune_dir / "plan.json").read_text()))
    ev = plan.evaluation
    assert ev is not None and ev.samples == 30 and ev.batches == 8 and ev.batch_size == 4 and ev.every == 7
    assert ev.path == str(eval_data.resolve())  # given relative: written absolute, for a run started elsewhere
    assert ev.trial == plan.trial and ev.pass_s > 0 and ev.shapes and all(s["seconds"] > 0 for s in ev.shapes)
    assert {s["rows"] for s in ev.shapes} <= {4, 2}  # 30 samples in file order: seven batches of 4, one of 2
    assert plan.eta.evals == math.ceil(plan.eta.steps / 7) and plan.eta.eval_s == pytest.approx(plan.eta.evals * ev.pass_s)
    assert plan.eta.total_s == pytest.approx(plan.eta.train_s + plan.eta.eval_s + plan.eta.checkpoint_s)
    assert "evaluation" in printed and "timed forward-only" in printed
    assert plan.command is not None and "--eval_steps 7" in plan.command
    assert f"--dataset_name {tune_dir / 'trl_dataset'}" in plan.command
    splits = load_dataset(str(tune_dir / "trl_dataset"))  # what `trl sft --dataset_name` reads
    summary = json.loads((tune_dir / "summary.json").read_text())
    assert splits["train"].num_rows == summary["dataset_samples"] and splits["test"].num_rows == 30

    assert main(["plan", str(tune_dir), "--max-hours", "10", "--eval-every", "5"]) == 2
    assert "--eval-data" in capsys.readouterr().err  # a schedule without an eval set
    assert main(["plan", str(tune_dir), "--max-hours", "10", "--eval-data", str(tmp_path / "nope.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", str(tune_dir), "--max-hours", "10", "--eval-data", str(eval_data), "--eval-every", "often"])
    assert "'epoch'" in capsys.readouterr().err


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["plan", str(tmp_path), "--max-hours", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds no summary.json" in err and "Traceback" not in err
    for stamp in ("20261124-101500", "20261125-090000"):  # the parent of tune folders: the newest is named
        (tmp_path / stamp).mkdir()
        (tmp_path / stamp / "summary.json").write_text("{}")
    os.utime(tmp_path / "20261124-101500" / "summary.json", (1, 1))
    assert main(["plan", str(tmp_path), "--max-hours", "2"]) == 2
    assert f"the newest tune folder in it is {tmp_path / '20261125-090000'}" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "missing"), "--max-hours", "2"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    for text, what in (("[]", "it holds a JSON list, not an object"), ("{bad", "Expecting property name")):
        (tmp_path / "20261125-090000" / "summary.json").write_text(text)
        assert main(["plan", str(tmp_path / "20261125-090000"), "--max-hours", "2"]) == 2
        err = capsys.readouterr().err
        assert what in err and "probing nothing again: trainfit tune YOUR_SPEC.yaml --output" in err
        assert "--resume" in err and "Traceback" not in err
    for hours in ("0", "1e300"):  # a window of nothing, or of ages (its figures would be digits without end)
        with pytest.raises(SystemExit):
            main(["plan", str(tmp_path), "--max-hours", hours])
        assert "--max-hours" in capsys.readouterr().err
    nothing = tmp_path / "nothing_fit"  # a tune where every config ran out of memory (not probes: its figures)
    from conftest import EXAMPLES

    from trainfit.probe.measurement import Measurement
    from trainfit.spec import load_spec
    from trainfit.tune import tune

    def oom(params: Params, number: int) -> Measurement:
        return Measurement(status="oom", config=params.to_dict(), peak_memory_bytes=2**30, device="cpu")

    tune(load_spec(EXAMPLES / "tiny-llama.yaml", ["search={batch_size: [4]}", "tune.max_trials=1"]),
                   TuneOptions(output=nothing, probe_fn=oom))
    assert main(["plan", str(nothing), "--max-hours", "2"]) == 2
    err = capsys.readouterr().err
    assert "no config fit the budget" in err and "all_failed advice" in err and "Traceback" not in err


def test_eta_reads_back_from_json() -> None:
    e = estimate(candidate(0, 10.0), 100, write_bytes_per_s=FAST_DISK, checkpoint_every_s=60.0)
    assert Eta.from_json(e.to_json()) == e


def test_an_interval_whose_spread_reaches_the_whole_training_time_is_bounded_only_from_above() -> None:
    """+-104% clipped at zero gave "ETA 14s (0s - 29s)" (a reviewer's noisy tune): a low end of
    nothing. The interval then says so."""
    e = estimate(candidate(0, 10.0, spread=0.05), 1_000, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e6)
    assert e.interval == "1m35s - 1m45s"  # 125 steps of 0.8 s, +-5%
    noisy = estimate(candidate(0, 10.0, spread=1.04), 1_000, write_bytes_per_s=FAST_DISK, checkpoint_every_s=1e6)
    assert noisy.low_s == pytest.approx(noisy.checkpoint_s)  # the training part's low end: clipped at 0
    assert noisy.interval.startswith("up to 3m24s; the measured spread, +-104%, gives it no low end")


def a_plan(total_s: float, spread: float, window_s: float, checkpoint_s: float = 0.0) -> Plan:
    eta = Eta(samples=1_000, steps=100, train_s=total_s - checkpoint_s, step_time_s=(total_s - checkpoint_s) / 100,
              trainer_overhead_s=None, startup_s=None, checkpoints=1, checkpoint_s=checkpoint_s, total_s=total_s,
              low_s=total_s * (1 - spread), high_s=total_s * (1 + spread), spread_rel=spread)
    return Plan(created_at="2026-11-24T00:00:00+00:00", run_dir="r", max_hours=1.0, margin_minutes=0.0,
                window_s=window_s, epochs=1.0, dataset_samples=1_000, priority="fast", rule="", trial=0, searched={},
                config={}, samples_per_second=1.0, peak_gb=1.0, command=None, save_steps=10, eta=eta, fits=True,
                checkpoint_every_s=1800.0, checkpoint_bytes=1, write_bytes_per_s=1.0, calibration=None, rests_on=[],
                priorities=[])


@pytest.mark.parametrize(("elapsed_at_half", "state"), [
    (50.0, "on track"),              # the planned pace
    (54.0, "on track"),              # slower, but inside the plan's interval (+10%)
    (58.0, "slower than planned"),   # past the interval, inside the window
    (75.0, "will miss the window"),  # 150 s projected, 120 s window
])
def test_on_track_projects_the_finish_from_the_pace_so_far(elapsed_at_half: float, state: str) -> None:
    from trainfit.train.monitor import OnTrack

    before = time.time()
    status = OnTrack(a_plan(100.0, 0.10, 120.0)).status(50, 100, elapsed_at_half)
    assert status.state == state and status.projected_s == pytest.approx(2 * elapsed_at_half)
    # The line a user watches: progress, the pace, the time left and the end as a clock time, as the
    # trackers get them too.
    left = status.projected_s - elapsed_at_half
    assert status.left_s == pytest.approx(left) and status.steps_per_hour == pytest.approx(50 / left * 3600)
    assert before <= status.at <= time.time()
    end = time.strftime("%H:%M", time.localtime(status.at + left))
    assert f"step 50/100 (50%), {dur(elapsed_at_half)} elapsed, {status.steps_per_hour:,.0f} steps/h, " \
           f"{dur(left)} left, ends ~{end}; projected" in status.line
    figures = status.figures()
    assert figures["training/progress_percent"] == 50 and figures["training/steps_per_hour"] == status.steps_per_hour
    assert figures["training/remaining_hours"] == pytest.approx(left / 3600)
    if state == "will miss the window":  # 1.5 s a step: 45 s of the window left holds 30 more steps
        assert status.steps_that_fit == 80 and status.epochs_that_fit == pytest.approx(0.8)
        assert "80 steps fit (0.80 epochs)" in status.line and "--deadline" in status.line
    else:
        assert status.steps_that_fit is None


def test_an_uncalibrated_plan_is_held_against_the_run_less_its_start_up_and_says_so(tmp_path: Path) -> None:
    """Issue 49: a plan without a calibration prices no start-up, and the monitor counted the run's,
    so a run whose steps kept the plan's pace was called slower than planned. Like with like: the
    run's start-up (its launch to the trainer's start) is left out of both sides, and the line says so."""
    from types import SimpleNamespace

    from trainfit.train.monitor import OnTrackCallback

    plan = a_plan(100.0, 0.10, 120.0)  # 1 s a step, no start-up priced
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    launched = time.time() - 30.0  # 30 s of start-up before the trainer began
    callback = OnTrackCallback(tmp_path / "plan.json", started_at=launched)
    callback.on_train_begin(None, SimpleNamespace(global_step=0, max_steps=100), None)
    callback.start -= 10.0  # ten steps' time on the plan's pace since the trainer began
    callback.began_at -= 10.0
    callback._report(SimpleNamespace(global_step=10, max_steps=100), ahead=False)
    status = callback.latest
    assert status is not None and status.state == "on track", status.line
    assert status.startup_left_out_s == pytest.approx(20.0, abs=1.0)
    assert status.elapsed_s == pytest.approx(10.0, abs=1.0) and status.projected_s == pytest.approx(100.0, rel=0.1)
    assert "the start-up (20s) is left out, as the plan prices none (plan --calibrate measures it)" in status.line
    # A calibrated plan prices the start-up: the run's counts on both sides.
    calibrated = dataclasses.replace(plan, eta=dataclasses.replace(plan.eta, startup_s=20.0))
    (tmp_path / "plan.json").write_text(json.dumps(calibrated.to_json()))
    callback = OnTrackCallback(tmp_path / "plan.json", started_at=launched)
    callback.on_train_begin(None, SimpleNamespace(global_step=0, max_steps=100), None)
    callback._report(SimpleNamespace(global_step=10, max_steps=100), ahead=False)
    assert callback.latest is not None and callback.latest.startup_left_out_s is None
    assert callback.latest.elapsed_s == pytest.approx(30.0, abs=1.0)


def test_a_run_cut_short_by_max_steps_is_checked_against_the_plans_price_of_its_own_steps() -> None:
    """`train --max-steps 10` of a 100-step plan: planned at 10 steps' price. (Checked against the
    whole plan's ETA, a 10-step run 3x slower than priced was called on track.)"""
    from trainfit.train.monitor import OnTrack

    check = OnTrack(a_plan(100.0, 0.10, 120.0))  # 1 s a step
    on_pace = check.status(5, 10, 5.0)
    assert on_pace.state == "on track" and on_pace.planned_s == pytest.approx(10.0) and on_pace.plan_steps == 100
    assert "(planned 10s for a run of 10 steps, the plan's 100," in on_pace.line
    slow = check.status(5, 10, 15.0)  # 3 s a step: 30 s projected, past the interval, inside the 120 s window
    assert slow.state == "slower than planned" and slow.projected_s == pytest.approx(30.0)
    whole = check.status(50, 100, 50.0)
    assert whole.plan_steps is None and whole.planned_s == 100.0 and "for a run of" not in whole.line
    # the plan's own run as a trainer counts it (a partial last step an epoch): still the plan's
    assert check.status(50, 101, 50.0).plan_steps is None


@pytest.mark.parametrize("every", [None, 3])
def test_an_eta_for_fewer_steps_is_the_estimate_of_that_shorter_run(every: int | None) -> None:
    """Eta.for_steps prices a shorter run as estimate() does: its saves, its evaluation passes."""
    c = candidate(0, 10.0, batch=8)
    ev = evaluation(every=every)
    kw = {"write_bytes_per_s": 1e6, "checkpoint_every_s": 2.0, "evaluation": ev}
    whole = estimate(c, 800, epochs=2.0, **kw)  # 100 steps of 0.8 s: 40 saves
    short = whole.for_steps(25, checkpoint_every_s=2.0, evaluation=ev, epochs=2.0)
    expected = estimate(c, 200, epochs=0.5, **kw)
    assert short.first_sights == expected.first_sights
    assert {k: v for k, v in short.to_json().items() if k != "first_sights"} == pytest.approx(
        {k: v for k, v in expected.to_json().items() if k != "first_sights"})
    assert (short.steps, short.checkpoints) == (25, 10) and short.evals == (ev.passes(25, 0.5) if every else 1)


def test_on_track_weighs_the_steps_so_far_by_the_work_their_batches_held() -> None:
    """Random-order batches: the first tenth of the steps drew short samples. Their pace per step
    says the run ends early; weighed by the plan's step cost of those very batches, it does not."""
    import dataclasses

    from trainfit.train.monitor import OnTrack, Pace

    # Step cost 0.1 + 0.001 * L s; the epoch's mean batch is 400 long: 0.5 s a step, 100 steps, 50 s.
    plan = dataclasses.replace(a_plan(50.0, 0.05, 120.0), step_cost=[0.1, 0.001, 0.0], model_step_s=0.5,
                               config={"gradient_accumulation_steps": 2})
    check = OnTrack(plan)
    assert check.batch_cost(200) == pytest.approx(0.15)  # a micro-batch: half the step at L = 200
    # 10 steps of 2 micro-batches 200 long ran at exactly the planned cost: 10 x 0.3 s = 3 s.
    by_steps = check.status(10, 100, 3.0, Pace(3.0, 10))
    by_work = check.status(10, 100, 3.0, Pace(3.0, 10, work_s=20 * check.batch_cost(200)))
    assert by_steps.projected_s == pytest.approx(30.0)  # 0.3 s a step for all 100: wrong by 40%
    assert by_work.projected_s == pytest.approx(50.0)   # 3 s done + 47 s of work left at the planned rate
    # The machine runs 20% slow: the same batches took 3.6 s; the rest of the work is 20% slower too.
    slow = check.status(10, 100, 3.6, Pace(3.6, 10, work_s=3.0))
    assert slow.projected_s == pytest.approx(3.6 + 1.2 * 47.0)
    # A resumed run: 40 earlier steps (at the plan's mean), then 10 in this process; 70 s so far in all.
    resumed = check.status(50, 100, 70.0, Pace(3.0, 10, work_s=3.0))
    assert resumed.projected_s == pytest.approx(70.0 + (50.0 - 40 * 0.5 - 3.0))
    # No work seen (the one batch seen was taken for one collated ahead, at an epoch's end): the steps' count.
    assert check.status(2, 100, 0.6, Pace(0.6, 1, work_s=0.0)).projected_s == pytest.approx(0.6 + 98 * 0.6)


def test_on_track_counts_a_new_lengths_first_sight_once_as_the_plan_did() -> None:
    """The plan's step (0.52 s) shares out an epoch's first sights (40 lengths, 2 s) over its 100
    steps. 10 steps met 10 new lengths and ran as planned: 3 s of warm work and 0.5 s of first sights.
    The rest is 90 warm steps and the first sights still to come: the plan's own 52 s. (Weighed by
    the warm cost alone, the first steps read 17% slow, and the plan's step counted the sights again.)"""
    import dataclasses

    from trainfit.plan.eta import FirstSights
    from trainfit.train.monitor import OnTrack, OnTrackCallback, Pace

    def with_sights(plan: Plan, sights: FirstSights) -> Plan:
        return dataclasses.replace(plan, eta=dataclasses.replace(plan.eta, first_sights=sights))

    # 40 lengths, 2 s an epoch, 0.05 s each: a run of 100 steps of 2 micro-batches meets them all.
    sights = FirstSights(epoch_s=2.0, each_s=0.05, shapes=40, micro_batches=2)
    plan = with_sights(dataclasses.replace(a_plan(52.0, 0.05, 120.0), step_cost=[0.1, 0.001, 0.0], model_step_s=0.52,
                                           config={"gradient_accumulation_steps": 2}), sights)
    check = OnTrack(plan)
    assert check.batch_cost(200) == pytest.approx(0.15) and check.warm_step_s() == pytest.approx(0.5)
    status = check.status(10, 100, 3.5, Pace(3.5, 10, work_s=3.0 + 10 * 0.05, sights_s=10 * 0.05))
    assert status.projected_s == pytest.approx(52.0) and status.state == "on track"
    # The process's first new length costs the plan's first-shape figure (a compiled graph's recompile), later ones
    # the per-length one; a length met again costs nothing more.
    # `train --max-steps 10`: 20 micro-batches meet at most 20 of the 40 lengths; 5 steps in, 10 met.
    assert check.status(5, 10, 2.0, Pace(2.0, 5, work_s=1.5 + 0.5, sights_s=0.5)).projected_s == pytest.approx(
        2.0 + (10 * 0.5 - 1.5) + (2.0 - 20 * 0.05 - 0.5))
    # The first new length costs 0.3 s (a recompile: 2.25 s an epoch), each later one 0.05 s.
    recompiling = FirstSights(epoch_s=0.3 + 39 * 0.05, each_s=0.05, shapes=40, micro_batches=2)
    assert recompiling.first_s == pytest.approx(0.3)
    callback = OnTrackCallback(with_sights(plan, recompiling), every_s=1e9)
    for length in (200, 200, 300):
        callback.observe(length)
    assert callback.work_s == pytest.approx(2 * 0.15 + 0.2 + 0.3 + 0.05) and callback.sights_s == pytest.approx(0.35)


def test_on_track_pools_the_runs_pace_with_the_calibrated_one_by_the_steps_behind_each() -> None:
    """A calibration timed 20 real steps of the plan's config; 10 steps into the run, the run's own
    steps ran 20% slower than planned. The pace of the steps to come weighs 20 steps at the plan's
    pace and 10 at 1.2x: 1.0667x. At step 80 (80 steps seen) the run's own pace leads: 1.16x."""
    import dataclasses

    from trainfit.train.monitor import OnTrack, Pace

    plan = dataclasses.replace(a_plan(50.0, 0.05, 120.0), step_cost=[0.1, 0.001, 0.0], model_step_s=0.5,
                               calibration={"steps": 20, "trial": 0})
    check = OnTrack(plan)
    early = check.status(10, 100, 6.0, Pace(6.0, 10, work_s=5.0))
    assert early.own_pace_projected_s == pytest.approx(6.0 + 1.2 * 45.0)
    assert early.projected_s == pytest.approx(6.0 + (20 + 10 * 1.2) / 30 * 45.0)
    late = check.status(80, 100, 48.0, Pace(48.0, 80, work_s=40.0))
    assert late.projected_s == pytest.approx(48.0 + (20 + 80 * 1.2) / 100 * 10.0)
    # Without the batches seen: the same pooling of the mean step against the plan's 0.5 s.
    by_steps = check.status(10, 100, 6.0, Pace(6.0, 10))
    assert by_steps.projected_s == pytest.approx(early.projected_s)
    # A resumed run: 40 earlier steps (at the plan's mean), then 10 in this process at 1.2x. Only
    # this process's 10 steps weigh against the calibration's 20.
    resumed = check.status(50, 100, 70.0, Pace(6.0, 10, work_s=5.0))
    assert resumed.projected_s == pytest.approx(70.0 + (20 + 10 * 1.2) / 30 * (50.0 - 40 * 0.5 - 5.0))
    # A calibration of another trial (its cost carried over, not timed on this config), one that
    # named no trial, or none: nothing is pooled, and the projection is the run's own pace.
    for calibration in ({"steps": 20, "trial": 3}, {"steps": 20}, None):
        alone = OnTrack(dataclasses.replace(plan, calibration=calibration)).status(10, 100, 6.0,
                                                                                   Pace(6.0, 10, work_s=5.0))
        assert alone.projected_s == pytest.approx(early.own_pace_projected_s) and alone.own_pace_projected_s is None


def test_the_callbacks_pace_starts_after_the_first_steps_warm_up(monkeypatch) -> None:
    """The first step took 2 s (warm-up), every later one the planned 0.5 s: at step 10 the pace is
    0.5 s a step (9 steps in 4.5 s), not 0.65 (10 in 6.5), which would overshoot the end by 13.5 s."""
    from types import SimpleNamespace

    import trainfit.train.monitor
    from trainfit.train.monitor import OnTrackCallback

    now = [100.0]
    monkeypatch.setattr(trainfit.train.monitor.time, "monotonic", lambda: now[0])
    plan = a_plan(50.0, 0.05, 120.0)  # 100 steps of 0.5 s
    callback = OnTrackCallback(plan, every_s=1e9)
    state = SimpleNamespace(global_step=0, max_steps=100)
    callback.on_train_begin(None, state, None)
    for step, seconds in [(1, 2.0)] + [(n, 0.5) for n in range(2, 11)]:
        now[0] += seconds
        state.global_step = step
        callback.on_step_end(None, state, None)
    callback._report(state, ahead=False)
    assert callback.latest.projected_s == pytest.approx(6.5 + 90 * 0.5 + (plan.eta.startup_s or 0.0))


def test_the_on_track_line_is_written_above_the_trainers_progress_bar_not_inside_it(capsys) -> None:
    """The trainer draws its bar on stderr with carriage returns and no line end; the monitor's line
    clears it and starts a line of its own, and the bar is drawn again below."""
    import sys
    from types import SimpleNamespace

    from tqdm import tqdm

    from trainfit.train.monitor import OnTrackCallback

    callback = OnTrackCallback(a_plan(50.0, 0.05, 120.0), every_s=1e9)
    state = SimpleNamespace(global_step=0, max_steps=100)
    callback.on_train_begin(None, state, None)
    bar = tqdm(total=100, file=sys.stderr)
    state.global_step = 3
    bar.update(3)
    callback._report(state, ahead=True)
    bar.close()
    [line] = [part for part in capsys.readouterr().err.split("\n") if "trainfit: " in part]
    assert line.split("\r")[-1].startswith("trainfit: on track: step 3/100")


def test_on_track_takes_the_evaluation_passes_out_of_the_pace_and_adds_those_to_come() -> None:
    import dataclasses

    from trainfit.train.monitor import OnTrack, Pace

    # 100 steps of 0.5 s, a pass every 20 steps (5 in all) planned at 2 s.
    plan = dataclasses.replace(a_plan(60.0, 0.05, 120.0), evaluation=evaluation(20, pass_s=2.0))
    check = OnTrack(plan)
    # At step 40: 20 s of steps and two passes that took 3 s each.
    status = check.status(40, 100, 26.0, Pace(26.0, 40, eval_s=6.0, evals=2))
    assert status.projected_s == pytest.approx(26.0 + 60 * 0.5 + 3 * 3.0)  # the steps' pace; 3 passes left at 3 s
    before = check.status(10, 100, 5.0, Pace(5.0, 10))  # no pass yet: the plan's 2 s each, 5 to come
    assert before.projected_s == pytest.approx(5.0 + 90 * 0.5 + 5 * 2.0)
    # A trainer's 101 steps (the plan's run): the pass after the last step is still to come at its end,
    # and once the training ended, nothing is.
    assert check.status(101, 101, 62.0, Pace(62.0, 101, eval_s=10.0, evals=5)).projected_s == pytest.approx(64.0)
    assert check.status(101, 101, 64.0, Pace(64.0, 101, eval_s=12.0, evals=6), ended=True).projected_s == 64.0


def test_on_track_counts_the_plans_passes_in_its_run_as_a_trainer_counts_the_steps() -> None:
    """3 epochs with a pass at each epoch's end; the plan counts 100 steps, the trainer 102 (a
    partial last step an epoch): still 3 passes, not the 4 that 3 x 102 / 100 epochs would make."""
    import dataclasses

    from trainfit.train.monitor import OnTrack, Pace

    plan = dataclasses.replace(a_plan(60.0, 0.05, 120.0), epochs=3.0, evaluation=evaluation(None, pass_s=2.0))
    check = OnTrack(plan)
    assert check.status(50, 102, 25.0, Pace(25.0, 50, eval_s=2.0, evals=1)).projected_s == pytest.approx(
        25.0 + 52 * 23.0 / 50 + 2 * 2.0)  # the steps at their pace; 1 pass of 3 done: 2 to come


def test_on_track_says_nothing_from_the_warm_up_step_alone(monkeypatch) -> None:
    """A first step of 90 s (compiling, a loaded machine) on a plan of 0.5 s steps: projected over
    the run, it would say the run will miss its window. The monitor waits for a step after it."""
    from types import SimpleNamespace

    import trainfit.train.monitor
    from trainfit.train.monitor import OnTrackCallback

    now = [100.0]
    monkeypatch.setattr(trainfit.train.monitor.time, "monotonic", lambda: now[0])
    callback = OnTrackCallback(a_plan(50.0, 0.05, 300.0), every_s=0.0)
    state = SimpleNamespace(global_step=0, max_steps=100)
    callback.on_train_begin(None, state, None)
    now[0], state.global_step = now[0] + 90.0, 1
    callback.on_step_end(None, state, None)
    assert callback.latest is None
    now[0], state.global_step = now[0] + 0.5, 2
    callback.on_step_end(None, state, None)
    assert callback.latest is not None and callback.latest.state == "slower than planned"  # 139.5 s, not 4,500
    callback.on_train_end(None, state, None)  # stopped at step 2 of 100 (a deadline, a signal): not finished
    assert callback.latest.projected_s > callback.latest.elapsed_s + 40


@pytest.mark.integration
def test_on_track_callback_reports_from_a_real_trainer(tmp_path: Path, capsys, monkeypatch) -> None:
    """A real Hugging Face Trainer, a few steps of a tiny model, with the callback checking every
    step against a plan whose window it cannot miss."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    import trainfit

    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(a_plan(3600.0, 0.1, 7200.0).to_json()))
    cfg = dict(TINY_LLAMA)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    ids = torch.randint(0, 256, (16, 32))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=4,
                             report_to="tensorboard", save_strategy="no", use_cpu=True, logging_steps=100)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # transformers 5's way to name the folder
    callback = trainfit.OnTrackCallback(plan=plan_path, every_s=0.0)
    callback.watch(Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])).train()
    status = json.loads((tmp_path / "on_track.json").read_text())
    assert status["step"] == 4 and status["max_steps"] == 4 and status["state"] == "on track"
    assert "trainfit: on track: step 4/4" in capsys.readouterr().err
    # The figures reached the trainer's report_to service: TensorBoard's own reader, on its event files.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [file] = (tmp_path / "tb").iterdir()  # the trainer's one writer: nothing logged after it closed
    events = EventAccumulator(str(file)).Reload()
    scalars = {tag.removeprefix("train/"): [e.value for e in events.Scalars(tag)]  # the services' train/ prefix
               for tag in events.Tags()["scalars"]}
    # each step's but the first's (the warm-up step alone tells no pace)
    assert set(scalars["training/on_track"]) == {1.0} and len(scalars["training/remaining_hours"]) == 3
    estimated, actual = scalars["optimization/estimated_hours"], scalars["optimization/actual_hours"]
    assert estimated == [pytest.approx(0.04)]  # the plan's price of a 4-step run: 4 of its 100 steps of 3,600 s
    assert scalars["optimization/time_accuracy"] == [pytest.approx(100 * estimated[0] / actual[0], rel=1e-3)]


def test_plan_json_of_another_schema_is_refused() -> None:
    from trainfit.errors import TrainfitError

    raw = a_plan(100.0, 0.1, 200.0).to_json()
    assert Plan.from_json(raw) == a_plan(100.0, 0.1, 200.0)
    with pytest.raises(TrainfitError, match="plan.json has schema version 2"):
        Plan.from_json({**raw, "schema_version": 2})
    # "1" was refused as if it were another version ("has schema version '1'; this trainfit reads 1") (issue 45).
    with pytest.raises(TrainfitError) as err:
        Plan.from_json({**raw, "schema_version": "1"})
    assert str(err.value).startswith("plan.json has schema version '1', a string where a number belongs; this "
                                     "trainfit reads 1")
    assert 'write it as a number ("schema_version": 1)' in err.value.hint
    with pytest.raises(TrainfitError, match="plan.json has no schema_version; this trainfit reads 1"):
        Plan.from_json({k: v for k, v in raw.items() if k != "schema_version"})
    from trainfit.data.stats import LengthStats

    with pytest.raises(TrainfitError, match="the length analysis has schema version '1', a string where a number"):
        LengthStats.from_dict({"schema_version": "1"})  # a --lengths file: the same words
