"""A compare winner carried on (``plan --from-compare``): planned among the tune's configs that learn
as it does, with its training values, and trained by name (issue 48 item 3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import learnable_spec

from trainfit.cli import main
from trainfit.spec.training import TrainValues


@pytest.fixture(scope="module")
def tuned_and_compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A factory model tuned over its width (a key of its own, which changes what is learned), and
    a comparison of two widths at two learning rates."""
    root = tmp_path_factory.mktemp("from-compare")
    spec = learnable_spec(root, 40, {"batch_size": 2, "gradient_accumulation_steps": 1, "max_length": 16, "width_mul": 1},
                          "search:\n  batch_size: [2]\n  width_mul: [1, 2]\ntrain:\n  weight_decay: 0.05\n")
    run = root / "tune"
    assert main(["tune", str(spec), "--output", str(run), "--strategy", "grid"]) == 0
    (root / "configs.yaml").write_text("narrow: {width_mul: 1, learning_rate: 1.0e-3}\n"
                                       "wide: {width_mul: 2, learning_rate: 3.0e-3, lr_scheduler_type: cosine}\n")
    compared = root / "compare"
    assert main(["compare", str(spec), "--configs", str(root / "configs.yaml"), "--steps", "6",
                 "--output", str(compared)]) in (0, 1)
    return run, compared


@pytest.mark.integration
def test_a_compare_winner_is_planned_and_trained_by_name(tuned_and_compared: tuple[Path, Path], tmp_path: Path,
                                                         capsys) -> None:
    run, compared = tuned_and_compared
    ranking = json.loads((compared / "compare.json").read_text())["ranking"]
    assert sorted(ranking) == ["narrow", "wide"]  # both finished, best first
    for name in ("wide", "narrow"):
        assert main(["plan", str(run), "--max-hours", "1", "--from-compare", str(compared), "--config", name]) in (0, 1)
        plan = json.loads((run / "plan.json").read_text())
        assert plan["config"]["width_mul"] == (2 if name == "wide" else 1)  # among the configs that learn as it does
        assert plan["from_compare"]["name"] == name and plan["from_compare"]["chosen"] == "named"
        assert f"learns as compare's {name} (named" in (run / "plan.txt").read_text()
    assert plan["from_compare"]["training"] == {"learning_rate": 1e-3}
    out = tmp_path / "out"
    assert main(["train", str(run), "--output", str(out), "--max-steps", "4"]) == 0
    trained = json.loads((out / "train.json").read_text())
    assert trained["config"]["width_mul"] == 1 and trained["trial"] == plan["trial"]
    # the winner's learning rate over the tune's train: section (its weight decay kept)
    assert trained["training"] == TrainValues(learning_rate=1e-3, weight_decay=0.05).to_json()
    # without --config: the comparison's best
    assert main(["plan", str(run), "--max-hours", "1", "--from-compare", str(compared)]) in (0, 1)
    best = json.loads((run / "plan.json").read_text())["from_compare"]
    assert (best["name"], best["chosen"]) == (ranking[0], "best")


@pytest.mark.integration
def test_a_winner_the_tune_never_measured_is_refused_naming_what_differs(tuned_and_compared: tuple[Path, Path],
                                                                        tmp_path: Path, capsys) -> None:
    run, compared = tuned_and_compared
    doc = json.loads((compared / "compare.json").read_text())
    doc["configs"]["odd"] = {"width_mul": 3}
    other = tmp_path / "compare"
    other.mkdir()
    (other / "compare.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["plan", str(run), "--max-hours", "1", "--from-compare", str(other), "--config", "odd"]) == 2
    err = capsys.readouterr().err
    assert "measured no config that learns as compare's odd does: width_mul=3 (the tune measured 1, 2)" in err
    assert main(["plan", str(run), "--max-hours", "1", "--from-compare", str(other), "--config", "nope"]) == 2
    assert "compared no config named 'nope'" in capsys.readouterr().err
    assert main(["plan", str(run), "--max-hours", "1", "--config", "wide"]) == 2
    assert "--config names a config of a comparison" in capsys.readouterr().err


@pytest.mark.integration
def test_train_takes_a_compare_winner_without_a_plan_and_refuses_a_plan_of_another(
        tuned_and_compared: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    run, compared = tuned_and_compared
    bare = tmp_path / "tune"
    shutil.copytree(run, bare, ignore=shutil.ignore_patterns("plan.json", "plan.txt", "actual.json"))
    out = tmp_path / "out"
    assert main(["train", str(bare), "--output", str(out), "--max-steps", "3", "--from-compare", str(compared),
                 "--config", "wide"]) == 0
    trained = json.loads((out / "train.json").read_text())
    assert (trained["source"], trained["config"]["width_mul"]) == ("compare.json", 2)
    assert trained["training"] == TrainValues(learning_rate=3e-3, lr_scheduler_type="cosine",
                                              weight_decay=0.05).to_json()
    assert main(["plan", str(bare), "--max-hours", "1", "--from-compare", str(compared), "--config", "narrow"]) in (0, 1)
    capsys.readouterr()
    assert main(["train", str(bare), "--output", str(tmp_path / "again"), "--from-compare", str(compared),
                 "--config", "wide"]) == 2
    err = capsys.readouterr().err
    assert "plan.json decides what trains, and it carries compare's narrow, not wide" in err
    assert f"--from-compare {compared.resolve()} --config wide" in err


@pytest.mark.integration
def test_the_comparisons_best_run_to_completion_and_the_lowest_loss_is_picked(
        tuned_and_compared: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """Guide 001's phase 4 (issue 48 item 3): the comparison's 2 best, each the fastest way that
    learns as it does, whatever the tune folder's plan chose; then set side by side."""
    run, compared = tuned_and_compared
    out = tmp_path / "finals"
    capsys.readouterr()
    assert main(["train", str(run), "--from-compare", str(compared), "--top", "2", "--max-steps", "3",
                 "--output", str(out)]) == 0
    said = capsys.readouterr()
    finals = json.loads((out / "finals.json").read_text())
    ranking = json.loads((compared / "compare.json").read_text())["ranking"]
    assert [f["name"] for f in finals["finals"]] == ranking and {f["status"] for f in finals["finals"]} == {"finished"}
    assert finals["pick"] == min(finals["finals"], key=lambda f: f["loss"])["name"]
    assert f"final pick: {finals['pick']}, by the lowest final train loss" in said.out
    assert "final 1 of 2: " in said.err and " epoch(s)" in said.err  # each one's ETA before it starts
    for name, width in (("narrow", 1), ("wide", 2)):
        trained = json.loads((out / name / "train.json").read_text())
        assert (trained["source"], trained["config"]["width_mul"]) == ("compare.json", width)
    # again with --resume: each final finished already, nothing trains again
    assert main(["train", str(run), "--from-compare", str(compared), "--top", "2", "--max-steps", "3",
                 "--output", str(out), "--resume"]) == 0
    assert main(["train", str(run), "--top", "2"]) == 2
    assert "--config and --top name configs of a comparison" in capsys.readouterr().err


@pytest.mark.integration
def test_a_comparison_whose_spec_changed_since_is_refused(tuned_and_compared: tuple[Path, Path], tmp_path: Path,
                                                         capsys) -> None:
    """Its configs' knobs would be read over the spec as it is now (a review: a max_length edited
    since was blamed on the tune)."""
    run, compared = tuned_and_compared
    doc = json.loads((compared / "compare.json").read_text())
    spec = tmp_path / "spec.yaml"
    spec.write_text(Path(doc["spec"]).read_text() + "# edited since\n")
    other = tmp_path / "compare"
    other.mkdir()
    (other / "compare.json").write_text(json.dumps({**doc, "spec": str(spec)}))
    capsys.readouterr()
    assert main(["plan", str(run), "--max-hours", "1", "--from-compare", str(other)]) == 2
    assert f"the spec {spec} has changed since the comparison in {other} ran on it" in capsys.readouterr().err
