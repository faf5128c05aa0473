"""The replay of the recorded GPU searches (bench/replay.py): trainfit's own search run against each
recorded surface. These tests pin its decisions (which configs are probed, in what order, which
families are skipped and why, when a fresh process starts), so a change to the search that changes
them is seen and its replay figures in docs/benchmarks.md are run again. No timing decides a pass:
the simulated seconds are a benchmark's figure, not a test's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench_replay() -> Any:
    spec = importlib.util.spec_from_file_location("bench_replay", ROOT / "bench" / "replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_replay"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


replay = bench_replay()

RACE_B_ORDER = [
    # batch, checkpointing, loss, packing: each family climbed from 1 to what fits (the memory line
    # jumps past the powers of two: 8 -> 10 -> 11 over the budget, 4 -> 7 over it -> 5)
    (1, False, "model", False), (2, False, "model", False), (3, False, "model", False),
    (1, False, "model", True), (2, False, "model", True), (3, False, "model", True),
    (1, False, "liger", False), (2, False, "liger", False), (4, False, "liger", False), (8, False, "liger", False),
    (10, False, "liger", False), (11, False, "liger", False),
    (1, False, "liger", True), (2, False, "liger", True), (4, False, "liger", True), (7, False, "liger", True),
    (5, False, "liger", True),
    # checkpointing only where the family without it stops short of the budget: above its largest fit
    (4, True, "model", False), (4, True, "model", True),
    (16, True, "liger", False), (19, True, "liger", False), (32, True, "liger", False),
    (8, True, "liger", True), (13, True, "liger", True),
]


def test_the_h100_race_replays_its_recorded_search_and_picks_its_best() -> None:
    result = replay.replay(replay.race_b())
    assert [tuple(a["values"].values()) for a in result["trace"]] == RACE_B_ORDER
    assert result["modelled"] == [] and result["stopped"] is None  # every config asked for was recorded
    assert result["pick"] == result["recorded_best"] == {"batch_size": 4, "gradient_checkpointing": False,
                                                          "loss": "liger", "packing": True}
    assert result["pick_speed_share"] == 1.0
    # fresh processes: the first, and the first after Liger's kernels patched the process
    assert result["fresh_processes"] == 2
    assert [(p["family"], p["below_batch"]) for p in result["pruned"]] == [
        ({"gradient_checkpointing": True, "loss": "model", "packing": False}, 3),
        ({"gradient_checkpointing": True, "loss": "model", "packing": True}, 3),
        ({"gradient_checkpointing": True, "loss": "liger", "packing": False}, 10),
        ({"gradient_checkpointing": True, "loss": "liger", "packing": True}, 5)]
    assert all("only trades speed for memory" in p["reason"] for p in result["pruned"])


@pytest.mark.parametrize("name, order", [
    ("race-a", [(1, False), (2, False), (3, False), (4, True), (5, True)]),  # no OOM probe at 4: the memory line
    ("sweep-1b", [(1,), (2,), (4,), (8,), (16,)]),
])
def test_every_recorded_surface_replays_to_its_best(name: str, order: list[tuple[Any, ...]]) -> None:
    surface = replay.SURFACES[name]()
    result = replay.replay(surface)
    assert [tuple(a["values"].values()) for a in result["trace"]] == order
    assert result["stopped"] is None and result["pick"] == surface.best().values


def test_a_config_the_recording_lacks_is_modelled_from_its_family_or_stops_the_replay() -> None:
    """Between two measured batches the speed is interpolated and the peak read off the family's
    line; a family never measured stops the replay, saying which config."""
    surface = replay.race_b()
    m = replay.model(surface, {"batch_size": 6, "gradient_checkpointing": False, "loss": "liger", "packing": True})
    four = next(p for p in surface.probes if p.values["batch_size"] == 4 and p.values["loss"] == "liger"
                and p.values["packing"] and not p.values["gradient_checkpointing"])
    five = next(p for p in surface.probes if p.values["batch_size"] == 5 and p.values["packing"]
                and p.values["loss"] == "liger")
    seven = next(p for p in surface.probes if p.values["batch_size"] == 7 and p.values["packing"]
                 and p.values["loss"] == "liger" and not p.values["gradient_checkpointing"])
    assert min(five.samples_per_second, seven.samples_per_second) <= m.samples_per_second \
        <= max(five.samples_per_second, seven.samples_per_second)
    assert four.peak_gb < m.peak_gb < 24.0 and m.status == "ok"
    lacking = replay.Surface(name="t", source="t", device="t", search=surface.search, budget_gb=24.0,
                             headroom_gb=1.0, probes=[p for p in surface.probes if p.values["loss"] == "model"])
    with pytest.raises(replay.Unrecorded, match="never measured"):
        replay.model(lacking, {"batch_size": 1, "gradient_checkpointing": False, "loss": "liger", "packing": False})


def test_probes_clearly_slower_than_the_best_of_their_learning_values_are_cut_short() -> None:
    """The bar (issue 47): each probe is told the fastest config measured with its learning values
    (packing changes them, the loss kernel and checkpointing do not), and its timing stops once it is
    clearly slower. On race-b seven probes are cut after their second whole cycle (8 steps); the
    configs asked for and the pick are those without the bar."""
    result = replay.replay(replay.race_b())
    cut = {tuple(a["values"].values()): (a["cut"]["steps"], a["cut"]["of"], a["cut"]["bar_trial"])
           for a in result["trace"] if a["cut"]}
    assert cut == {(1, False, "liger", False): (8, 52, 2), (2, False, "liger", False): (8, 16, 2),
                   (1, False, "liger", True): (8, 15, 5), (2, False, "liger", True): (8, 100, 5),
                   (4, True, "model", False): (8, 76, 10),
                   (16, True, "liger", False): (8, 9, 10), (19, True, "liger", False): (8, 9, 10)}
    bars = {a["trial"]: tuple(a["values"].values()) for a in result["trace"]}
    assert bars[2] == (3, False, "model", False) and bars[5] == (3, False, "model", True)
    assert bars[10] == (10, False, "liger", False)
    assert [tuple(a["values"].values()) for a in result["trace"]] == RACE_B_ORDER
    assert result["pick"] == result["recorded_best"]
