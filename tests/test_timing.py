from __future__ import annotations

import math

import pytest

from trainfit.probe.timing import StepTimes, StopRule, cycle_times, relative_ci95


def test_relative_ci_uses_student_t() -> None:
    times = [1.0, 1.1, 0.9, 1.0]
    sd = 0.08164965809277261
    assert relative_ci95(times) == pytest.approx(3.182 * sd / 2 / 1.0)
    assert math.isinf(relative_ci95([1.0]))


def test_stops_when_cycles_are_stable_not_before_min_steps() -> None:
    rule = StopRule(min_steps=4, max_steps=100, max_seconds=1e9, target_rel_ci=0.02, cycle=2)
    steady = [0.5, 1.5] * 2  # batches differ in cost, but every cycle costs the same
    assert rule.done(steady[:3]) == (False, False)
    assert rule.done(steady) == (True, True)
    # The same steps judged one by one would never look stable.
    per_step = StopRule(min_steps=4, max_steps=100, max_seconds=1e9, target_rel_ci=0.02)
    assert per_step.done(steady) == (False, False)


def test_caps_end_an_unstable_run() -> None:
    noisy = [1.0, 2.0, 1.0, 3.0]
    assert StopRule(2, 4, 1e9, 0.02).done(noisy) == (True, False)
    assert StopRule(2, 100, 5.0, 0.02).done(noisy[:3]) == (False, False)
    assert StopRule(2, 100, 5.0, 0.02).done(noisy) == (True, False)
    assert cycle_times([1, 2, 3, 4, 5], 2) == [3, 7]
    st = StepTimes.of([1.0, 3.0, 1.0, 3.0], cycle=2)
    assert (st.median, st.mean, st.total, st.n, st.ci95_rel) == (2.0, 2.0, 8.0, 4, 0.0)
