"""A probe clearly slower than the best config of its learning values stops timing (issue 47's lever
"cut the wall by design"): the search gives each probe its bar (``search.ranking.bar_for``), the
probe stops once its speed, at the fast end of its 95% interval, is below the bar's slow end
(``probe.phases.clearly_slower``), and says so (``Measurement.slower_than``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY_LLAMA

from trainfit.params import Params
from trainfit.probe import Measurement, run_probe
from trainfit.probe.request import Bar
from trainfit.search.loop import open_search
from trainfit.search.options import SearchOptions
from trainfit.search.ranking import bar_for, noise_warning
from trainfit.search.trials import Trial
from trainfit.spec import build_spec, load_spec


def test_a_bar_beats_a_speed_only_beyond_both_intervals() -> None:
    bar = Bar(trial=3, objective="samples_per_second", value=100.0, ci95_rel=0.05)
    assert bar.low == pytest.approx(100 / 1.05)
    assert bar.beats(80.0, 0.10)  # 80 / 0.9 = 88.9 < 95.2
    assert not bar.beats(90.0, 0.10)  # 100 at the fast end: within reach
    assert not bar.beats(10.0, 1.0) and not bar.beats(10.0, float("inf"))  # an interval that says nothing


def measured(values: dict[str, Any], speed: float, ci: float | None = 0.03, cut: dict | None = None) -> Measurement:
    return Measurement(status="ok", config=values, samples_per_second=speed, tokens_per_second=speed * 100,
                       peak_memory_bytes=2**30, step_time_ci95_rel=ci, stable=cut is None, slower_than=cut)


def trial(number: int, values: dict[str, Any], speed: float, **kw: Any) -> Trial:
    return Trial(number=number, values=values, measurement=measured(values, speed, **kw), objective=speed)


def test_the_bar_is_the_fastest_config_that_learns_the_same(tmp_path: Path) -> None:
    """lora_r changes what is learned: a rank-8 probe is held to rank 8's best, never to rank 16's,
    whatever the batch (the effective batch is what a batch search moves); a probe that was itself cut
    short, or whose interval was not measured, sets no bar."""
    spec = build_spec({"model": {"config": TINY_LLAMA}, "params": {"max_length": 64},
                       "search": {"batch_size": [1, 2, 4], "lora_r": [8, 16], "gradient_checkpointing": [False, True]}},
                      base_dir=tmp_path)
    history = [trial(0, {"batch_size": 4, "lora_r": 16, "gradient_checkpointing": False}, 90.0),
               trial(1, {"batch_size": 1, "lora_r": 8, "gradient_checkpointing": False}, 20.0),
               trial(2, {"batch_size": 2, "lora_r": 8, "gradient_checkpointing": False}, 35.0, ci=0.04),
               trial(3, {"batch_size": 4, "lora_r": 8, "gradient_checkpointing": True}, 50.0, cut={"trial": 9}),
               trial(4, {"batch_size": 4, "lora_r": 8, "gradient_checkpointing": False}, 70.0, ci=None)]
    bar = bar_for(spec.search, history, {"batch_size": 4, "lora_r": 8, "gradient_checkpointing": True},
                  "samples_per_second")
    assert bar == Bar(trial=2, objective="samples_per_second", value=35.0, ci95_rel=0.04)
    assert bar_for(spec.search, history, {"batch_size": 1, "lora_r": 16, "gradient_checkpointing": True},
                   "samples_per_second").trial == 0
    assert bar_for(spec.search, history[1:], {"batch_size": 1, "lora_r": 16, "gradient_checkpointing": True},
                   "samples_per_second") is None
    # cut short is ranked, not noise: it does not count toward the noisy-machine warning
    assert noise_warning([history[3], history[3], history[0]]) is None


def test_the_search_gives_a_probe_that_takes_it_its_bar(tmp_path: Path) -> None:
    """The loop tells a probe function with a ``slower_than`` keyword each probe's bar, and one
    without it is called as before."""
    spec = build_spec({"model": {"config": TINY_LLAMA}, "params": {"max_length": 64},
                       "search": {"batch_size": [1, 2, 4], "lora_r": [8, 16]}, "tune": {"strategy": "grid"}},
                      base_dir=tmp_path)
    bars: list[tuple[dict[str, Any], Bar | None]] = []

    def probe(params: Params, number: int, slower_than: Bar | None = None) -> Measurement:
        bars.append(({"batch_size": params.batch_size, "lora_r": params.lora_r}, slower_than))
        return measured(params.to_dict(), 10.0 * params.batch_size + params.lora_r)

    with open_search(spec, SearchOptions(output=tmp_path / "run", probe_fn=probe, device_type="cpu")) as search:
        for _ in search.measured():
            pass
    assert len(bars) == 6
    for i, (config, bar) in enumerate(bars):
        same_rank = [10.0 * c["batch_size"] + c["lora_r"] for c, _ in bars[:i] if c["lora_r"] == config["lora_r"]]
        assert (bar.value if bar else None) == (max(same_rank) if same_rank else None), (config, bar)

    calls: list[int] = []
    with open_search(spec, SearchOptions(output=tmp_path / "old", probe_fn=lambda p, n: calls.append(n) or measured(
            p.to_dict(), 10.0), device_type="cpu")) as search:
        for _ in search.measured():
            pass
    assert len(calls) == 6


@pytest.mark.integration
def test_a_real_probe_stops_timing_once_clearly_slower_and_says_so(tmp_path: Path) -> None:
    """The tiny Llama on this CPU: against a bar no config reaches, the timing stops after its
    second whole cycle with the bar recorded; against one any config passes, it times to its rule."""
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"model: {{config: {dict(TINY_LLAMA)}}}\nparams: {{max_length: 64, batch_size: 2}}\n"
                         "probe: {min_steps: 30, max_steps: 30, max_seconds: 120, target_rel_ci: 0.0001}\n")
    spec = load_spec(spec_file)
    out_of_reach = Bar(trial=7, objective="samples_per_second", value=1e12, ci95_rel=0.02)
    cut = run_probe(spec, slower_than=out_of_reach, workdir=tmp_path / "cut")
    assert cut.status == "ok", cut.message
    assert cut.slower_than == dataclasses.asdict(out_of_reach) and not cut.stable
    assert 3 <= cut.steps_measured < 30 and cut.samples_per_second > 0
    assert cut.cut_short == "cut short: clearly slower than trial 7's 1e+12 samples/s"
    full = run_probe(spec, slower_than=dataclasses.replace(out_of_reach, value=1e-9), workdir=tmp_path / "full")
    assert full.status == "ok" and full.slower_than is None and full.steps_measured == 30
