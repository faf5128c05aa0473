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
    # The cap bounds the steps and their waits for data together: a loader-bound probe waits as long as it steps.
    assert StopRule(2, 100, 5.0, 0.02).done([1.0, 1.5, 1.0], waits=[1.0, 1.0, 1.0]) == (True, False)
    assert cycle_times([1, 2, 3, 4, 5], 2) == [3, 7]
    st = StepTimes.of([1.0, 3.0, 1.0, 3.0], cycle=2)
    assert (st.median, st.mean, st.total, st.n, st.ci95_rel) == (2.0, 2.0, 8.0, 4, 0.0)


def test_fewer_than_two_cycles_take_their_noise_from_each_shapes_repeats() -> None:
    """A probe's timed steps from the README's main job (5 shapes, 76-1,024 positions; max_seconds cut
    it after one cycle and 3 repeats): the shapes differ 17-fold by design, and each repeat agreed
    within 3%. The spread of all steps called that +-127%; the repeats say a few percent."""
    from trainfit.probe.timing import shape_repeats_ci95

    times = [0.143, 0.189, 0.285, 0.477, 2.484, 0.148, 0.188, 0.287]
    st = StepTimes.of(times, cycle=5)
    assert relative_ci95(times) > 1.0  # what was reported before
    assert 0.005 < st.ci95_rel < 0.05
    # By hand: relative deviations from each repeated shape's mean, pooled over 3 degrees of freedom.
    groups = [[0.143, 0.148], [0.189, 0.188], [0.285, 0.287], [0.477], [2.484]]
    dev = [t / (sum(g) / len(g)) - 1 for g in groups if len(g) == 2 for t in g]
    pooled = math.sqrt(sum(d * d for d in dev) / 3)
    means = [(sum(g) / len(g), len(g)) for g in groups]
    expected = 3.182 * pooled * math.sqrt(sum(m * m / n for m, n in means)) / sum(m for m, _ in means)
    assert st.ci95_rel == pytest.approx(expected)
    assert math.isinf(shape_repeats_ci95([0.1, 0.2, 0.3], 5))  # no shape timed twice: nothing to tell noise by
    assert StepTimes.of([0.1, 0.2, 0.3], cycle=5).ci95_rel == relative_ci95([0.1, 0.2, 0.3])  # an upper bound
    assert shape_repeats_ci95([1.0, 1.0, 1.0], 1) == 0.0  # one shape: its repeats agree
