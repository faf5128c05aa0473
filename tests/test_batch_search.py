"""The ``auto`` search past the grid: the largest batch that fits, at any integer (not only the
grid's powers of two), and no probe of a memory-only knob where the config fits without it.
Searched over the synthetic surface of ``tune_helpers`` (search logic only, never a measurement):
memory = 10 GiB + 1.8 GiB a sample (0.9 with checkpointing), under 40 GiB less 2 of headroom."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA, make_spec_file
from tune_helpers import BUDGET, HEADROOM, Surface

from trainfit.params import Params
from trainfit.space import integers_between
from trainfit.tune.options import TuneOptions
from trainfit.spec import Spec, load_spec, with_tune
from trainfit.tune import tune


def spec_searching(tmp_path: Path, search: str, tune_keys: str = "", memory_gb: float = BUDGET) -> Spec:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": memory_gb, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + f"search:\n{search}tune:\n  strategy: auto\n{tune_keys}")
    return load_spec(path)


def largest_fitting(surface: Surface, **knobs: Any) -> int:
    """A brute-force scan: the largest batch whose peak plus headroom stays within the budget."""
    return max(b for b in range(1, 257) if surface.memory_gb(Params(batch_size=b, **knobs)) + HEADROOM <= BUDGET)


def probed(surface: Surface, **knobs: Any) -> list[int]:
    return sorted(c["batch_size"] for c in surface.calls if all(c[k] == v for k, v in knobs.items()))


def test_the_search_reaches_the_largest_batch_that_fits_at_an_integer_off_the_grid(tmp_path: Path) -> None:
    surface = Surface()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32, 64]\n")
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    truth = largest_fitting(surface)
    assert truth == 15  # the surface's boundary lies between two powers of two
    best = result.summary.to_json()["best_config"]
    assert best["config"]["batch_size"] == truth  # throughput grows with the batch on this surface
    fits = [b for b in probed(surface) if surface.memory_gb(Params(batch_size=b)) + HEADROOM <= BUDGET]
    assert max(fits) == truth
    assert len(surface.calls) <= 8  # the climb (1, 2, 4, 8), then the line's guess and its check
    # The off-grid trial is stored with its value, and a resumed run knows it: nothing is probed again.
    again = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface, resume=True))
    assert again.new_trials == 0
    assert again.summary.to_json()["best_config"]["config"]["batch_size"] == truth


class Leaner(Surface):
    """1.7 GiB a sample (0.6 with checkpointing): batch 16 fits the budget less headroom (37.2 of
    38 GiB), though not within the line's 5% margin; a step costs 6 s + 1 s a sample (1.15 with
    checkpointing), so samples/s keeps growing slowly with the batch."""

    def memory_gb(self, p: Params) -> float:
        return 10.0 + p.batch_size * (0.6 if p.gradient_checkpointing else 1.7)

    def throughput(self, p: Params) -> float:
        return p.batch_size / (6.0 + p.batch_size * (1.15 if p.gradient_checkpointing else 1.0))


def test_the_grids_next_step_is_probed_where_the_line_puts_it_short_only_of_the_margin(tmp_path: Path) -> None:
    surface = Leaner()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32, 64]\n")
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    assert largest_fitting(surface) == 16
    assert result.summary.to_json()["best_config"]["config"]["batch_size"] == 16
    assert probed(surface) == [1, 2, 4, 8, 16, 17]  # no bisection below a step the line says fits


def test_checkpointing_is_probed_where_the_family_without_it_climbed_to_its_memory_limit(tmp_path: Path) -> None:
    """Without checkpointing the climb ends at 16, its memory limit, each step still gaining for its
    size; checkpointing fits far larger batches, and the largest is the fastest config."""
    surface = Leaner()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32, 64]\n  gradient_checkpointing: [false, true]\n")
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    best = result.summary.to_json()["best_config"]["config"]
    truth = largest_fitting(surface, gradient_checkpointing=True)
    assert best["gradient_checkpointing"] is True and best["batch_size"] == truth
    assert min(probed(surface, gradient_checkpointing=True)) > largest_fitting(surface, gradient_checkpointing=False)


def test_an_oom_between_two_grid_steps_is_bisected_to_adjacent_batches(tmp_path: Path) -> None:
    """The line's guess is off (memory rises faster past batch 8): each OOM halves the gap, and
    the search ends with the largest fit and the smallest failure one apart."""

    class Steeper(Surface):
        def memory_gb(self, p: Params) -> float:
            return super().memory_gb(p) + max(0, p.batch_size - 8) * 1.5

    surface = Steeper()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32, 64]\n")
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    truth = largest_fitting(surface)
    assert result.summary.to_json()["best_config"]["config"]["batch_size"] == truth
    failed = [b for b in probed(surface) if surface.memory_gb(Params(batch_size=b)) + HEADROOM > BUDGET]
    assert min(failed) == truth + 1
    # the OOMs off the grid stand in as the grid's batch above them, the fits as the one below
    off_grid = assert_stand_ins(opened_study(spec, tmp_path / "out" / "study.journal"), ["batch_size"])
    assert set(off_grid) & set(failed) and set(off_grid) - set(failed)


def test_with_a_target_effective_batch_only_its_divisors_are_probed_past_the_grid(tmp_path: Path) -> None:
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 48]\n", "  target_effective_batch: 48\n")
    assert spec.search is not None
    assert integers_between(spec.search, 8, 48) == [12, 16, 24]  # each keeps 48 exactly (x4, x3, x2)
    surface = Surface()
    tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    assert all(48 % b == 0 for b in probed(surface))
    assert 12 in probed(surface)  # 16 does not fit: 12 is the largest divisor that does


def test_checkpointing_is_probed_only_at_batches_the_config_without_it_cannot_fit(tmp_path: Path) -> None:
    surface = Surface()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32]\n  gradient_checkpointing: [false, true]\n")
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    lean_max = largest_fitting(surface, gradient_checkpointing=False)
    with_ckpt = probed(surface, gradient_checkpointing=True)
    assert with_ckpt and min(with_ckpt) > lean_max
    pruned = result.summary.to_json()["pruned"]
    assert pruned == [{"config": {"gradient_checkpointing": True}, "up_to_batch": lean_max,
                       "reason": f"batches up to {lean_max} fit without gradient_checkpointing, "
                                 "which only trades speed for memory there"}]


def test_checkpointing_is_not_probed_at_all_where_every_batch_fits_without_it(tmp_path: Path, capsys: Any) -> None:
    from trainfit.cli.tune_render import print_result

    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4]\n  gradient_checkpointing: [false, true]\n")
    surface = Surface()
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    assert probed(surface, gradient_checkpointing=True) == []
    assert probed(surface, gradient_checkpointing=False) == [1, 2, 4]
    [pruned] = result.summary.to_json()["pruned"]
    assert pruned["up_to_batch"] is None and "the climb ended below the memory limit (batch 1, 2, 4 fit)" in pruned["reason"]
    assert print_result(result, spec) == 0  # the CLI's renderer of a finished search
    assert "not probed: gradient_checkpointing=True at every batch: without gradient_checkpointing" in capsys.readouterr().out


def test_checkpointing_is_not_probed_where_a_larger_batch_stopped_being_faster_before_memory_ran_out(
        tmp_path: Path) -> None:
    """As on a CPU: past batch 2 a larger batch is slower, far below the memory limit, so the
    climb without checkpointing ends there and checkpointing (slower still) cannot win at any
    batch. A knob whose value is null (full fine-tuning's ``lora_r``) is no memory-only knob."""

    class Peaked(Surface):
        def throughput(self, p: Params) -> float:
            return super().throughput(p) / (1 + 0.4 * max(0, p.batch_size - 2))

    surface = Peaked()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32]\n  gradient_checkpointing: [false, true]\n"
                                    "  lora_r: [null, 8]\n")
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    assert probed(surface, gradient_checkpointing=True) == []
    pruned = result.summary.to_json()["pruned"]
    assert [p["config"] for p in pruned] == [{"gradient_checkpointing": True, "lora_r": None},
                                             {"gradient_checkpointing": True, "lora_r": 8}]
    assert all(p["up_to_batch"] is None and p["reason"].startswith("without gradient_checkpointing the climb ended")
               for p in pruned)


def test_checkpointing_is_probed_where_memory_held_back_a_family_its_rivals_beat_at_small_batches(
        tmp_path: Path) -> None:
    """A reviewer's case: a kernel with a large fixed cost a step but a small one a sample (``eager``
    here) loses at batch 1 and its memory stops it early without checkpointing; with checkpointing
    it reaches batch 31 and is the fastest of all. Its lean family was stopped by a rival, not by
    a larger batch getting slower: checkpointing must be probed, up to the batch it reaches."""

    class TwoKernels(Surface):
        def memory_gb(self, p: Params) -> float:
            if p.attention != "eager":
                return super().memory_gb(p)
            return 10.0 + p.batch_size * (0.9 if p.gradient_checkpointing else 5.5)

        def throughput(self, p: Params) -> float:
            if p.attention != "eager":
                return super().throughput(p)
            return p.batch_size / (3.0 + 0.01 * (1.3 if p.gradient_checkpointing else 1.0) * (p.batch_size + 1.5))

    surface = TwoKernels()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32]\n  gradient_checkpointing: [false, true]\n"
                                    "  attention: [sdpa, eager]\n")
    best = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface)).summary.to_json()["best_config"]["config"]
    truth = largest_fitting(surface, attention="eager", gradient_checkpointing=True)
    assert (best["attention"], best["gradient_checkpointing"], best["batch_size"]) == ("eager", True, truth)


def test_a_range_with_a_step_is_searched_past_its_grid_on_its_step_only(tmp_path: Path) -> None:
    surface = Surface()
    spec = spec_searching(tmp_path, "  batch_size: {low: 4, high: 64, step: 4}\n")
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    assert all(b % 4 == 0 for b in probed(surface))
    assert result.summary.to_json()["best_config"]["config"]["batch_size"] == 12  # 15 fits; 12 is its step's


@pytest.mark.parametrize("low, high, expected", [(8, 16, list(range(9, 16))), (64, 64, []), (1, 3, [2])])
def test_the_integers_between_two_batches_are_those_of_the_searched_span(
        tmp_path: Path, low: int, high: int, expected: list[int]) -> None:
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32, 64]\n")
    assert spec.search is not None
    assert integers_between(spec.search, low, high) == expected


@pytest.mark.slow
def test_under_a_real_memory_cap_the_search_lands_within_one_of_a_brute_force_scan(tmp_path: Path) -> None:
    """Real probes of a factory model under a real CPU cap (RLIMIT): a grid over every batch from
    6 to 13 is the brute-force scan of the boundary; ``auto`` over powers of two must land within
    1 of its largest fitting batch. The model holds ~30 MB a sample over ~0.35 GiB, and sleeps
    0.5 s a step (as a GPU step's fixed costs), so a larger batch is faster and the climb goes on
    to the memory limit."""
    factory = f"{Path(__file__).parent / 'factories.py'}:learnable"

    def spec(search: str, strategy: str) -> Spec:
        path = make_spec_file(tmp_path / strategy, model={"factory": factory},
                              params={"max_length": 1024, "width_mul": 160, "sleep_s": 0.5},
                              budget={"memory_gb": 0.75, "headroom_gb": 0.1}, probe={"max_seconds": 1})
        path.write_text(path.read_text() + f"search:\n{search}tune:\n  strategy: {strategy}\n")
        return load_spec(path)

    scan = tune(spec(f"  batch_size: {list(range(6, 14))}\n", "grid"), TuneOptions(output=tmp_path / "grid" / "out"))
    fitting = [t.values["batch_size"] for t in scan.trials if t.feasible]
    assert fitting and 6 <= max(fitting) < 13, "the cap must stop the scan inside it"
    auto = tune(spec("  batch_size: [1, 2, 4, 8, 16, 32]\n", "auto"), TuneOptions(output=tmp_path / "auto" / "out"))
    picked = max(t.values["batch_size"] for t in auto.trials if t.feasible)
    assert abs(picked - max(fitting)) <= 1, [(t.values["batch_size"], t.measurement.status) for t in auto.trials]


def opened_study(spec: Spec, journal: Path) -> Any:
    """The study of a tune's output folder, loaded from its journal as another process loads it."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from trainfit.search.storage import study_name

    return optuna.load_study(study_name=study_name(spec), storage=JournalStorage(JournalFileBackend(str(journal))))


def assert_stand_ins(study: Any, names: list[str]) -> list[int]:
    """Every measured trial of ``study`` holds a param of the grid's batch_size distribution (the
    intersection search space keeps it): its real value on the grid, else a stand-in on the side of
    the grid its outcome holds for. The real batch stays in the trial's values; the off-grid ones."""
    import optuna

    from trainfit.search.trial_records import trial_values

    grid = optuna.distributions.CategoricalDistribution([1, 2, 4, 8, 16, 32, 64])
    assert optuna.search_space.IntersectionSearchSpace().calculate(study).get("batch_size") == grid
    off_grid = []
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        real = trial_values(t, names)
        assert real is not None
        if real["batch_size"] in grid.choices:
            assert t.params == real  # a grid trial is as it was
            continue
        off_grid.append(real["batch_size"])
        below = max(c for c in grid.choices if c < real["batch_size"])
        above = min(c for c in grid.choices if c > real["batch_size"])
        assert t.params == {**real, "batch_size": below if t.constraints["memory"] <= 0 else above}
    return off_grid


def test_a_bayes_resume_of_an_auto_study_models_the_batch_size_of_its_off_grid_trials(tmp_path: Path) -> None:
    """Off-grid batches (15 between the grid's 8 and 16) are no choice of the grid's categorical
    distribution. Stored without a batch_size param, they dropped batch_size from Optuna's
    intersection search space for every trial: GPSampler then drew it at random. Each is told with a
    stand-in grid choice (the largest below for a config that fits, the smallest above for one that
    does not) and keeps its real batch in its values, which trainfit's records read."""
    import optuna

    surface = Surface()
    spec = spec_searching(tmp_path, "  batch_size: [1, 2, 4, 8, 16, 32, 64]\n"
                                    "  gradient_checkpointing: [false, true]\n")
    out = tmp_path / "out"
    first = tune(spec, TuneOptions(output=out, probe_fn=surface))
    off_grid = sorted({b for b in probed(surface) if b not in (1, 2, 4, 8, 16, 32, 64)})
    assert off_grid and 15 in off_grid  # the climb without checkpointing ends at 15, between 8 and 16
    study = opened_study(spec, out / "study.journal")
    assert_stand_ins(study, ["batch_size", "gradient_checkpointing"])
    assert "batch_size" in optuna.samplers.GPSampler().infer_relative_search_space(study, study.trials[0])
    # trainfit's own records keep the real batch: the history, trials.csv and the summary
    assert sorted({t.values["batch_size"] for t in first.trials}) == sorted(set(probed(surface)))
    with (out / "trials.csv").open() as f:
        assert sorted({int(r["batch_size"]) for r in csv.DictReader(f)}) == sorted(set(probed(surface)))
    assert first.summary.to_json()["best_config"]["config"]["batch_size"] == 15

    # The resume with bayes: the GP models batch_size (its relative params hold it), and asks work.
    measured = len(first.trials)
    again = tune(with_tune(spec, strategy="bayes", max_trials=measured + 2), TuneOptions(output=out, probe_fn=surface,
                                                                                         resume=True))
    assert len(again.trials) > measured
    study = opened_study(spec, out / "study.journal")
    asked = [t for t in study.trials if t.number >= len(first.trials) and "gp:relative_params:0" in t.system_attrs]
    assert asked and all("batch_size" in json.loads(t.system_attrs["gp:relative_params:0"]) for t in asked)
    # and a resume with auto still re-uses every off-grid trial: nothing is probed again
    calls = len(surface.calls)
    assert tune(with_tune(spec, max_trials=len(again.trials)), TuneOptions(output=out, probe_fn=surface,
                                                                           resume=True)).new_trials == 0
    assert len(surface.calls) == calls


def test_an_off_grid_value_stands_in_as_the_grid_choice_on_the_side_its_outcome_holds_for() -> None:
    """A fit stands in as the largest choice below (memory grows with the batch: it fits there too),
    a failure as the smallest above; the nearest on the other side where that side has none, and
    nothing where no choice is a number or the distribution is no categorical one."""
    import optuna

    from trainfit.search.trial_records import stand_in

    grid = optuna.distributions.CategoricalDistribution([1, 2, 4, 8, 16, 32, 64])
    assert stand_in(grid, 15, fits=True) == 8
    assert stand_in(grid, 15, fits=False) == 16
    assert stand_in(grid, 23, fits=False) == 32
    assert stand_in(grid, 100, fits=False) == 64 and stand_in(grid, 0, fits=True) == 1
    assert stand_in(optuna.distributions.CategoricalDistribution(["a", "b"]), 3, fits=True) is None
    assert stand_in(grid, "15", fits=True) is None
    assert stand_in(optuna.distributions.IntDistribution(1, 64), 15, fits=True) is None  # it holds 15 itself


def test_the_effective_batch_counts_every_process(tmp_path: Path) -> None:
    """Two DDP processes each take a micro-batch: the target effective batch is the optimizer step's
    samples over both (Hugging Face's total train batch), so the accumulation halves, the batches past
    the grid keep it exactly, and the default search stops at the target's share of a process."""
    from trainfit.space import default_space
    from trainfit.trainer.command import trl_args

    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          params={"max_length": 64, "nproc_per_node": 2, "parallel": "ddp"})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4, 8, 16]\ntune:\n  target_effective_batch: 32\n")
    spec = load_spec(path)
    assert spec.search is not None
    params = spec.search.params({"batch_size": 2})
    assert (params.gradient_accumulation_steps, params.effective_batch_size) == (8, 32)  # 2 x 8 x 2 processes
    words = trl_args(params)
    assert words[words.index("--gradient_accumulation_steps") + 1] == "8"
    assert integers_between(spec.search, 2, 16, processes=2) == [4, 8]  # 2 x 4 x 4 and 2 x 8 x 2 make 32
    space, problems = default_space(Params(nproc_per_node=2, parallel="ddp", batch_size=4,
                                           gradient_accumulation_steps=2))
    assert not problems and space.target_effective_batch == 16
    assert list(space.dim("batch_size").grid_values()) == [1, 2, 4, 8]  # 8 a process is the 16 of two


def test_the_default_search_keeps_an_effective_batch_that_is_no_power_of_two_exactly() -> None:
    """Batch 8 x 3 accumulated: 24. A batch of 16 would accumulate 2 (32, not 24: another run); the
    default grid holds, for each power of two, the largest divisor of 24 at or below it, and every
    config trains 24. Over 2 processes: 12 each. A target no batch over the processes divides keeps
    the powers of two; a share past 128 reaches near 128 still."""
    from trainfit.space import default_batch_sizes, default_space

    space, problems = default_space(Params(batch_size=8, gradient_accumulation_steps=3))
    assert not problems and space.target_effective_batch == 24
    batches = list(space.dim("batch_size").grid_values())
    assert batches == [1, 2, 4, 8, 12, 24]
    assert {space.params({"batch_size": b}).effective_batch_size for b in batches} == {24}
    assert default_batch_sizes(32) == [1, 2, 4, 8, 16, 32] and default_batch_sizes(24, processes=2) == [1, 2, 4, 6, 12]
    assert default_batch_sizes(10, processes=4) == [1, 2] and default_batch_sizes(512) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert default_batch_sizes(200) == [1, 2, 4, 8, 10, 25, 50, 100] and default_batch_sizes(130)[-1] == 65


def test_configs_that_differ_in_effective_batch_by_their_processes_are_ranked_per_effective_batch() -> None:
    """The processes make the effective batch too: searched without a target, or with one that some
    batch sizes over their processes cannot keep, the summary ranks per effective batch."""
    from trainfit.space import parse_space
    from trainfit.space import EFFECTIVE_BATCH, learning_knobs

    base = Params(parallel="ddp")
    for search, target, differs in (({"nproc_per_node": [1, 2]}, None, True),
                                    ({"nproc_per_node": [1, 2], "batch_size": [8, 16, 32]}, 32, True),  # 2 x 32
                                    ({"nproc_per_node": [1, 2], "batch_size": [1, 2, 4]}, 32, False)):
        space, problems = parse_space(search, base, allow_custom=False, target_effective_batch=target)
        assert not problems
        assert (EFFECTIVE_BATCH in learning_knobs(space)) == differs, (search, target)


def open_batch_spec(tmp_path: Path, params: dict[str, Any] | None = None, overrides: tuple[str, ...] = ()) -> Spec:
    """A spec with no search: section, its params without batch settings unless ``params`` gives them."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, **(params or {})},
                          budget={"memory_gb": BUDGET, "headroom_gb": HEADROOM})
    return load_spec(path, list(overrides))


def test_a_spec_that_states_no_batch_is_searched_to_the_memory_limit(tmp_path: Path, capsys: Any) -> None:
    """No batch_size, gradient_accumulation_steps or tune.target_effective_batch: the default search
    climbs the batch to the largest that fits (it searched batch 1 alone: the slowest config there
    is), at the spec's accumulation, and ranks per effective batch, which it flags as changing what
    is learned."""
    from trainfit.space import OPEN_BATCH_SIZES
    from trainfit.tune import with_default_search
    from trainfit.space import EFFECTIVE_BATCH

    spec = open_batch_spec(tmp_path)
    assert spec.batch_open
    searched = with_default_search(spec)
    assert searched.search.target_effective_batch is None and searched.tune.target_effective_batch is None
    assert list(searched.search.dim("batch_size").grid_values()) == list(OPEN_BATCH_SIZES)
    surface = Surface()
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    best = result.summary.best_config
    assert best is not None and best.searched["batch_size"] == largest_fitting(surface) == 15
    assert best.effective_batch_size == 15  # accumulation 1: the effective batch is the batch
    assert EFFECTIVE_BATCH in result.summary.fastest_per_value
    assert max(probed(surface, gradient_checkpointing=False)) <= 16  # the memory line: nothing probed far past the limit
    assert max(probed(surface, gradient_checkpointing=True)) <= largest_fitting(surface, gradient_checkpointing=True) + 1
    # what `trainfit tune` says before the search and at its end: the open batch, the pick's, the fix
    import argparse

    from trainfit.cli.tune import print_plan
    from trainfit.cli.tune_render import print_result
    from trainfit.tune import resolve

    capsys.readouterr()
    print_plan(argparse.Namespace(spec=spec.source, budgets=None, calibrate=None),
               resolve(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface)))
    print_result(result, searched)
    said = " ".join(capsys.readouterr().out.split())
    assert "with the batch left open, up to what fits" in said and "set tune.target_effective_batch to keep one" in said
    assert "effective batch 15 (it differs between configs and changes what is learned" in said
    assert "fastest per effective_batch_size" in said


@pytest.mark.parametrize("stated", [{"batch_size": 4}, {"gradient_accumulation_steps": 8}])
def test_a_stated_batch_keeps_its_effective_batch(tmp_path: Path, stated: dict[str, int]) -> None:
    """A batch_size or an accumulation the spec states (or a --set gives) fixes the effective batch,
    as before: every config of the default search trains it."""
    from trainfit.tune import with_default_search

    for spec in (open_batch_spec(tmp_path / "file", stated),
                 open_batch_spec(tmp_path / "flag", overrides=tuple(f"{k}={v}" for k, v in stated.items()))):
        assert not spec.batch_open
        searched = with_default_search(spec)
        target = stated.get("batch_size", 1) * stated.get("gradient_accumulation_steps", 1)
        assert searched.search.target_effective_batch == target
    target_only = open_batch_spec(tmp_path / "target")
    target_only = load_spec(target_only.source, ["tune.target_effective_batch=16"])
    assert not target_only.batch_open and with_default_search(target_only).search.target_effective_batch == 16
