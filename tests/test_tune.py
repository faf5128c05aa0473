"""The search logic of ``tune``: every strategy (grid, random, bayes, auto), refine, and the
advice when nothing fits, against the deterministic synthetic Surface of tune_helpers (a fake
probe used only to test search logic; real probes are in test_tune_end_to_end.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, TINY_LLAMA, make_spec_file
from tune_helpers import BUDGET, GRID, HEADROOM, GiB, Surface, fixed_speed, synthetic_spec

from trainfit.errors import SpecError
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.tune.options import TuneOptions
from trainfit.space import parse_space
from trainfit.spec import load_spec, with_tune
from trainfit.tune import tune


@pytest.mark.parametrize("strategy", ["grid", "random", "bayes", "auto"])
def test_every_strategy_recommends_only_measured_configs_within_budget(tmp_path: Path, strategy: str) -> None:
    surface = Surface()
    spec = synthetic_spec(tmp_path, strategy, max_trials=12 if strategy != "grid" else 64)
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    best = result.summary.to_json()["best_config"]
    assert best is not None
    assert best["memory_peak_gb"] + HEADROOM <= BUDGET
    assert best["config"] in surface.calls  # recommended == measured
    assert best["effective_batch_size"] == pytest.approx(32, rel=0.5)
    assert result.summary.to_json()["total_tested"] == len(surface.calls) == len(result.trials)
    assert result.summary.to_json()["failed_oom"] == sum(1 for c in surface.calls if surface.memory_gb(Params(**c)) > BUDGET)
    assert set(result.summary.to_json()["fastest_per_value"]["lora_r"]) == {"8", "16"} or strategy != "grid"
    assert (tmp_path / "out" / "trials.csv").read_text().count("\n") == len(surface.calls) + 1


def test_grid_finds_the_true_optimum_and_auto_gets_there_cheaper(tmp_path: Path) -> None:
    grid_surface, auto_surface = Surface(), Surface()
    grid = tune(synthetic_spec(tmp_path / "g", "grid"), TuneOptions(output=tmp_path / "g" / "out",
                                                                    probe_fn=grid_surface))
    auto = tune(synthetic_spec(tmp_path / "a", "auto"), TuneOptions(output=tmp_path / "a" / "out",
                                                                    probe_fn=auto_surface))
    truth = grid_surface.best_feasible(GRID)
    assert grid.summary.to_json()["best_config"]["samples_per_second"] == pytest.approx(truth)
    assert auto.summary.to_json()["best_config"]["samples_per_second"] >= 0.97 * truth
    assert len(auto_surface.calls) <= len(GRID) / 2
    # Memory is extrapolated from fitting probes: auto spends at most one probe per family on an OOM.
    assert auto.summary.to_json()["failed_oom"] <= 4
    # The fastest config per LoRA rank is reported (rank changes what is learned).
    per_rank = auto.summary.to_json()["fastest_per_value"]["lora_r"]
    assert set(per_rank) == {"8", "16"}


def test_without_a_target_effective_batch_the_summary_gives_the_fastest_per_effective_batch(tmp_path: Path) -> None:
    """A larger effective batch trains differently (fewer optimizer steps, another learning-rate
    trade-off) and measures faster, so it must not win silently over the spec's own."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": BUDGET, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4]\n  gradient_accumulation_steps: [1, 2]\n"
                    "tune:\n  strategy: grid\n")
    result = tune(load_spec(path), TuneOptions(output=tmp_path / "out", probe_fn=Surface()))
    per_batch = result.summary.to_json()["fastest_per_value"]["effective_batch_size"]
    assert set(per_batch) == {"1", "2", "4", "8"}
    assert all(e["effective_batch_size"] == int(k) for k, e in per_batch.items())
    assert per_batch["2"]["searched"] == {"batch_size": 2, "gradient_accumulation_steps": 1}  # faster than 1 x 2
    # With a target, every config trains at one effective batch: nothing to choose between.
    fixed = tune(synthetic_spec(tmp_path / "t", "grid", max_trials=4), TuneOptions(output=tmp_path / "t" / "out",
                                                                                   probe_fn=Surface()))
    assert "effective_batch_size" not in fixed.summary.to_json()["fastest_per_value"]


def test_without_a_spec_budget_auto_predicts_against_the_devices_memory(tmp_path: Path) -> None:
    """No budget.memory_gb: the probes record the device's memory as their budget, and auto
    predicts OOMs against it exactly as against a budget the spec gives (same probes)."""
    calls = {}
    budgets = {"spec": {"memory_gb": BUDGET, "headroom_gb": HEADROOM}, "device": {"headroom_gb": HEADROOM}}
    for name, budget in budgets.items():
        path = make_spec_file(tmp_path / name, model={"config": TINY_LLAMA}, params={"max_length": 64}, budget=budget)
        path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4, 8, 12, 16, 24, 32]\n"
                        "  gradient_checkpointing: [false, true]\n  lora_r: [8, 16]\n"
                        "tune:\n  strategy: auto\n  target_effective_batch: 32\n")
        surface = Surface()  # its measurements carry budget_memory_gb=40, as the worker records the device's
        result = tune(load_spec(path), TuneOptions(output=tmp_path / name / "out", probe_fn=surface))
        calls[name] = surface.calls
        assert result.summary.to_json()["budget"]["memory_gb"] == BUDGET
    assert calls["device"] == calls["spec"]


def test_grid_probes_each_model_family_in_a_row_smaller_batches_first() -> None:
    from trainfit.params import Params
    from trainfit.search.strategies import GridStrategy
    from trainfit.search.trials import model_family

    space, problems = parse_space({"batch_size": [8, 2, 4], "lora_r": [None, 8], "padding": ["longest", "max_length"]},
                                  Params(), allow_custom=False)
    assert not problems
    points = GridStrategy(space).points
    families = [model_family(p) for p in points]
    assert len(points) == 12 and len(set(families)) == 2
    assert families == sorted(families, key=families.index)  # one run per family
    first = [p for p in points if model_family(p) == families[0]]
    assert [p["batch_size"] for p in first] == [2, 2, 4, 4, 8, 8]


def auto_trial(number: int, values: dict[str, Any], sps: float | None, ci: float = 0.001,
               memory_gb: float | None = None) -> Any:
    """A trial as ``auto`` reads it: a probe at ``sps`` samples/s (None: out of memory)."""
    from trainfit.search.trials import Trial

    peak = int((memory_gb if memory_gb is not None else 1 + values["batch_size"]) * GiB)
    if sps is None:
        m = Measurement(status="oom", config=values, peak_memory_bytes=peak)
    else:
        m = Measurement(status="ok", config=values, samples_per_second=sps, step_time_ci95_rel=ci,
                        peak_memory_bytes=peak)
    return Trial(number=number, values=values, measurement=m, objective=sps)


def test_auto_climbs_on_when_a_small_gain_or_a_fall_is_within_measurement_noise() -> None:
    from trainfit.search.auto import AutoStrategy

    space, problems = parse_space({"batch_size": [1, 2, 4, 8]}, Params(), allow_custom=False)
    assert not problems

    def trial(n: int, b: int, sps: float, ci: float) -> Any:
        return auto_trial(n, {"batch_size": b}, sps, ci)

    auto = AutoStrategy(space, budget_gb=None, headroom_gb=0.0, device_type="cpu")
    # +1.5% from batch 1 to 2: saturated when the probes were precise ...
    assert auto.propose([trial(0, 1, 100.0, 0.001), trial(1, 2, 101.5, 0.001)]) is None
    # ... but one more step when each probe's CI is 5%: the true gain may well be larger.
    assert auto.propose([trial(0, 1, 100.0, 0.05), trial(1, 2, 101.5, 0.05)]) == {"batch_size": 4}
    # A larger batch measured slower ends the climb only past the two probes' CIs: a 5% fall is the
    # end where each probe is precise, and noise where each is +-5%.
    assert auto.propose([trial(0, 1, 100.0, 0.001), trial(1, 2, 95.0, 0.001)]) is None
    assert auto.propose([trial(0, 1, 100.0, 0.05), trial(1, 2, 95.0, 0.05)]) == {"batch_size": 4}


def test_auto_judges_a_small_step_past_the_grid_by_its_size() -> None:
    """16 to 17 gains 1.5%: a doubling's worth of 18%, far from saturated (the threshold is 2% a
    doubling), so the climb goes on."""
    from trainfit.search.auto import AutoStrategy

    space, problems = parse_space({"batch_size": [1, 2, 4, 8, 16, 32]}, Params(), allow_custom=False)
    assert not problems
    auto = AutoStrategy(space, budget_gb=None, headroom_gb=0.0, device_type="cpu")
    assert auto.propose([auto_trial(0, {"batch_size": 16}, 100.0), auto_trial(1, {"batch_size": 17}, 101.5)]) == {
        "batch_size": 32}
    assert auto.propose([auto_trial(0, {"batch_size": 16}, 100.0), auto_trial(1, {"batch_size": 32}, 101.5)]) is None


def test_auto_drops_a_family_after_one_probe_only_beyond_the_probes_noise() -> None:
    """Family B (num_workers 1) slower than A by 3% at batch 1 where each probe is +-2%: noise, it
    climbs on; where each is precise: dropped. With two probes, slower at batch 1 but faster at 2,
    its own line decides (it can win): it climbs on. (A is in another run's hands, so B's turn comes.)"""
    from trainfit.search.auto import AutoStrategy
    from trainfit.search.trials import config_key

    space, problems = parse_space({"batch_size": [1, 2, 4, 8], "num_workers": [0, 1]}, Params(), allow_custom=False)
    assert not problems
    auto = AutoStrategy(space, budget_gb=None, headroom_gb=0.0, device_type="cpu")
    busy = [config_key({"batch_size": 4, "num_workers": 0})]

    def a_and_b(b_speeds: dict[int, float], ci: float = 0.001) -> list[Any]:
        a = [auto_trial(n, {"batch_size": b, "num_workers": 0}, 100.0 * b / (1 + 0.1 * b)) for n, b in enumerate((1, 2))]
        return a + [auto_trial(10 + n, {"batch_size": b, "num_workers": 1}, s, ci) for n, (b, s) in
                    enumerate(b_speeds.items())]

    a1, a2 = 100 / 1.1, 200 / 1.2
    assert auto.propose(a_and_b({1: 0.95 * a1, 2: 1.05 * a2}), busy) == {"batch_size": 4, "num_workers": 1}
    assert auto.propose(a_and_b({1: 0.97 * a1}, ci=0.02), busy) == {"batch_size": 2, "num_workers": 1}
    assert auto.propose(a_and_b({1: 0.97 * a1}), busy) is None
    # Two noisy probes, the second no faster: its best, noise and all, is what it reaches; far below A's best, done.
    assert auto.propose(a_and_b({1: 0.7 * a1, 2: 0.7 * a1}, ci=0.25), busy) is None


def test_auto_climbs_a_family_whose_reach_comes_within_two_percent_of_its_rival() -> None:
    """A (num_workers 0) ran out of memory at 16, best at 15; B, leaner, predicts 1% below A's best
    at 64 from its two probes: within 2%, the benefit of the doubt is B's, so it climbs on; 5%
    below, it stops."""
    from trainfit.search.auto import AutoStrategy

    space, problems = parse_space({"batch_size": [1, 2, 4, 8, 16, 32, 64], "num_workers": [0, 1]}, Params(),
                                  allow_custom=False)
    assert not problems
    auto = AutoStrategy(space, budget_gb=40.0, headroom_gb=0.0, device_type="cpu")

    def speed_a(b: int) -> float:
        return b / (0.5 + 0.1 * b)

    def history(reach: float) -> list[Any]:
        c = (64 / (reach * speed_a(15)) - 0.6) / 64  # B at 64: reach x A's best

        def speed_b(b: int) -> float:
            return b / (0.6 + c * b)

        a = [auto_trial(n, {"batch_size": b, "num_workers": 0}, speed_a(b), memory_gb=1 + b)
             for n, b in enumerate((1, 2, 4, 8, 15))]
        a.append(auto_trial(5, {"batch_size": 16, "num_workers": 0}, None, memory_gb=40))
        assert speed_b(2) < speed_a(2)
        return a + [auto_trial(6 + n, {"batch_size": b, "num_workers": 1}, speed_b(b), memory_gb=1 + b / 2)
                    for n, b in enumerate((1, 2))]

    assert auto.propose(history(0.99)) == {"batch_size": 4, "num_workers": 1}
    assert auto.propose(history(0.95)) is None


def test_ranges_constraints_refine_and_module_lists(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "lora_r": 8},
                          budget={"memory_gb": BUDGET, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + (
        "search:\n  batch_size: {low: 1, high: 32, log: true}\n  lora_r: [4, 8, 16]\n"
        "  lora_target_modules: [[q_proj, v_proj], all-linear]\n"
        "tune:\n  constraints: ['lora_r >= 8']\n  objective: tokens_per_second\n"))
    spec = load_spec(path)
    assert spec.search.dim("batch_size").grid_values() == (1, 2, 4, 8, 16, 32)
    surface = Surface()
    result = tune(with_tune(spec, strategy="bayes", max_trials=8), TuneOptions(output=tmp_path / "out",
                                                                               probe_fn=surface, refine=True))
    assert all(c["lora_r"] >= 8 for c in surface.calls)  # the constraint holds for every probe
    assert {tuple(c["lora_target_modules"]) if isinstance(c["lora_target_modules"], list)
            else c["lora_target_modules"] for c in surface.calls} <= {("q_proj", "v_proj"), "all-linear"}
    best = result.summary.to_json()["best_config"]
    assert result.summary.to_json()["objective"] == "tokens_per_second"
    assert best["tokens_per_second"] == max(t.objective for t in result.trials if t.feasible)
    # bayes may propose a range value off the grid (e.g. batch 11): it is probed like any other
    assert all(1 <= c["batch_size"] <= 32 for c in surface.calls)


def test_refine_probes_the_neighbours_of_the_best(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "auto")
    first = Surface()
    plain = tune(spec, TuneOptions(output=tmp_path / "a", probe_fn=first))
    refined = Surface()
    tune(spec, TuneOptions(output=tmp_path / "b", probe_fn=refined, refine=True))
    assert refined.calls[:len(first.calls)] == first.calls  # same auto phase (deterministic)
    extra = refined.calls[len(first.calls):]
    assert extra, "refine probed nothing"
    from trainfit.search.confirm import neighbours
    from trainfit.search.trials import config_key

    auto_best = plain.trials[[t.number for t in plain.trials].index(plain.summary.to_json()["best_config"]["trial"])].values
    measured = {config_key({k: c[k] for k in spec.search.names}) for c in first.calls}
    wanted = {config_key(v) for v in neighbours(spec.search, auto_best)} - measured
    assert wanted and wanted <= {config_key({k: c[k] for k in spec.search.names}) for c in extra}


def test_quick_refine_searches_locally_beyond_the_quick_budget(tmp_path: Path) -> None:
    """The seeds' `--quick --refine`: 6 configs, then improvements around the best."""
    spec = synthetic_spec(tmp_path, "random")
    quick = tune(spec, TuneOptions(output=tmp_path / "a", probe_fn=Surface(), quick=True))
    surface = Surface()
    result = tune(spec, TuneOptions(output=tmp_path / "b", probe_fn=surface, quick=True, refine=True))
    assert quick.summary.to_json()["total_tested"] == 6 and len(surface.calls) > 6
    assert "then refined" in result.stop_reason
    assert result.best.objective >= quick.best.objective
    from trainfit.search.confirm import neighbours
    from trainfit.search.trials import config_key

    # a local search: it ends where no neighbour of the best is left unmeasured
    measured = {config_key(t.values) for t in result.trials}
    assert all(config_key(v) in measured for v in neighbours(spec.search, result.best.values))


def test_bayes_stops_when_its_sampler_only_proposes_measured_configs(tmp_path: Path) -> None:
    """A small space is soon fully measured; the GP then proposes measured configs only. Each is
    answered from the study without a probe, and `patience` of them in a row end the search
    (before, the loop asked up to 3 x max_trials times, each a GP fit)."""
    import optuna

    spec = load_spec(synthetic_spec(tmp_path, "bayes").source,
                     ["search.batch_size=[1, 2]", "tune.patience=5", "tune.max_trials=64"])
    surface = Surface()
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    assert len(surface.calls) == len({json.dumps(c, sort_keys=True) for c in surface.calls}) <= 8  # each probed once
    study = optuna.load_study(study_name=None, storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "out" / "study.journal"))))
    runs, run = [], 0
    for t in sorted(study.trials, key=lambda t: t.number):
        run = run + 1 if t.user_attrs.get("reused") else 0
        runs.append(run)
    assert max(runs) <= 5 and len(study.trials) < 30
    assert "in a row" in result.stop_reason or "no better config" in result.stop_reason


class NoBf16(Surface):
    """A machine without bf16: such probes fail as unsupported, as the worker reports them."""

    def __call__(self, p: Params, number: int) -> Measurement:
        if p.precision == "bf16":
            self.calls.append(p.to_dict())
            return Measurement(status="error", config=p.to_dict(), unsupported={"precision": "bf16"},
                               message="precision=bf16 but this GPU has no bf16 support")
        return super().__call__(p, number)


@pytest.mark.parametrize("strategy", ["grid", "auto", "bayes"])
def test_a_knob_value_the_machine_cannot_run_costs_one_probe(tmp_path: Path, strategy: str) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": BUDGET, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4, 8]\n  precision: [bf16, fp32]\n"
                    f"  gradient_checkpointing: [false, true]\ntune:\n  strategy: {strategy}\n  max_trials: 16\n")
    surface = NoBf16()
    summary = tune(load_spec(path), TuneOptions(output=tmp_path / "out", probe_fn=surface)).summary.to_json()
    assert sum(c["precision"] == "bf16" for c in surface.calls) == 1  # not once per family or batch size
    assert [(u["knob"], u["value"]) for u in summary["unsupported"]] == [("precision", "bf16")]
    assert summary["best_config"]["searched"]["precision"] == "fp32"


def test_when_everything_ooms_the_summary_says_what_to_change(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2, 4]\n")
    result = tune(load_spec(path), TuneOptions(output=tmp_path / "out", probe_fn=Surface(budget_gb=5.0)))
    failed = result.summary.to_json()["all_failed"]
    assert result.summary.to_json()["best_config"] is None
    assert len(failed["measured_peaks_gb"]) == 1  # auto stops the family after the smallest batch OOMs
    assert any(a.startswith("gradient_checkpointing: true") for a in failed["advice"])
    assert any(a.startswith("lora_r") for a in failed["advice"])
    assert any(a.startswith("batch_size: 1") for a in failed["advice"])


def test_an_oom_that_said_what_it_asked_for_needs_at_least_that(tmp_path: Path) -> None:
    """The budget an OOM needs is at least what was allocated at the failure plus what the failed
    allocation asked for, which can be far above the peak it reached before failing."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2, 4]\n")

    def oom(p: Params, number: int) -> Measurement:
        return Measurement(status="oom", message="out of memory", config=p.to_dict(),
                           peak_memory_bytes=int(3 * GiB), oom_needed_bytes=int(p.batch_size * 3 * GiB),
                           budget_memory_gb=5.0, budget_headroom_gb=HEADROOM)

    smallest = tune(load_spec(path), TuneOptions(output=tmp_path / "out",
                                                 probe_fn=oom)).summary.to_json()["all_failed"]["smallest_peak"]
    assert smallest["searched"] == {"batch_size": 2} and smallest["at_least"]
    assert smallest["needs_memory_gb"] == pytest.approx(6.0 + HEADROOM)
    rows = list(csv.DictReader((tmp_path / "out" / "trials.csv").open()))
    assert [float(r["oom_needs_more_than_gb"]) for r in rows] == [6.0]  # auto stops the family at its first OOM


@pytest.mark.parametrize("parts, first", [
    ({"model": 2.0, "optimizer": 6.0, "runtime": 0.5, "step": 1.0}, "lora_r"),
    ({"model": 2.0, "optimizer": 1.0, "runtime": 0.5, "step": 6.0}, "gradient_checkpointing"),
])
def test_when_nothing_fits_the_advice_starts_with_the_largest_measured_part(
        tmp_path: Path, parts: dict[str, float], first: str) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2, 4]\ntune:\n  strategy: grid\n")

    def over_budget(p: Params, number: int) -> Measurement:
        scaled = {k: int(v * GiB * (p.batch_size / 2 if k == "step" else 1)) for k, v in parts.items()}
        return Measurement(status="ok", config=p.to_dict(), samples_per_second=10.0, tokens_per_second=1e3,
                           peak_memory_bytes=sum(scaled.values()), memory_parts_bytes=scaled,
                           budget_memory_gb=5.0, budget_headroom_gb=HEADROOM, steps_measured=5)

    failed = tune(load_spec(path), TuneOptions(output=tmp_path / "out",
                                               probe_fn=over_budget)).summary.to_json()["all_failed"]
    assert failed["advice"][0].startswith(first)
    smallest = failed["smallest_peak"]
    assert smallest["searched"] == {"batch_size": 2}
    assert smallest["parts_gb"] == pytest.approx(parts)
    assert smallest["needs_memory_gb"] == pytest.approx(sum(parts.values()) + HEADROOM)


def test_when_the_full_logits_weigh_the_advice_starts_with_a_loss_without_them(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2]\n")

    def logits_heavy(p: Params, number: int, logits_gb: float = 2.0) -> Measurement:
        parts = {"model": 1 * GiB, "optimizer": 1 * GiB, "runtime": GiB // 2, "step": 5 * GiB}
        return Measurement(status="ok", config=p.to_dict(), samples_per_second=10.0, tokens_per_second=1e3,
                           peak_memory_bytes=sum(parts.values()), memory_parts_bytes=parts,
                           full_logits_bytes=int(logits_gb * GiB) or None,
                           budget_memory_gb=5.0, budget_headroom_gb=HEADROOM, steps_measured=5)

    failed = tune(load_spec(path), TuneOptions(output=tmp_path / "out",
                                               probe_fn=logits_heavy)).summary.to_json()["all_failed"]
    assert failed["smallest_peak"]["full_logits_gb"] == pytest.approx(2.0)
    assert failed["advice"][0].startswith("a loss without the full logits") and "2.00 GiB" in failed["advice"][0]
    assert failed["advice"][1].startswith("gradient_checkpointing")
    # a loss that builds no full logits (TRL's fused head) gets no such advice
    failed = tune(load_spec(path), TuneOptions(output=tmp_path / "out2", probe_fn=lambda p,
                                               n: logits_heavy(p, n, 0.0))).summary.to_json()["all_failed"]
    assert not any("full logits" in a for a in failed["advice"])


def test_search_section_is_validated(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    path.write_text(path.read_text() + "search:\n  batch_size: {low: 8, high: 2}\n  precision: [bf16, fp8]\n"
                    "  gradient_accumulation_steps: [1, 2]\ntune:\n  target_effective_batch: 16\n"
                    "  constraints: ['lora_rank >= 4']\n  strategy: genetic\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    keys = sorted(p.key for p in info.value.problems)
    assert keys == ["search.batch_size", "search.gradient_accumulation_steps", "search.precision",
                    "tune.constraints", "tune.strategy"]


def test_the_library_searches_the_default_space_as_the_cli_does(tmp_path: Path) -> None:
    """``trainfit.tune`` on a spec without ``search:`` searches batch sizes and checkpointing at the
    spec's effective batch, as ``trainfit tune`` does (it probed the spec's one config before)."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          params={"max_length": 64, "gradient_accumulation_steps": 4})
    surface = Surface()
    result = tune(load_spec(path), TuneOptions(output=tmp_path / "out", probe_fn=surface))
    assert {(c["batch_size"], c["gradient_checkpointing"]) for c in surface.calls} <= {
        (b, g) for b in (1, 2, 4) for g in (False, True)} and len(surface.calls) >= 3
    assert {c["batch_size"] * c["gradient_accumulation_steps"] for c in surface.calls} == {4}
    assert result.summary.to_json()["best_config"]["effective_batch_size"] == 4


def test_the_stop_rules_are_functions_of_the_limits_and_the_history() -> None:
    """The loop's stop rules read no clock and no store: the trial budget counts the trials other
    runs probe, patience counts the trials since the best (all of them while none fits), the time
    budget and a sampler that keeps proposing known configs end the run."""
    from trainfit.search.stops import Limits, converged_stop, search_stop, time_stop
    from trainfit.search.trials import Trial

    def trial(n: int, sps: float | None) -> Trial:
        m = Measurement(status="ok" if sps else "oom", config={"batch_size": n + 1}, samples_per_second=sps,
                        peak_memory_bytes=GiB)
        return Trial(number=n, values={"batch_size": n + 1}, measurement=m, objective=sps or 0.0)

    limits = Limits(strategy="bayes", max_trials=5, most_trials=5, time_budget_s=60.0, patience=2, refine=False)
    history = [trial(0, 10.0), trial(1, 12.0)]
    assert search_stop(limits, history, busy=set()) is None
    assert search_stop(limits, history, busy={"a", "b", "c"}) == "trial budget reached (5)"
    assert search_stop(limits, [*history, trial(2, 11.0), trial(3, None)], busy=set()) == (
        "no better config in the last 2 trials")
    assert search_stop(limits, [trial(0, None), trial(1, None)], busy=set()) == "no better config in the last 2 trials"
    grid = Limits(strategy="grid", max_trials=5, most_trials=5, time_budget_s=None, patience=2, refine=False)
    assert search_stop(grid, [*history, trial(2, 11.0), trial(3, None)], busy=set()) is None  # grid has no patience
    assert time_stop(limits, 59.9) is None and time_stop(limits, 60.0) == "time budget reached (60 s)"
    assert time_stop(grid, 1e9) is None
    assert converged_stop(limits, 1) is None
    assert converged_stop(limits, 2) == "the sampler proposed 2 measured or excluded configs in a row"


def test_the_default_search_tries_ligers_loss_where_the_trainer_takes_it(tmp_path: Path) -> None:
    """A template passing {use_liger_kernel} (a transformers Trainer script) lets the default search
    try loss: liger; a trainer that cannot take it is not offered it, whatever is installed (the
    space, and so the study, depends on the spec alone)."""
    from trainfit.tune import with_default_search

    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    space = with_default_search(load_spec(path, ["tune.command_template=python train.py --use_liger_kernel "
                                                 "{use_liger_kernel}"])).search
    assert space.dim("loss").grid_values() == ("auto", "liger")
    assert with_default_search(load_spec(path, ["tune.command_template=python train.py --loss {loss}"])
                               ).search.dim("loss") is not None
    for no in (["tune.command_template=python train.py --bs {batch_size}"],  # no way to pass it
               []):  # `trl sft`: its own fused head
        assert "loss" not in with_default_search(load_spec(path, no)).search.names, no
    factory = load_spec(EXAMPLES / "tiny-tts.yaml", [  # its own loss, whatever its template passes
        "search=null", "loss_scale=2", "tune.command_template=python train.py --loss_scale {loss_scale} --loss {loss}"])
    assert "loss" not in with_default_search(factory).search.names


def test_the_default_search_groups_by_length_where_random_batches_are_mostly_padding(tmp_path: Path) -> None:
    """Length grouping joins the default search where the trainer takes it and random batches of the
    data, at the search's largest batch, are more than a quarter padding: decided from the spec and
    its data's lengths, so a resumed study searches the same space."""
    from trainfit.data.analyze import analyze_spec
    from trainfit.tune import with_default_search
    from trainfit.tune.levers import PADDING_SHARE

    def spec_of(name: str, lengths: list[int], params: dict | None = None, sets: tuple[str, ...] = ()):
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps({"n": n}) + "\n" for n in lengths))
        path = make_spec_file(tmp_path / name, model={"config": TINY_LLAMA}, data={"path": str(data), "length_field": "n"},
                              params={"max_length": 2048, **(params or {})})
        return load_spec(path, ["tune.target_effective_batch=32", *sets])

    long_tailed = [2048 if i % 20 == 0 else 16 for i in range(400)]  # 1 in 20 samples long
    spec = spec_of("tailed", long_tailed)
    stats = analyze_spec(spec, progress=False)
    assert stats.padding_share(32, None) > 0.9 > PADDING_SHARE > stats.padding_share(1, None) == 0.0
    space = with_default_search(spec, stats).search
    assert space.dim("group_by_length").grid_values() == (False, True) and space.target_effective_batch == 32
    assert "group_by_length" not in with_default_search(spec).search.names  # no lengths given: not known to pay
    for name, lengths, params, sets in (
            ("even", [100] * 400, {}, ()),  # no padding to remove
            ("cut", long_tailed, {"max_length": 16}, ()),  # every sample cut to 16: none either
            ("fixed", long_tailed, {"padding": "max_length"}, ()),  # padded to one length, grouped or not
            ("packed", long_tailed, {"packing": True}, ()),  # packed rows: no padding to remove
            ("template", long_tailed, {}, ("tune.command_template=python train.py --bs {batch_size}",))):
        other = spec_of(name, lengths, params, sets)
        assert "group_by_length" not in with_default_search(other, analyze_spec(other, progress=False)).search.names
    takes_it = spec_of("takes", long_tailed, {}, ("tune.command_template=python train.py --group {group_by_length}",))
    assert "group_by_length" in with_default_search(takes_it, analyze_spec(takes_it, progress=False)).search.names
    # tune() reads the lengths itself: its search, and so its trials, hold the grouping.
    tune(with_tune(spec, max_trials=1), TuneOptions(output=tmp_path / "run", probe_fn=fixed_speed()))
    with (tmp_path / "run" / "trials.csv").open() as f:
        assert "group_by_length" in next(csv.reader(f))


@pytest.mark.parametrize("state_gb, ddp_probed", [(5.0, False), (3.0, True)])
def test_auto_skips_a_layout_whose_weights_and_optimizer_state_alone_cannot_fit(
        tmp_path: Path, state_gb: float, ddp_probed: bool) -> None:
    """FSDP over 2 processes measured first: its per-process shard of the weights and optimizer state
    (state_gb) doubles in a DDP process, which holds them whole. Past the budget less headroom (8 GiB),
    no DDP batch can fit, and auto says so instead of probing one; below it, DDP is probed."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          params={"max_length": 64, "nproc_per_node": 2, "parallel": "fsdp"},
                          budget={"memory_gb": 10.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  parallel: [fsdp, ddp]\n  batch_size: [1, 2, 4]\n")
    calls: list[tuple[str, int]] = []

    def layouts(p: Params, number: int) -> Measurement:
        calls.append((p.parallel, p.batch_size))
        whole = 2 if p.parallel == "ddp" else 1  # DDP holds what FSDP splits in two
        parts = {"model": int(state_gb / 3 * whole * GiB), "optimizer": int(state_gb * 2 / 3 * whole * GiB),
                 "runtime": GiB // 4, "step": p.batch_size * GiB // 8}
        return Measurement(status="ok", config=p.to_dict(), samples_per_second=10.0 * p.batch_size,
                           tokens_per_second=1e3, peak_memory_bytes=sum(parts.values()), memory_parts_bytes=parts,
                           budget_memory_gb=10.0, budget_headroom_gb=HEADROOM, steps_measured=5, stable=True)

    summary = tune(load_spec(path), TuneOptions(output=tmp_path / "out", probe_fn=layouts)).summary.to_json()
    assert [c for c in calls if c[0] == "fsdp"] == [("fsdp", 1), ("fsdp", 2), ("fsdp", 4)]
    assert any(c[0] == "ddp" for c in calls) == ddp_probed
    pruned = [p for p in summary["pruned"] if p["config"].get("parallel") == "ddp"]
    if ddp_probed:
        assert not pruned
    else:
        assert len(pruned) == 1 and pruned[0]["up_to_batch"] is None
        assert "10 GiB a process" in pruned[0]["reason"] and "parallel: fsdp over 2 processes" in pruned[0]["reason"]


def test_auto_probes_cpu_offload_where_the_same_layout_without_it_cannot_fit() -> None:
    """FSDP over 4 processes measured: over 2 its shard of the weights and optimizer state passes the
    budget, so that layout is not probed; with CPU offload (the shards in host memory) it can fit,
    and its turn comes, not waiting for ever on the family without offload that is never probed."""
    from trainfit.search.auto import AutoStrategy
    from trainfit.search.pruned import pruned

    base = Params(parallel="fsdp", nproc_per_node=4, precision="bf16")
    space, problems = parse_space({"nproc_per_node": [4, 2], "fsdp_cpu_offload": [False, True],
                                   "batch_size": [1, 2]}, base, allow_custom=False)
    assert not problems
    auto = AutoStrategy(space, budget_gb=10.0, headroom_gb=0.0, device_type="cuda")

    def measured(number: int, nproc: int, offload: bool, batch: int) -> Any:
        trial = auto_trial(number, {"nproc_per_node": nproc, "fsdp_cpu_offload": offload, "batch_size": batch},
                           10.0 * batch, memory_gb=7.0 + batch)
        parts = {"model": 2 * GiB, "optimizer": 4 * GiB, "step": batch * GiB}  # 24 GiB of state over 4
        trial.measurement.memory_parts_bytes.update(parts)
        return trial

    history = [measured(0, 4, False, 1), measured(1, 4, False, 2)]
    assert auto.propose(history) == {"nproc_per_node": 2, "fsdp_cpu_offload": True, "batch_size": 1}
    reasons = {json.dumps(p.family, sort_keys=True): p.reason for p in pruned(auto, history)}
    assert "12 GiB a process" in reasons[json.dumps({"fsdp_cpu_offload": False, "nproc_per_node": 2})]
    assert json.dumps({"fsdp_cpu_offload": True, "nproc_per_node": 2}) not in reasons
