"""On a GPU, ``auto`` jumps a family's climb from its first probe to the largest batch its memory line
says fits, then checks the grid's step below it (issue 47's lever "a memory line from the first
probes that jumps to the limit"); on a CPU it steps one batch at a time, as before. These drive the
strategy itself over a synthetic surface: which batches it asks for, in what order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.search.auto import AutoStrategy
from trainfit.search.trials import Trial
from trainfit.space import parse_space

GiB = 1024**3
BUDGET = 24.0
"""GiB; no headroom: the line's margin (5%) puts the limit at 22.8 GiB."""


def climb(device: str, speed: Callable[[int], float], per_sample_gb: float = 2.0,
          batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> list[int]:
    """The batches ``auto`` asks for, in order, on a surface of 2 GiB fixed + ``per_sample_gb`` a sample
    (each probe's ``step`` part holds its samples' share), at ``speed(batch)`` samples/s."""
    space, problems = parse_space({"batch_size": list(batches)}, Params(), allow_custom=False)
    assert not problems
    auto = AutoStrategy(space, budget_gb=BUDGET, headroom_gb=0.0, device_type=device)
    history: list[Trial] = []
    while (proposal := auto.propose(history)) is not None:
        b = proposal["batch_size"]
        parts = {"model": 2 * GiB, "step": int(b * per_sample_gb * GiB)}
        peak = sum(parts.values())
        fits = peak <= BUDGET * GiB
        m = Measurement(status="ok" if fits else "oom", config={"batch_size": b},
                        samples_per_second=speed(b) if fits else None, peak_memory_bytes=peak,
                        memory_parts_bytes=parts, budget_memory_gb=BUDGET, budget_headroom_gb=0.0,
                        step_time_ci95_rel=0.02 if fits else None, steps_measured=8, stable=True, device=device)
        history.append(Trial(number=len(history), values={"batch_size": b}, measurement=m,
                             objective=m.samples_per_second))
        assert len(history) < 20, history
    return [t.values["batch_size"] for t in history]


def saturating(b: int) -> float:
    return b / (0.05 + 0.01 * b)


def test_on_a_gpu_the_climb_jumps_to_the_memory_line_and_checks_the_step_below() -> None:
    """2 GiB + 2 GiB a sample in 24: batch 11 is the largest that fits, 10 the largest within the
    line's 5% margin. From batch 1's step part the line says 10: the jump probes it, then 8 (the
    grid's step below, where a speed that falls near the memory limit would peak), then the integer
    search past the margin goes on as a CPU's does (11 fits, 13 and 12 do not). Batches 2 and 4 are
    never probed."""
    assert climb("cuda", saturating) == [1, 10, 8, 11, 13, 12]


def test_on_a_cpu_the_climb_steps_as_before() -> None:
    assert climb("cpu", saturating) == [1, 2, 4, 8, 11, 13, 12]


def test_a_speed_that_falls_near_the_limit_is_found_below_the_jump() -> None:
    """The recorded H100 race's liger+packing family peaked at batch 4 of the 5 its memory allowed (64
    against 58 samples/s): here batch 8 is faster than the jump's 10, and is the pick."""
    falls = {1: 10.0, 8: 90.0, 9: 85.0, 10: 80.0}
    order = climb("cuda", lambda b: falls.get(b, 50.0))
    assert order[:3] == [1, 10, 8] and max(order, key=lambda b: falls.get(b, 50.0)) == 8


@pytest.mark.parametrize("per_sample_gb, expected", [(7.0, [2, 3]), (40.0, [])])
def test_no_jump_where_the_line_reaches_no_further_than_the_next_step(per_sample_gb: float,
                                                                     expected: list[int]) -> None:
    """9 GiB at batch 1 and 7 GiB a sample: the line says 3, no further than stepping through 2 would go;
    a first batch that does not fit leaves nothing to jump from."""
    order = climb("cuda", saturating, per_sample_gb=per_sample_gb)
    assert order[1:] == expected

