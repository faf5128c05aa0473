"""The calibration of `trainfit plan --calibrate N`: the written `trl sft` command run for real, twice,
its extra steps timed by the trainer's progress bar (TRL's `train_runtime` difference as the
fallback); and every folder it cannot calibrate refused in
words, before anything runs."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, gone_within
from tune_helpers import fixed_speed

from trainfit.errors import TrainfitError
from trainfit.plan.inputs import best_step_cost
from trainfit.probe.timing import relative_ci95
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec
from trainfit.trainer.calibration import Calibration, calibrate, calibration_args, short_steps
from trainfit.trainer.launch import run_logged, run_timed
from trainfit.trainer.step_pricing import own_step_time, pace_change, priced_steps
from trainfit.trainer.trainer_output import (
    bar_seconds_per_step,
    bar_step,
    parse_train_runtime,
    recorded_steps,
    step_spread,
)
from trainfit.tune import tune

SMALL_TUNE = ["max_length=256", "search={batch_size: [4]}", "tune.target_effective_batch=32", "tune.max_trials=1"]
"""The bundled example cut to one config, effective batch 32 at up to 256 tokens: steps of ~0.3-0.5 s on a 2-core
CPU, each one shown by the trainer's progress bar (tqdm refreshes at most every 0.1 s)."""
QUICK_PROBE = ["probe.max_seconds=3", "probe.burn_in_steps=1", "probe.min_steps=2", "probe.max_steps=4"]
"""A probe that only has to give a figure (the test decides nothing on it)."""


fixed = fixed_speed()
"""Not a probe (these tests are about the folder a tune leaves): a fitting config at a fixed speed."""


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tune folder of the bundled example whose command is `trl sft` (its model saved), from fixed figures."""
    out = tmp_path_factory.mktemp("written") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        tune(load_spec(EXAMPLES / "tiny-llama.yaml", SMALL_TUNE), TuneOptions(output=out, probe_fn=fixed))
    return out


def folder_with(tmp_path: Path, written: Path, script: str | None) -> Path:
    """A copy of ``written``'s summary.json with ``script`` as its train_command.sh (None: none)."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(written / "summary.json", run)
    if script is not None:
        (run / "train_command.sh").write_text(script)
    return run


def test_a_calibration_needs_a_step(tmp_path: Path) -> None:
    with pytest.raises(TrainfitError, match=r"at least 1 optimizer step \(asked for 0\)"):
        calibrate(tmp_path, 0)


def test_a_folder_that_is_not_a_tune_output_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainfitError, match="holds no summary.json"):
        calibrate(tmp_path, 4)


def test_a_folder_without_train_command_sh_is_refused(tmp_path: Path, written: Path) -> None:
    with pytest.raises(TrainfitError, match="holds no train_command.sh") as err:
        calibrate(folder_with(tmp_path, written, None), 4, work=tmp_path / "work")
    assert "rests on the probe alone" in str(err.value)
    assert not (tmp_path / "work").exists()  # refused before anything ran


def test_a_command_with_a_placeholder_is_refused(tmp_path: Path, written: Path) -> None:
    """A random-init model over 1B parameters is not saved: its script names a placeholder, which
    `trl sft` would try to download as a model."""
    from trainfit.trainer.command import MODEL_PLACEHOLDER

    script = (written / "train_command.sh").read_text().replace(str(written.resolve() / "model"),
                                                               shlex.quote(MODEL_PLACEHOLDER))
    with pytest.raises(TrainfitError, match="still has a placeholder to fill: <a local model folder"):
        calibrate(folder_with(tmp_path, written, script), 4)


def test_a_command_written_for_another_trial_than_the_summarys_best_is_refused(tmp_path: Path, written: Path) -> None:
    script = (written / "train_command.sh").read_text().replace("config (trial 0)", "config (trial 7)")
    with pytest.raises(TrainfitError, match="is for trial 7, summary.json's best config is trial 0"):
        calibrate(folder_with(tmp_path, written, script), 4)


def fake_trainer(tmp_path: Path, body: str) -> Path:
    """A stand-in for `trl sft` (bash), for what the calibration does with any child process."""
    script = tmp_path / "trainer.sh"
    script.write_text(f"#!/usr/bin/env bash\n{body}\n")
    return script


def test_a_failed_run_says_its_last_lines_and_keeps_its_whole_log(tmp_path: Path) -> None:
    script = fake_trainer(tmp_path, 'for i in $(seq 1 100); do echo "line $i"; done\n'
                                    'echo "ValueError: no such model" >&2\nexit 3')
    with pytest.raises(TrainfitError) as err:
        run_timed("`trl sft`", ["bash", str(script)], 2, tmp_path, os.environ, lambda line: None,
                  fallback="plan without --calibrate")
    message = str(err.value)
    assert "2-step run of `trl sft` exited with 3" in message and "  | ValueError: no such model" in message
    assert "  | line 99" in message and "  | line 60" not in message  # the last 30 lines only
    log = tmp_path / "calibrate-2-steps.log"
    assert f"the whole output is in {log}; fix what it says, or plan without --calibrate" in message
    assert log.read_text().count("line ") == 100


def test_ctrl_c_kills_the_run_and_everything_it_started(tmp_path: Path) -> None:
    """The trainer's process group goes: `bash`, and what it started (here a `sleep`; for real,
    `accelerate launch` and the training process)."""
    pids = tmp_path / "pids"
    script = fake_trainer(tmp_path, f"sleep 300 &\necho $$ $! > {pids}\n"
                                    "printf '\\r 20%%|##        | 1/5 [00:01<00:04,  1.00s/it]'\nwait")

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_logged(["bash", str(script)], tmp_path / "log", cwd=tmp_path, env=os.environ, bar_total=5,
                   say=interrupt)
    for pid in map(int, pids.read_text().split()):  # the `sleep 300` would outlive any bound but a kill
        assert gone_within(pid, 5), pid


def test_trl_s_metrics_and_progress_bar_are_read_as_printed() -> None:
    """Lines as transformers 5.24 prints them (floats formatted .4g: a long run's runtime has an exponent)."""
    metrics = "{'train_runtime': '0.3547', 'train_samples_per_second': '135.3', 'train_loss': '7.608'}"
    assert parse_train_runtime(f"noise\n{metrics}\n") == 0.3547
    assert parse_train_runtime("{'train_runtime': '1.235e+04', 'epoch': '1'}") == 12350.0
    assert parse_train_runtime("Traceback (most recent call last):") is None
    assert bar_step(" 33%|███▎      | 2/6 [00:00<00:00, 14.24it/s]", 6) == 2
    assert bar_step("100%|██████████| 6/6 [00:00<00:00, 17.51it/s]", 6) == 6
    assert bar_step(" 33%|███▎      | 2/6 [00:00<00:00, 14.24it/s]", 2) is None  # another run's bar
    assert bar_step("Tokenizing train dataset:  14%|█▍        | 6/6 [00:00<00:00, 2105.25 examples/s]", 6) is None


def test_the_steps_after_the_short_runs_count_are_timed_by_the_progress_bar() -> None:
    """The figure and its spread come from the long run's steps after the short run's count, each
    interval divided by the steps it covers: the warm-up before them is left out."""
    long = {1: 0.0, 2: 5.0, 3: 6.1, 5: 7.9, 6: 9.1}  # step 1 -> 2: warm-up; 3 -> 5: two steps in one update
    assert bar_seconds_per_step(long, 2) == pytest.approx(4.1 / 4)
    assert step_spread(long, {}, 2) == pytest.approx(relative_ci95([1.1, 0.9, 1.2]))
    assert bar_seconds_per_step({1: 0.0, 2: 1.0, 3: 2.2}, 3) is None
    # Too few intervals after the short run's steps: every interval after the first step, of both runs.
    assert step_spread({1: 0.0, 2: 1.0, 3: 2.2}, {1: 0.0, 2: 0.9}, 3) == pytest.approx(relative_ci95([1.0, 1.2, 0.9]))
    assert step_spread({3: 1.0}, {}, 3) == math.inf


def test_the_steps_timed_are_priced_on_the_very_batches_they_trained() -> None:
    """Accumulation 2, a cost of 0.1 s + 1 ms a position per optimizer step at one length. The
    first epoch has 5 micro-batches: its third step trains the one left over. The bar showed steps
    2, 3 and 5 after the short run's 2."""
    record = "epoch\n100\n100\n300\n100\n500\nepoch\n100\n100\n300\n300\n700\n"  # and the look-ahead
    steps = recorded_steps(record, 2)
    assert steps == [[100, 100], [300, 100], [500], [100, 100], [300, 300], [700]]
    cost = lambda length: 0.1 + 0.001 * length  # noqa: E731
    # Step 3: 0.6 / 2 = 0.3 s (one micro-batch of two); step 4: 0.2 s; step 5: 0.4 s.
    arrivals = {1: 0.0, 2: 2.0, 3: 2.33, 5: 3.32}
    priced = priced_steps(steps, 2, arrivals, 2, cost)
    assert priced is not None and priced.model_step_s == pytest.approx((0.3 + 0.2 + 0.4) / 3)
    # Each interval against its own batches' cost: 0.33 / 0.3 and 0.99 / 0.6 (steps 4 and 5).
    assert priced.spread_rel == pytest.approx(relative_ci95([0.33 / 0.3, 0.99 / 0.6]))
    assert priced.own_step_s is None  # two intervals: too few to tell the trainer's time from drift
    even = priced_steps(steps, 2, {2: 2.0, 3: 2.33, 5: 2.33 + 0.66}, 2, cost)
    assert even is not None and even.spread_rel == pytest.approx(0.0, abs=1e-9)  # every interval at its cost
    assert priced_steps(steps[:4], 2, arrivals, 2, cost) is None  # the last timed step's batches not seen
    assert priced_steps(steps, 2, {1: 0.0, 2: 2.0}, 2, cost) is None  # one step shown: nothing timed


def test_a_steps_new_padded_lengths_are_priced_at_their_first_sight() -> None:
    """A run's first steps meet new padded lengths, each costing the probe's first sight once (the
    allocator, autotuned kernels): priced on the step that meets it, the trainer's own time is the
    trainer's; unpriced, a fresh run's steps read as the trainer's cost, falling as lengths repeat."""
    rng = np.random.default_rng(3)
    lengths = [int(n) for n in rng.choice([64, 96, 128, 192, 256, 320, 384, 448, 512, 640], 40)]
    steps = [[n] for n in lengths]
    cost = lambda length: 0.05 + 0.0005 * length  # noqa: E731
    sight, own = 0.08, 0.01
    seen: set[int] = set()
    arrivals, t = {}, 0.0
    for k, (n,) in enumerate(steps, start=1):
        t += cost(n) + own + (sight if n not in seen else 0.0)
        seen.add(n)
        arrivals[k] = t
    priced = priced_steps(steps, 1, arrivals, 2, cost, first_sight=sight)
    assert priced is not None and priced.own_step_s == pytest.approx(own)
    assert priced.pace_change_rel is None  # the pace held, for the work the steps did
    met_before = {n for (n,) in steps[:2]}
    new = len({n for (n,) in steps[2:]} - met_before)
    assert priced.model_step_s == pytest.approx((sum(cost(n) for (n,) in steps[2:]) + sight * new) / 38)
    blind = priced_steps(steps, 1, arrivals, 2, cost)  # the first sights taken for the trainer's cost
    assert blind is not None and blind.own_step_s is not None and blind.own_step_s > own + 0.01


def test_the_trainers_own_time_is_told_from_the_machines_drift() -> None:
    """Steps whose expected cost varies (random-order batches of long-tailed data): a machine 10% slower
    than when probed scales each step with its cost, the trainer adds the same 20 ms to each."""
    expected = [0.05, 0.30, 0.12, 0.08, 0.25, 0.15, 0.06, 0.20]
    drift_and_own = [(1.10 * e + 0.020, e, 1) for e in expected]
    assert own_step_time(drift_and_own) == pytest.approx(0.020)
    # Drift alone: the difference of the totals would say 10% of a step is the trainer's; the fit says none.
    assert own_step_time([(1.10 * e, e, 1) for e in expected]) == pytest.approx(0.0, abs=1e-12)
    # An interval of two steps (tqdm skipped an update) pays the trainer's time twice.
    assert own_step_time([*drift_and_own, (1.10 * 0.4 + 0.040, 0.4, 2)]) == pytest.approx(0.020)
    # Fixed padding: every step costs the same, drift and the trainer's time cannot be told apart.
    assert own_step_time([(1.10 * 0.2 + 0.020, 0.2, 1)] * 8) is None
    assert own_step_time(drift_and_own[:2]) is None  # too few intervals
    common = dict(steps=8, seconds_per_step=0.18, samples_per_second=5.6, probe_samples_per_second=6.2, ratio=0.9,
                  spread_rel=0.04, startup_s=12.0, command="trl sft ...", device="cpu", model_step_s=0.15)
    assert Calibration(own_step_s=0.02, **common).trainer_overhead_s() == pytest.approx(0.02)  # not 0.03
    assert Calibration(own_step_s=-0.01, **common).trainer_overhead_s() == 0.0
    assert Calibration(**common).trainer_overhead_s() == pytest.approx(0.03)  # not separable: the difference


def test_a_pace_that_changes_across_the_timed_steps_is_told_from_noise() -> None:
    """A fresh process on a GPU still speeding up (docs/benchmarks.md: 0.28 s a step, then 0.22): the
    later half of the timed steps ran faster for the same work. A steady pace over steps of varied
    work, drift as small as a whole CPU run's, or a change within the noise say nothing."""
    work = [0.05, 0.30, 0.12, 0.08, 0.25, 0.15, 0.06, 0.20, 0.10, 0.18]
    assert pace_change([(1.2 * w, w) for w in work]) is None
    settling = [(w * (1.6 if i < 5 else 1.2), w) for i, w in enumerate(work)]
    assert pace_change(settling) == pytest.approx(1.2 / 1.6 - 1)
    assert pace_change([(w * (1.0 if i < 5 else 1.15), w) for i, w in enumerate(work)]) == pytest.approx(0.15)
    assert pace_change([(w * (1.0 if i < 5 else 1.05), w) for i, w in enumerate(work)]) is None  # under 10%
    scattered = [0.6, 1.4, 0.7, 1.5, 0.8, 1.3, 0.7, 1.6, 0.9, 1.5]  # +25% between the halves, within their noise
    assert pace_change([(w * f, w) for w, f in zip(work, scattered)]) is None
    assert pace_change(settling[:6]) is None  # too few intervals
    assert pace_change([(0.0, 1.0)] * 4 + [(1.0, 1.0)] * 4) is None  # bar updates stamped alike: no pace to compare
    # Priced on the very batches: steps 3-12 of one 100-position micro-batch each (0.2 s expected), the
    # first five timed at 0.32 s, the next five at 0.24 s.
    cost = lambda length: 0.1 + 0.001 * length  # noqa: E731
    arrivals, t = {2: 0.0}, 0.0
    for n in range(3, 13):
        t += 0.32 if n < 8 else 0.24
        arrivals[n] = t
    priced = priced_steps([[100]] * 12, 1, arrivals, 2, cost)
    assert priced is not None and priced.pace_change_rel == pytest.approx(0.24 / 0.32 - 1)


def test_the_trainers_cost_is_against_the_same_batches_where_they_were_priced() -> None:
    common = dict(steps=20, seconds_per_step=1.0, samples_per_second=8.0, probe_samples_per_second=10.0,
                  spread_rel=0.04, startup_s=12.0, command="trl sft ...", device="cpu")
    # The first batches were long: the trainer's 1.0 s a step is 0.8x the epoch's average speed, but
    # the probe expected 0.95 s of those very batches: the trainer's own cost is 0.05 s, not 0.2.
    assert Calibration(ratio=0.8, model_step_s=0.95, **common).trainer_overhead_s() == pytest.approx(0.05)
    # Short first batches: faster than the epoch's average, yet slower than the probe expected of them.
    assert Calibration(ratio=1.2, model_step_s=0.9, **common).trainer_overhead_s() == pytest.approx(0.1)
    # Faster than the probe expected of those batches: the machine's drift, not a trainer cost below 0.
    assert Calibration(ratio=1.2, model_step_s=1.1, **common).trainer_overhead_s() == 0.0
    # Not priced: against the epoch's average, never below 0.
    assert Calibration(ratio=0.8, **common).trainer_overhead_s() == pytest.approx(0.2)
    assert Calibration(ratio=1.2, **common).trainer_overhead_s() == 0.0


def test_a_calibration_reads_back_from_json_with_an_unknown_spread() -> None:
    c = Calibration(steps=4, seconds_per_step=0.5, samples_per_second=16.0, probe_samples_per_second=20.0, ratio=0.8,
                    spread_rel=math.inf, startup_s=3.0, command="trl sft --max_steps 6", device="cpu")
    raw = json.loads(json.dumps(c.to_json()))
    assert raw["spread_rel"] is None and raw["schema_version"] == 1
    assert Calibration.from_json(raw) == c
    settling = replace(c, pace_change_rel=-0.25)
    assert Calibration.from_json(json.loads(json.dumps(settling.to_json()))) == settling
    with pytest.raises(TrainfitError, match="schema version 2"):
        Calibration.from_json({**raw, "schema_version": 2})
    # recorded before `trainfit train`'s own start-up or the batches' price were measured: none, not a KeyError
    older = Calibration.from_json({k: v for k, v in raw.items()
                                   if k not in ("train_startup_s", "model_step_s", "own_step_s", "trial",
                                                "micro_batches", "pace_change_rel")})
    assert older.train_startup_s is None and older.model_step_s is None and older.own_step_s is None
    assert older.trial is None and older.micro_batches == 1 and older.pace_change_rel is None


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Calibration, list[str], Path]:
    """A real tune of the bundled example (one config, a real probe), then a real calibration of it:
    `trl sft` for 4 then 24 steps, enough for the progress bar to show several (nothing downloaded: the saved model, the bundled data, the Hub off)."""
    pytest.importorskip("trl")
    root = tmp_path_factory.mktemp("calibrated")
    out, work, lines = root / "run", root / "work", []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINFIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("PATH", os.pathsep.join(p for p in ("/usr/bin", "/bin") if os.path.isdir(p)))  # trl: found beside Python
        tune(load_spec(EXAMPLES / "tiny-llama.yaml", [*SMALL_TUNE, *QUICK_PROBE]), TuneOptions(output=out))
        calibration = calibrate(out, 20, work=work, step_cost=best_step_cost(out), on_progress=lines.append)
    return out, calibration, lines, work


@pytest.mark.integration
@pytest.mark.slow
def test_a_calibration_times_real_trl_steps_of_the_written_command(calibrated) -> None:
    out, c, lines, work = calibrated
    best = json.loads((out / "summary.json").read_text())["best_config"]
    assert c.steps == 20 and short_steps(20) == 4
    assert c.seconds_per_step > 0 and c.samples_per_second > 0 and c.spread_rel > 0
    assert c.startup_s > 0  # launch to exit holds more than the steps: imports, the model, the data
    assert c.train_startup_s is not None and c.train_startup_s > 0  # the same, for `trainfit train`'s run
    assert c.samples_per_second == pytest.approx(best["effective_batch_size"] / c.seconds_per_step)
    assert c.probe_samples_per_second == best["samples_per_second"]
    assert c.ratio == pytest.approx(c.samples_per_second / c.probe_samples_per_second)
    # The written command, as run: tune's command for the best config with the calibration's arguments after it.
    assert c.command == f"{best['command']} {shlex.join(calibration_args(24, work / 'trainer-24-steps'))}"
    assert c.device == json.loads((out / "summary.json").read_text())["device"]
    assert sorted(p.name for p in work.iterdir()) == ["batches-24-steps.txt", "calibrate-24-steps.log",
                                                      "calibrate-4-steps.log", "train_command.sh"]  # not the trainer's output folders
    # The long run recorded every micro-batch it trained (24 steps of 8 at batch 4, and the look-ahead), each
    # padded to its longest sample (the bundled data's lengths vary; max_length 256), and priced the timed ones.
    text = (work / "batches-24-steps.txt").read_text()
    assert text.startswith("epoch\n")
    recorded = [length for step in recorded_steps(text, 8)[:24] for length in step]
    assert len(recorded) == 24 * 8 and len(set(recorded)) > 1 and max(recorded) <= 256
    assert c.model_step_s is not None and 0 < c.model_step_s
    # The trainer's own time: fitted apart from the machine's drift where the timed steps' costs varied enough
    # (which bar updates tqdm drew decides that), else the timed step less the probe's cost of those batches.
    separable = c.own_step_s is not None
    assert c.trainer_overhead_s() == pytest.approx(max(0.0, c.own_step_s if c.own_step_s is not None else
                                                       c.seconds_per_step - c.model_step_s))
    assert (work / "train_command.sh").read_text() == (out / "train_command.sh").read_text()
    # The line on the pace's change comes last, and only where the later steps' pace moved beyond the noise.
    pace_said = lines[-1].startswith("the later half of the timed steps ran ")
    ending = lines[:-1] if pace_said else lines
    assert lines[0].startswith("run 1 of 2: `trl sft` for 4 steps") and "run 2 of 2: done: " in ending[-4]
    assert any(line.startswith("run 2 of 2: `trainfit train` for 24 steps") for line in lines)
    assert "by the runs' train_runtime difference" in ending[-3] and "(the figure)" in ending[-2]
    assert ending[-1].startswith("the probe's cost of the very batches timed: ")
    assert ("told from the machine's drift" in ending[-1]) == separable
    assert pace_said == (c.pace_change_rel is not None)
    assert Calibration.from_json(json.loads(json.dumps(c.to_json()))) == c
