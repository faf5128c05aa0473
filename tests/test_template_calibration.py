"""A calibration of your own trainer: a ``tune.command_template`` with a ``{max_steps}`` placeholder
run twice for a few real steps (in the folder tune ran from, each run told a throw-away output
folder), its extra steps timed by its progress bar, as the written ``trl sft`` command is; and a
template it cannot stop refused in words, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import EXAMPLES
from tune_helpers import fixed_speed

from trainfit.errors import TrainfitError
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec
from trainfit.trainer.calibration import calibrate
from trainfit.trainer.calibration_checks import check_can_calibrate
from trainfit.tune import calibration_steps, tune

STEP_S = 0.1
"""What a step of the stand-in trainer sleeps: no step can be timed shorter."""

PROBE_SPEED = 1000.0

TRAINER = f"""#!/usr/bin/env bash
# A stand-in for your trainer: --bs N --max_steps M (absent: 50 steps, its "epoch"), a tqdm-style bar.
set -eu
steps=50
while [ $# -gt 0 ]; do case "$1" in --max_steps) steps=$2; shift 2;; *) shift;; esac; done
pwd > ran-in.txt
echo "$steps" >> steps-run.txt
mkdir -p "$TRAINFIT_OUTPUT" && touch "$TRAINFIT_OUTPUT/checkpoint"
for i in $(seq 1 "$steps"); do
  sleep {STEP_S}
  printf '\\r%3d%%|#####| %d/%d [00:01<00:00,  9.00it/s]' $((100 * i / steps)) "$i" "$steps"
done
echo
"""


fixed = fixed_speed(PROBE_SPEED, step_time_s=16 / PROBE_SPEED)
"""Not a probe (these tests are about the command the tune leaves): every config fits, faster than the
stand-in trainer runs it (16 samples a step at 1000 samples/s: 0.016 s a step)."""


def template_spec(template: str):
    return load_spec(EXAMPLES / "tiny-tts.yaml", ["tune.max_trials=1", "search={batch_size: [4]}",
                                                 f"tune.command_template={template}"])


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the current folder, holding the stand-in trainer (its path in the template is relative)."""
    (tmp_path / "trainer.sh").write_text(TRAINER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_a_template_without_max_steps_is_refused_with_the_placeholder_to_add(in_tmp: Path) -> None:
    spec = template_spec("bash trainer.sh --bs {batch_size}")
    with pytest.raises(TrainfitError, match=r"has no \{max_steps\} placeholder") as err:
        check_can_calibrate(spec)
    assert "add `--max_steps {max_steps}`" in (err.value.hint or "")
    # On a GPU nobody asked for it: a note says why there is none, the search goes on.
    steps, note = calibration_steps(spec, "cuda:0", None)
    assert steps is None and note is not None and "{max_steps}" in note
    tune(spec, TuneOptions(output=in_tmp / "run", probe_fn=fixed))
    with pytest.raises(TrainfitError, match=r"has no \{max_steps\} placeholder") as err:
        calibrate(in_tmp / "run", 4, work=in_tmp / "work")
    assert "tune again with --resume" in (err.value.hint or "")
    assert not (in_tmp / "work").exists()  # refused before anything ran


def test_the_written_command_drops_max_steps_and_a_calibration_fills_it(in_tmp: Path) -> None:
    spec = template_spec("bash trainer.sh --bs {batch_size} --max_steps {max_steps}")
    assert calibration_steps(spec, "cuda:0", None)[0] == 30  # calibrated by default on a GPU
    lines: list[str] = []
    result = tune(spec, TuneOptions(output=in_tmp / "run", probe_fn=fixed, calibrate_steps=8,
                                    on_calibration=lines.append))
    script = (in_tmp / "run" / "train_command.sh").read_text()
    assert script.rstrip().endswith("bash trainer.sh --bs 4")  # the run trains its epochs
    # Run twice in the folder tune ran from: 2 steps, then 2 + 8, each writing to its own throw-away folder.
    assert (in_tmp / "ran-in.txt").read_text().strip() == str(in_tmp)
    assert (in_tmp / "steps-run.txt").read_text().split() == ["2", "10"]
    cost = json.loads((in_tmp / "run" / "trainer_cost.json").read_text())
    c = cost["calibration"]
    assert c["command"] == "bash trainer.sh --bs 4 --max_steps 10"
    assert c["steps"] == 8 and c["seconds_per_step"] >= 0.9 * STEP_S  # timed by the bar: each step sleeps that long (read when the
    # tune process sees the bar move: a late reading of the first step would shorten the window by a little)
    best = result.summary.best_config
    assert best is not None and c["samples_per_second"] == pytest.approx(best.effective_batch_size / c["seconds_per_step"])
    assert c["train_startup_s"] is None and c["model_step_s"] is None  # no `trainfit train` run, no batches seen
    assert any("launch-to-exit time difference" in line for line in lines)  # the stand-in prints no train_runtime
    assert any("progress bar (the figure)" in line for line in lines)
    # The trainer's cost ranks: the summary's speed is the calibrated one, far below the probe's.
    assert result.summary.trainer_cost is not None and best.probe_samples_per_second == PROBE_SPEED
    assert best.samples_per_second == pytest.approx(c["samples_per_second"], rel=0.01)
    assert not list(in_tmp.glob("**/checkpoint"))  # the scratch output folders went with the runs


def test_the_library_calibrates_by_default_on_a_gpu_as_the_cli_does(in_tmp: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``tune()`` with no ``calibrate_steps``: none on a CPU, 30 real steps on a GPU (the H100 epoch race
    of 2026-11-27 ran the library uncalibrated, its estimate a lower bound); 0, or a stand-in for the
    probes: none."""
    import trainfit.tune as tune_module

    spec = template_spec("bash trainer.sh --bs {batch_size} --max_steps {max_steps}")
    tune(spec, TuneOptions(output=in_tmp / "cpu", probe_fn=fixed))
    assert not (in_tmp / "steps-run.txt").exists() and not (in_tmp / "cpu" / "trainer_cost.json").exists()
    monkeypatch.setattr(tune_module, "resolve_device_name", lambda device: "cuda:0")  # what a GPU machine resolves
    tune(spec, TuneOptions(output=in_tmp / "none", calibrate_steps=0))  # real probes (this CPU's), none asked
    tune(spec, TuneOptions(output=in_tmp / "stand-in", probe_fn=fixed))  # nothing real to calibrate against
    assert not (in_tmp / "steps-run.txt").exists()
    lines: list[str] = []
    result = tune(spec, TuneOptions(output=in_tmp / "gpu", on_calibration=lines.append))
    short, long = map(int, (in_tmp / "steps-run.txt").read_text().split())
    assert long - short == 30  # the default's real steps, past the short run's start-up
    assert result.summary.trainer_cost is not None and (in_tmp / "gpu" / "trainer_cost.json").exists()
    assert any(line.startswith("note: on a GPU the trainer's own cost is timed by default") for line in lines)


def test_a_summary_whose_best_config_no_longer_fills_the_template_is_refused(in_tmp: Path) -> None:
    tune(template_spec("bash trainer.sh --bs {batch_size} --max_steps {max_steps}"), TuneOptions(output=in_tmp / "run",
                                                                                                 probe_fn=fixed))
    path = in_tmp / "run" / "summary.json"
    raw = json.loads(path.read_text())
    raw["best_config"]["command"] = "bash trainer.sh --bs 8"
    path.write_text(json.dumps(raw))
    with pytest.raises(TrainfitError, match="does not fill tune.command_template into the command tune wrote"):
        calibrate(in_tmp / "run", 4, work=in_tmp / "work")
    assert not (in_tmp / "work").exists()


def test_a_bar_that_arrives_in_one_piece_is_no_bar_and_the_runs_time_the_steps(in_tmp: Path) -> None:
    """A trainer whose output is buffered prints every bar update at its end, in one write: they
    share one arrival, which times no step (it divided by zero); the two runs' launch-to-exit
    difference times them instead."""
    buffered = TRAINER.replace("steps=50\n", "steps=50\nbar=\n").replace("printf '", "bar=$bar$(printf '")
    buffered = buffered.replace('"$i" "$steps"\n', '"$i" "$steps")\n').replace("done\necho", 'done\necho "$bar"')
    (in_tmp / "trainer.sh").write_text(buffered)
    tune(template_spec("bash trainer.sh --bs {batch_size} --max_steps {max_steps}"),
         TuneOptions(output=in_tmp / "run", probe_fn=fixed, calibrate_steps=0))
    lines: list[str] = []
    c = calibrate(in_tmp / "run", 6, work=in_tmp / "work", on_progress=lines.append)
    assert c.seconds_per_step >= 0.5 * STEP_S  # each step sleeps that long; two launches' noise besides
    assert not any("progress bar (the figure)" in line for line in lines)


def test_a_template_whose_trainer_ignores_max_steps_is_stopped_with_the_fix(in_tmp: Path) -> None:
    """A trainer that does not stop at the steps asked for would train its whole run, twice: its bar
    counting past them stops it at once."""
    # --steps: not the flag the stand-in stops by, so it runs its 50 steps
    tune(template_spec("bash trainer.sh --bs {batch_size} --steps {max_steps}"),
         TuneOptions(output=in_tmp / "run", probe_fn=fixed))
    with pytest.raises(TrainfitError, match="counts 3 of 50 steps, past the 2 it was asked to stop at") as err:
        calibrate(in_tmp / "run", 4, work=in_tmp / "work")
    assert "passes {max_steps} to the flag your trainer stops by" in (err.value.hint or "")


def test_a_custom_key_may_not_take_a_template_placeholders_name_nor_packing_go_unpassed() -> None:
    from trainfit.errors import SpecError

    with pytest.raises(SpecError, match="params.max_steps: a custom key named 'max_steps', which the command template"):
        load_spec(EXAMPLES / "tiny-tts.yaml", ["max_steps=500", "tune.command_template=bash t.sh --n {max_steps}"])
    with pytest.raises(SpecError, match="the template passes no {packing}"):
        load_spec(EXAMPLES / "tiny-llama.yaml", ["search={packing: [false, true]}",
                                                 "tune.command_template=python t.py --bs {batch_size}"])
    load_spec(EXAMPLES / "tiny-llama.yaml", ["search={packing: [false, true]}",
                                             "tune.command_template=python t.py --bs {batch_size} --packing {packing}"])


def test_a_failing_template_run_names_its_log(in_tmp: Path) -> None:
    tune(template_spec("bash trainer.sh --bs {batch_size} --max_steps {max_steps} && exit 7"),
                       TuneOptions(output=in_tmp / "run", probe_fn=fixed))
    with pytest.raises(TrainfitError, match="2-step run of your tune.command_template exited with 7") as err:
        calibrate(in_tmp / "run", 4, work=in_tmp / "work")
    assert str(in_tmp / "work" / "calibrate-2-steps.log") in (err.value.hint or "")


def test_train_max_steps_fills_the_templates_max_steps_or_says_why_not(in_tmp: Path) -> None:
    """``trainfit train --max-steps N`` on a template run: the command tune wrote, with ``{max_steps}``
    filled (a template without one is refused before anything runs, with the ways on)."""
    from trainfit.train import TrainOptions, train

    tune(template_spec("bash trainer.sh --bs {batch_size} --max_steps {max_steps}"), TuneOptions(output=in_tmp / "run",
                                                                                                 probe_fn=fixed))
    train(in_tmp / "run", in_tmp / "out", TrainOptions(max_steps=3, say=lambda line: None))
    assert (in_tmp / "steps-run.txt").read_text().split() == ["3"]
    assert json.loads((in_tmp / "out" / "train.json").read_text())["argv"] == ["bash trainer.sh --bs 4 --max_steps 3"]
    tune(template_spec("bash trainer.sh --bs {batch_size}"), TuneOptions(output=in_tmp / "plain", probe_fn=fixed))
    with pytest.raises(TrainfitError, match=r"--max-steps 3 stops your tune.command_template after 3 steps, and it "
                                            r"has no \{max_steps\} placeholder") as err:
        train(in_tmp / "plain", in_tmp / "out2", TrainOptions(max_steps=3, say=lambda line: None))
    assert "pass your trainer's own step limit after --" in (err.value.hint or "")
    assert not (in_tmp / "out2").exists()
