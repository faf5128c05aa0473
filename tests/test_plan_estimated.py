"""A plan before the hardware (issue #32): from the user's figure over a spec's data, or from a tune
folder scaled to another device by peak FLOP/s at its measured MFU; each marked "estimated, not
measured" in all it writes, with the interval it can claim; bad input is one line naming the fix.

The --like tune folders are written by the real tune from fixed figures on a named GPU (a probe on
this CPU measures no MFU: peak FLOP/s for CPUs are not on record), and the CPU case is a real tune."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import EXAMPLES, TINY_LLAMA, make_spec_file, tune_one_lora_config

from trainfit.cli import main
from trainfit.data.analyze import analyze_spec
from trainfit.devices import PEAK_FLOPS, known_devices, peak_flops
from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.plan import Plan, make_plan
from trainfit.plan.estimated import ESTIMATED, MFU_SPREAD, from_throughput, like_estimated, like_lines, scaled_to
from trainfit.plan.html import plan_section
from trainfit.plan.inputs import Candidate, TuneRun
from trainfit.probe.measurement import Measurement
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec
from trainfit.train.prepare import to_train
from trainfit.tune import tune

H100, A100 = 989e12, 312e12
"""Dense bf16 peak FLOP/s of an H100 SXM and an A100, from NVIDIA's datasheets."""


def lengths_spec(root: Path, lengths: list[int], *, max_length: int, batch: int = 4, accumulation: int = 5) -> Path:
    """A spec over a JSONL file whose sample i is ``lengths[i]`` positions long (a length field)."""
    data = root / "lengths.jsonl"
    data.write_text("".join(json.dumps({"id": i, "n": n}) + "\n" for i, n in enumerate(lengths)))
    return make_spec_file(root, model={"config": TINY_LLAMA}, data={"path": str(data), "length_field": "n"},
                          params={"batch_size": batch, "gradient_accumulation_steps": accumulation,
                                  "max_length": max_length})


def read_plan(folder: Path) -> tuple[Plan, dict[str, Any]]:
    raw = json.loads((folder / "plan.json").read_text())
    return Plan.from_json(raw), raw


def test_a_plan_from_tokens_per_second_is_the_datas_real_tokens_at_that_speed(tmp_path: Path, capsys: Any) -> None:
    lengths = [10 + (i * 7) % 90 for i in range(120)]  # 10-99 positions, some past max_length 64
    spec = lengths_spec(tmp_path, lengths, max_length=64)
    out = tmp_path / "out"
    assert main(["plan", "--spec", str(spec), "--throughput", "800", "--max-hours", "2", "--epochs", "3",
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    plan, raw = read_plan(out)
    # By hand: 3 epochs of 120 samples, each cut at 64 positions, at 800 tokens/s; 360 samples are 18
    # whole optimizer steps of 4 x 5, so no partial step rounds the time up.
    by_hand = 3 * sum(min(n, 64) for n in lengths) / 800
    assert plan.eta.steps == 18 and plan.eta.train_s == pytest.approx(by_hand)
    assert plan.eta.total_s == pytest.approx(by_hand)  # no start-up, no checkpoint size measured
    assert plan.eta.low_s == plan.eta.high_s == plan.eta.total_s  # every length counted: the data side is exact
    assert plan.fits and plan.window_s == 2 * 3600 - 30 * 60 and plan.trial is None and plan.command is None
    assert plan.priorities == [] and plan.checkpoint_bytes == 0 and plan.calibration is None
    # estimated, not measured: in the terminal, plan.txt, plan.json and the page's section
    assert plan.estimated is not None and plan.estimated.basis == "throughput"
    assert raw["estimated"]["label"] == ESTIMATED and "taken as given" in raw["estimated"]["speed"]
    assert "the data side only" in plan.estimated.interval
    for text in (printed, (out / "plan.txt").read_text(), plan_section(plan)):
        assert ESTIMATED in text.lower()
    assert f"({plan.eta.interval}), {ESTIMATED}: FITS" in printed  # the ETA line itself
    assert "no command: nothing was measured" in printed and "trainfit train" not in printed
    # The same run from samples/s: 360 samples at 12 a second.
    assert main(["plan", "--spec", str(spec), "--samples-per-second", "12", "--max-hours", "2", "--epochs", "3",
                 "--output", str(out), "--json"]) == 0
    plan = Plan.from_json(json.loads(capsys.readouterr().out))  # stdout is the plan alone
    assert plan.eta.train_s == pytest.approx(360 / 12) and plan.estimated is not None


def test_a_throughput_run_that_does_not_fit_gets_fewer_epochs_and_a_subset(tmp_path: Path, capsys: Any) -> None:
    spec = lengths_spec(tmp_path, [50] * 200, max_length=64, batch=2, accumulation=1)
    # 10 epochs of 200 x 50 tokens at 10 tokens/s: 10,000 s, in a window of 1 h.
    assert main(["plan", "--spec", str(spec), "--throughput", "10", "--max-hours", "1", "--margin-minutes", "0",
                 "--epochs", "10", "--output", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out
    # issue 49: worded from what the plan rests on, the user's figure (nothing was probed)
    assert "from your --throughput figure (nothing was probed)" in out and "from the chosen config's probe" not in out
    assert "whatever your figure holds (see below)" in out and "not calibrated (see below)" not in out
    plan, _ = read_plan(tmp_path / "out")
    assert plan.eta.total_s == pytest.approx(10_000)
    kinds = {o.kind: o for o in plan.options}
    assert set(kinds) == {"fewer_epochs", "subset"} and all(o.eta.fits(3600) for o in plan.options)
    assert kinds["fewer_epochs"].change == "train 3 epochs instead of 10"  # 3 x 1,000 s fit 3,600, 4 do not
    assert all(o.trial is None for o in plan.options)


def test_a_plan_from_numbers_alone_is_guide_002s_first_run(tmp_path: Path, capsys: Any) -> None:
    """``optimize_for_dataset(num_samples=8000, avg_tokens_per_sample=500)`` at 800 tokens/s, 3 epochs, an
    effective batch of 32: 750 steps in 4h10m, the guide's figures, with no data file; by percentiles the
    lengths run between them, cut at max_length."""
    spec = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          params={"batch_size": 4, "gradient_accumulation_steps": 8, "max_length": 2048})
    out = tmp_path / "out"
    assert main(["plan", "--spec", str(spec), "--throughput", "800", "--samples", "8000", "--lengths", "500",
                 "--max-hours", "12", "--epochs", "3", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    plan, _ = read_plan(out)
    assert plan.eta.steps == 750 and plan.eta.total_s == pytest.approx(3 * 8000 * 500 / 800)  # 15,000 s: 4h10m
    assert "ETA 4h10m" in printed and "data: 8,000 samples, 500 tokens each (your mean: no spread known)" in printed
    assert plan.estimated is not None and "the lengths are your figures" in plan.estimated.interval
    # Guide 002: under 6 hours of 12 is room to spare: more epochs is offered (no other config was measured)
    assert [o.kind for o in plan.options] == ["more_epochs"]
    lengths = "p50=400,p90=900,max=3000"
    assert main(["plan", "--spec", str(spec), "--throughput", "800", "--samples", "8000", "--lengths", lengths,
                 "--max-hours", "12", "--epochs", "1", "--output", str(out)]) == 0
    plan, _ = read_plan(out)
    # The mean of lengths linear between (0, 400), (50, 400), (90, 900), (100, 3000), cut at 2048:
    grid = (np.arange(10_000) + 0.5) / 100
    cut = np.minimum(np.rint(np.interp(grid, [50, 90, 100], [400, 900, 3000])), 2048)
    assert plan.eta.train_s == pytest.approx(8000 * cut.mean() / 800, rel=1e-6)
    for bad, said in [(["--samples", "10"], "needs both its sample count and its lengths"),
                      (["--samples", "10", "--lengths", "p90=100,p50=400"], "a higher percentile is shorter")]:
        assert main(["plan", "--spec", str(spec), "--throughput", "800", *bad, "--max-hours", "1"]) == 2
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # a value argparse refuses: its usage line and the fix
        main(["plan", "--spec", str(spec), "--throughput", "800", "--samples", "10", "--lengths", "p50=400,p90=x",
              "--max-hours", "1"])
    assert usage.value.code == 2 and "p90='x' is not a number" in capsys.readouterr().err
    assert main(["plan", "--spec", str(spec), "--throughput", "800", "--max-hours", "1"]) == 2
    assert "or give its numbers: --samples N --lengths MEAN" in capsys.readouterr().err
    # The window, priority and margin from the spec's plan: section; a flag wins; no window at all is refused.
    numbers = ["--throughput", "800", "--samples", "8000", "--lengths", "500", "--output", str(out)]
    assert main(["plan", "--spec", str(spec), *numbers]) == 2
    assert "give --max-hours H, or plan: {max_hours: H} in the spec" in capsys.readouterr().err
    spec.write_text(spec.read_text() + "plan: {max_hours: 6, priority: quality, margin_minutes: 0}\n")
    assert main(["plan", "--spec", str(spec), *numbers]) == 0
    plan, _ = read_plan(out)
    assert (plan.max_hours, plan.window_s, plan.priority) == (6, 6 * 3600, "quality")
    assert main(["plan", "--spec", str(spec), *numbers, "--max-hours", "5", "--margin-minutes", "10"]) == 0
    plan, _ = read_plan(out)
    assert (plan.max_hours, plan.window_s, plan.priority) == (5, 5 * 3600 - 600, "quality")


def test_the_interval_of_a_throughput_plan_is_the_data_sides_when_lengths_are_sampled(tmp_path: Path) -> None:
    """A dataset larger than the analysis's 10,000-length sample, cut at max_length: the mean real
    tokens a sample is estimated from the sample, and the interval is its 95% interval."""
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.lognormal(4.0, 0.8, size=30_000).clip(1, 500)]  # inside the model's 512 positions
    spec = load_spec(lengths_spec(tmp_path, lengths, max_length=128))
    stats = analyze_spec(spec, progress=False)
    assert len(stats.length_sample) == 10_000 < stats.samples == 30_000
    candidate, estimated = from_throughput(spec.params, stats, tokens_per_second=1000.0)
    spread = estimated.spread_rel
    assert 0 < spread < 0.02 and candidate.spread_rel == spread
    true_mean = float(np.minimum(lengths, 128).mean())  # every sample cut at 128, counted here
    sampled_mean = 1000.0 / candidate.samples_per_second
    assert abs(sampled_mean - true_mean) <= spread * sampled_mean  # the interval holds the real mean
    assert "10,000 of the 30,000" in estimated.interval
    # Not cut (max_length past the longest): the mean is the analysis's exact one, no interval.
    whole = Params(**{**spec.params.to_dict(), "max_length": None})
    candidate, estimated = from_throughput(whole, stats, tokens_per_second=1000.0)
    assert estimated.spread_rel == 0 and 1000.0 / candidate.samples_per_second == pytest.approx(np.mean(lengths))


SHAPES = [{"rows": 4, "padded_length": 128, "real_tokens": 400, "seconds": 0.30, "steps": 3},
          {"rows": 4, "padded_length": 512, "real_tokens": 1500, "seconds": 0.90, "steps": 3}]


def on_an_h100(params: Params, number: int) -> Measurement:
    """Not a probe: a config as an H100 would record it (its name, its MFU, timed shapes)."""
    sps = 10.0 * params.batch_size / (1 + 0.1 * params.batch_size)
    return Measurement(status="ok", config=params.to_dict(), samples_per_second=sps, tokens_per_second=sps * 50,
                       expected_step_time_s=params.effective_batch_size / sps, step_time_ci95_rel=0.02,
                       fit_error_rel=0.01, shape_times=SHAPES, peak_memory_bytes=2**31,
                       memory_parts_bytes={"model": 2**29, "optimizer": 2**28}, steps_measured=6, stable=True,
                       device="cuda:0", device_name="NVIDIA H100 80GB HBM3", mfu=0.35, model_flops_per_step=1e12)


@pytest.fixture(scope="module")
def h100_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tune folder as tune writes it, of two bf16 configs measured on an H100."""
    out = tmp_path_factory.mktemp("like") / "run"
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", ["search={batch_size: [2, 4]}", "precision=bf16"])
    tune(spec, TuneOptions(output=out, probe_fn=on_an_h100, stats=analyze_spec(spec, progress=False)))
    return out


def test_a_run_measured_on_an_h100_is_scaled_to_an_a100_by_their_peak_flops(h100_run: Path, tmp_path: Path,
                                                                          capsys: Any) -> None:
    measured = make_plan(h100_run, max_hours=10, epochs=2, priority="fast")
    before = sorted(p.name for p in h100_run.iterdir())
    out = tmp_path / "a100"
    assert main(["plan", "--like", str(h100_run), "--device", "A100", "--max-hours", "10", "--epochs", "2",
                 "--priority", "fast", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    plan, raw = read_plan(out)
    ratio = H100 / A100  # the same MFU on a device of a third of the peak: each step 3.17x as long
    assert plan.trial == measured.trial and plan.eta.steps == measured.eta.steps
    assert plan.eta.step_time_s == pytest.approx(measured.eta.step_time_s * ratio)
    assert plan.eta.train_s == pytest.approx(measured.eta.train_s * ratio)
    assert plan.samples_per_second == pytest.approx(measured.samples_per_second / ratio)
    assert plan.step_cost == pytest.approx([x * ratio for x in measured.step_cost or []]) and plan.step_cost
    # The interval: +-30% for the MFU the A100 may reach, with the probe's own +-2.2%, as a range of ETAs.
    spread = math.hypot(math.hypot(0.02, 0.01), MFU_SPREAD)
    assert plan.eta.spread_rel == pytest.approx(spread)
    fixed = plan.eta.total_s - plan.eta.train_s  # the checkpoint saves
    assert plan.eta.low_s == pytest.approx(plan.eta.train_s * (1 - spread) + fixed)
    assert plan.eta.high_s == pytest.approx(plan.eta.train_s * (1 + spread) + fixed)
    assert plan.estimated is not None and plan.estimated.peak_ratio == pytest.approx(ratio)
    assert raw["estimated"]["label"] == ESTIMATED and raw["estimated"]["device"] == "A100"
    for text in (printed, (out / "plan.txt").read_text(), plan_section(plan)):
        assert ESTIMATED in text.lower() and "A100" in text
    assert "989 against 312 TFLOP/s" in printed and "MFU 35.0%" in printed
    assert f"({plan.eta.interval}), {ESTIMATED}: FITS" in printed  # the range of ETAs, marked
    assert not any("run with --calibrate" in line for line in plan.rests_on)  # it cannot, for an A100
    assert any("whether it fits A100's memory is not checked" in line for line in plan.rests_on)
    assert sorted(p.name for p in h100_run.iterdir()) == before  # the tune folder's own plan is left alone
    # `trainfit train` refuses an estimated plan, wherever it is found.
    shutil.copy(out / "plan.json", h100_run / "plan.json")
    try:
        with pytest.raises(TrainfitError, match="estimated, not measured"):
            to_train(h100_run, tmp_path / "trained")
    finally:
        (h100_run / "plan.json").unlink()


@pytest.mark.parametrize(("measured_on", "device", "words"), [
    ("NVIDIA A100-SXM4-80GB", "H100", "little faster on H100 for its higher peak: the ETA may be short"),
    ("NVIDIA H100 80GB HBM3", "A100", "little slower on A100 for its lower peak: the ETA may be long"),
])
def test_a_step_bound_by_launching_kernels_says_which_way_its_scaled_eta_may_err(measured_on: str, device: str,
                                                                                words: str) -> None:
    def lines_at(mfu: float) -> list[str]:
        m = dataclasses.replace(on_an_h100(Params(batch_size=4, precision="bf16"), 0), device_name=measured_on, mfu=mfu)
        c = Candidate(trial=0, searched={"batch_size": 4}, config=m.config, samples_per_second=10.0, step_time_s=0.4,
                      samples_per_step=4.0, spread_rel=0.02, peak_gb=2.0, optimizer_gb=0.25, model_gb=0.5,
                      shape_times=[], measurement=m)
        run = TuneRun(folder=Path("run"), summary=None, candidates=[c], spec_doc=None)  # what scaling reads of a run
        chosen = scaled_to(run, device).candidates[0]
        return like_lines(chosen, like_estimated(chosen, device, run))

    low = lines_at(0.05)
    assert len(low) == 2 and words in low[1] and "MFU, 5.0%, is low" in low[1]
    assert len(lines_at(0.35)) == 1  # a step of arithmetic: scaled without a word


def test_every_device_on_record_is_named_as_a_user_names_it() -> None:
    names = known_devices()
    assert len(names) == len(PEAK_FLOPS) and {"H100", "A100", "L4", "RTX 4090"} <= set(names)
    for name, (_, peak) in zip(names, PEAK_FLOPS, strict=True):
        assert peak_flops(name, "bf16", False) == (peak.bf16, peak.source), name


def test_a_run_measured_on_a_cpu_has_no_mfu_to_scale(tmp_path: Path, capsys: Any) -> None:
    cpu_run = tune_one_lora_config(tmp_path, samples=40)  # a real tune of the tiny model, on this CPU
    capsys.readouterr()
    out = tmp_path / "h100"
    assert main(["plan", "--like", str(cpu_run), "--device", "H100", "--max-hours", "2", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "with no MFU (peak FLOP/s for CPUs are not on record)" in err and "--throughput" in err
    assert "Traceback" not in err and not out.exists()
    # A device not on record too: both problems named at once, each with its fix (issue 45).
    assert main(["plan", "--like", str(cpu_run), "--device", "TPU v5", "--max-hours", "2", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "with no MFU (peak FLOP/s for CPUs are not on record)" in err and "--throughput" in err
    assert "; and no peak FLOP/s on record for --device 'TPU v5'" in err and "name one of: " in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize(("args", "words"), [
    (["--like", "RUN", "--device", "TPU v5"], "no peak FLOP/s on record for --device 'TPU v5'"),
    (["--like", "RUN"], "add --device NAME"),
    (["--device", "H100"], "add --like RUN_DIR, or drop --device"),
    (["RUN", "--like", "RUN", "--device", "H100"], "give one source of the speed"),
    (["--like", "RUN", "--device", "H100", "--spec", "SPEC", "--throughput", "8"], "give one source of the speed"),
    (["--spec", "SPEC", "--throughput", "8", "--samples-per-second", "2"], "two figures for one speed"),
    (["--throughput", "8"], "add --spec SPEC"),
    (["--spec", "SPEC"], "add --throughput TOKENS_PER_S or --samples-per-second N"),
    (["--like", "RUN", "--device", "H100", "--calibrate", "5"], "drop them from a plan before the hardware"),
    (["--like", "RUN", "--device", "H100", "--output", "RUN"], "is a tune folder: an estimated plan there"),
    (["RUN", "--output", "ELSEWHERE"], "drop --output"),
    (["--like", "NOT_A_RUN", "--device", "H100"], "holds no summary.json: it is not a tune output folder"),
    ([], "nothing to plan from"),
])
def test_bad_input_is_one_line_naming_the_problem_and_the_fix(h100_run: Path, tmp_path: Path, capsys: Any,
                                                               args: list[str], words: str) -> None:
    spec = lengths_spec(tmp_path, [10] * 8, max_length=64)
    named = {"RUN": str(h100_run), "SPEC": str(spec), "NOT_A_RUN": str(tmp_path), "ELSEWHERE": str(tmp_path / "x")}
    assert main(["plan", *(named.get(a, a) for a in args), "--max-hours", "2"]) == 2
    err = capsys.readouterr().err
    assert words in err and "fix:" in err and "Traceback" not in err
    assert not (h100_run / "plan.json").exists()


def test_a_throughput_that_is_no_speed_is_refused(tmp_path: Path, capsys: Any) -> None:
    spec = lengths_spec(tmp_path, [10] * 8, max_length=64)
    for figure in ("-800", "0", "nan"):
        with pytest.raises(SystemExit):
            main(["plan", "--spec", str(spec), "--throughput", figure, "--max-hours", "2"])
        assert "argument --throughput" in capsys.readouterr().err
    stats = analyze_spec(load_spec(spec), progress=False)
    with pytest.raises(TrainfitError, match="a throughput must be a positive number, got -800"):
        from_throughput(load_spec(spec).params, stats, tokens_per_second=-800.0)  # the library checks it too


@pytest.mark.parametrize("flag", ["--throughput", "--samples-per-second"])
def test_a_figure_past_any_machine_is_refused_with_its_bound(tmp_path: Path, capsys: Any, flag: str) -> None:
    """``--samples-per-second 1e308`` ended in an OverflowError traceback (a step of 1e-308 s, its
    checkpoint interval infinite steps); ``--throughput 1e308`` planned 1e-305 s steps (issue 45)."""
    spec = lengths_spec(tmp_path, [10] * 8, max_length=64)
    out = tmp_path / "plan"
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--spec", str(spec), flag, "1e308", "--max-hours", "2", "--output", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert f"argument {flag}: 1e308 is out of range: expected a number > 0 and <= 1e+12" in err, err
    assert not out.exists()
    assert main(["plan", "--spec", str(spec), flag, "1e12", "--max-hours", "2", "--output", str(out)]) == 0
    stats = analyze_spec(load_spec(spec), progress=False)
    figure = {"tokens_per_second" if flag == "--throughput" else "samples_per_second": 1e308}
    with pytest.raises(TrainfitError, match=r"1e\+308 .* is past any machine: at most 1e\+12"):
        from_throughput(load_spec(spec).params, stats, **figure)  # the library checks it too


def test_a_scaled_step_keeps_its_wait_for_data_as_measured() -> None:
    """The wait for the loader is the host's, not the device's arithmetic: scaling to another GPU by peak
    FLOP/s moves the model's part of the step only (the timed shapes are that part alone)."""
    m = dataclasses.replace(on_an_h100(Params(batch_size=4, precision="bf16"), 0), data_wait_s=0.1, mfu=0.35)
    shapes = [{"rows": 4, "padded_length": 64, "seconds": 0.3, "steps": 5}]
    c = Candidate(trial=0, searched={"batch_size": 4}, config=m.config, samples_per_second=10.0, step_time_s=0.4,
                  samples_per_step=4.0, spread_rel=0.02, peak_gb=2.0, optimizer_gb=0.25, model_gb=0.5,
                  shape_times=shapes, measurement=m)
    scaled = scaled_to(TuneRun(folder=Path("run"), summary=None, candidates=[c], spec_doc=None), "A100").candidates[0]
    ratio = H100 / A100
    assert scaled.step_time_s == pytest.approx(0.3 * ratio + 0.1)  # not 0.4 x ratio
    assert scaled.samples_per_second == pytest.approx(4.0 / (0.3 * ratio + 0.1))
    assert scaled.shape_times[0]["seconds"] == pytest.approx(0.3 * ratio)
