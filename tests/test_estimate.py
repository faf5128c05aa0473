"""The expected speed over an epoch's own batches (probe/estimate.py): the shapes a probe times,
the step-cost fit, and its sum over the epoch, against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.probe.estimate import (
    QUANTILES,
    StepCost,
    TypicalMix,
    assumed_mix,
    epoch_speed,
    epoch_first_sights,
    first_sights,
    fit_error,
    fit_step_cost,
    times_longest,
    typical_mix,
)


def test_the_fit_recovers_a_step_cost_with_a_quadratic_term() -> None:
    truth = StepCost(0.05, 2e-4, 3e-7)
    lengths = [40, 90, 160, 300, 1024]
    seconds = [float(truth(x)) for x in lengths]
    fit = fit_step_cost(lengths, seconds)
    assert (fit.a, fit.b, fit.c) == pytest.approx((truth.a, truth.b, truth.c), rel=1e-6)
    assert fit_error(fit, lengths, seconds) == pytest.approx(0.0, abs=1e-9)


def test_the_fit_keeps_every_term_non_negative_and_says_how_far_it_misses() -> None:
    lengths = [10, 20, 30, 40]
    seconds = [1.0, 0.9, 1.1, 1.0]  # noise around a flat cost: no negative slope to chase it
    fit = fit_step_cost(lengths, seconds)
    assert min(fit.a, fit.b, fit.c) >= 0
    assert 0.05 < fit_error(fit, lengths, seconds) < 0.15
    assert fit_step_cost([64, 64], [0.2, 0.4]) == StepCost(pytest.approx(0.3), 0.0, 0.0)  # one shape: its time
    two = fit_step_cost([10, 20], [1.0, 2.0])  # two shapes: a line through them
    assert two.c == 0.0 and float(two(15)) == pytest.approx(1.5)


def test_the_epoch_speed_sums_the_cost_over_the_epochs_micro_batches() -> None:
    mix = TypicalMix(batching="hand", padded_lengths=(10, 100), counts=(3, 1), samples=8, real_tokens=100,
                     padded_tokens=2 * (3 * 10 + 100), timing_batches=((10, 10), (100, 50)))
    cost = StepCost(1.0, 0.01, 0.0)  # 1.1 s at 10 positions, 2.0 s at 100
    speed = epoch_speed(cost, mix, accumulation=2)
    epoch_s = (3 * 1.1 + 2.0) / 2  # 4 micro-batches, 2 per optimizer step: each step costs the mean
    assert speed.step_seconds == pytest.approx((3 * 1.1 + 2.0) / 4)
    assert speed.samples_per_second == pytest.approx(8 / epoch_s)
    assert speed.tokens_per_second == pytest.approx(100 / epoch_s)
    capped = epoch_speed(cost, mix, accumulation=2, max_length=50)  # the worker capped batches at 50
    assert capped.samples_per_second == pytest.approx(8 / ((3 * 1.1 + 1.5) / 2))
    assert mix.padding_share == pytest.approx(1 - 100 / 260)


def test_a_first_epoch_pays_its_padded_lengths_first_sights_once_over_the_real_epochs_steps() -> None:
    mix = TypicalMix(batching="hand", padded_lengths=(10, 100), counts=(3, 1), samples=8, real_tokens=100,
                     padded_tokens=2 * (3 * 10 + 100), timing_batches=((10, 10), (100, 50)))
    cost = StepCost(1.0, 0.01, 0.0)
    warm = epoch_speed(cost, mix, accumulation=2)
    seen = epoch_speed(cost, mix, accumulation=2, first_sights_s=1.0)  # over the epoch's 2 steps
    assert seen.step_seconds == pytest.approx(warm.step_seconds + 1.0 / 2)
    assert seen.samples_per_second == pytest.approx(8 / (2 * warm.step_seconds + 1.0))
    # The mix batches 8 of the data's 800 samples: the real epoch has 100 times its steps to share them over.
    sampled = TypicalMix(**{**mix.__dict__, "data_samples": 800})
    assert sampled.epoch_steps_scale == 100
    assert epoch_speed(cost, sampled, 2, first_sights_s=1.0).step_seconds == pytest.approx(warm.step_seconds
                                                                                             + 1.0 / 200)
    # A run of 3 epochs at a first epoch's speed (10 samples/s, 1,000 samples an epoch, 2 s of first sights):
    # the later epochs meet no new length, so its full run counts them once.
    m = Measurement(status="ok", config={}, samples_per_second=10.0, first_sights_s=2.0)
    assert m.run_seconds(3000, epochs=3) == pytest.approx(300 - 2 * 2.0) and m.run_seconds(1000, 1) == 100
    # The first new shape's excess once (a compiled graph's recompile), then each later length's.
    assert epoch_first_sights((2.0, 0.1), 30) == pytest.approx(2.0 + 29 * 0.1)
    assert epoch_first_sights(None, 30) == 0.0 and epoch_first_sights((2.0, 0.1), 0) == 0.0


def test_a_first_sight_is_the_first_steps_extra_time_where_it_stands_out_of_the_noise() -> None:
    warm = {0: 0.10, 1: 0.20, 2: 0.30, 3: 0.40}
    assert first_sights({k: t + 0.05 for k, t in warm.items()}, warm) == pytest.approx((0.05, 0.05))
    # Compiled: the first new shape recompiles for dynamic shapes, the others reuse that graph.
    assert first_sights({0: 2.10, 1: 0.20, 2: 0.30, 3: 0.40}, warm) == pytest.approx((2.0, 0.0))
    noisy = {0: 0.10, 1: 0.19, 2: 0.33, 3: 0.37}  # -10, +30, -30 ms after the first: nothing beyond the noise
    assert first_sights(noisy, warm) == (0.0, 0.0)
    assert first_sights({0: 0.08}, warm) == (0.0, 0.0)  # one shape, faster the first time: none
    assert first_sights({0: 0.13, 2: 0.32}, warm) == pytest.approx((0.03, 0.02))  # one later shape: its excess
    assert first_sights({5: 0.5}, warm) is None  # no shape timed both ways


def test_the_timed_batches_are_real_batches_of_the_epoch_spread_over_its_padded_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = np.where(rng.random(4000) < 0.9, rng.integers(5, 40, 4000), rng.integers(200, 513, 4000))
    mix = typical_mix(lengths.tolist(), Params(batch_size=4), max_length=400, seed=1)
    assert mix.samples == 4000 and mix.micro_batches == 1000 and sum(mix.counts) == 1000
    assert mix.real_tokens == int(np.minimum(lengths, 400).sum())
    pads = [max(b) for b in mix.timing_batches]
    assert pads == sorted(pads) and len(set(pads)) == len(pads) <= len(QUANTILES) + 1
    assert all(len(b) == 4 and max(b) <= 400 for b in mix.timing_batches)
    assert pads[-1] == 400  # the longest batch: the tail, where attention's quadratic term shows
    padded = np.sort(np.repeat(mix.padded_lengths, mix.counts))
    assert pads == sorted({int(padded[int(np.ceil(q * len(padded))) - 1]) for q in (*QUANTILES, 1.0)})
    # where the memory phase's worst-case step stands for the longest batch, it is not timed again
    strata = typical_mix(lengths.tolist(), Params(batch_size=4), max_length=400, seed=1, longest=False)
    assert [max(b) for b in strata.timing_batches] == pads[:-1] and not strata.times_longest
    # group_by_length: the same samples, far less padding, and timed shapes of that epoch
    grouped = typical_mix(lengths.tolist(), Params(batch_size=4, group_by_length=True), max_length=400, seed=1)
    assert grouped.real_tokens == mix.real_tokens and grouped.padding_share < mix.padding_share / 3
    assert "length-grouped" in grouped.batching and "random order" in mix.batching
    # fixed padding: one shape, every position past a sample's length is padding
    fixed = typical_mix(lengths.tolist(), Params(batch_size=4, padding="max_length", max_length=400),
                        max_length=400, seed=1)
    assert fixed.padded_lengths == (400,) and len(fixed.timing_batches) == 1
    assert fixed.padded_tokens == 4000 * 400


def test_pad_to_multiple_of_prices_the_rounded_lengths_of_the_epoch() -> None:
    """The padding share and the padded lengths of an epoch of known lengths, by hand, with and
    without the knob: one batch of all four samples, then a batch each (no order to depend on)."""
    lengths = [5, 9, 17, 33]  # 64 real positions
    whole = typical_mix(lengths, Params(batch_size=4), max_length=64, seed=0)
    rounded = typical_mix(lengths, Params(batch_size=4, pad_to_multiple_of=8), max_length=64, seed=0)
    assert (whole.padded_lengths, whole.padded_tokens) == ((33,), 4 * 33)
    assert (rounded.padded_lengths, rounded.padded_tokens, rounded.real_tokens) == ((40,), 4 * 40, 64)
    assert rounded.padding_share == pytest.approx(1 - 64 / 160) and whole.padding_share == pytest.approx(1 - 64 / 132)
    each = typical_mix(lengths, Params(pad_to_multiple_of=8), max_length=64, seed=0)
    assert each.padded_lengths == (8, 16, 24, 40) and each.padding_share == pytest.approx(1 - 64 / 88)
    assert typical_mix(lengths, Params(), max_length=64, seed=0).padding_share == 0.0
    assert "rounded up to a multiple of 8" in each.batching
    # Past max_length where the multiple does not divide it, as TRL's collator pads; the longest is timed.
    past = typical_mix(lengths, Params(batch_size=4, pad_to_multiple_of=24), max_length=30, seed=0)
    assert past.padded_lengths == (48,) and past.real_tokens == 5 + 9 + 17 + 30
    # Without data: max_length-long samples, padded to max_length rounded up.
    assumed = assumed_mix(Params(batch_size=2, max_length=100, pad_to_multiple_of=64), 100)
    assert (assumed.padded_lengths, assumed.padded_tokens, assumed.real_tokens) == ((128,), 256, 200)
    # A worker that capped its batches at the model's 20 positions prices them at the cap's padded length.
    cost = StepCost(0.0, 1.0, 0.0)  # a second per position
    capped = epoch_speed(cost, each, accumulation=1, max_length=Params(pad_to_multiple_of=8).padded_length(20, 20))
    assert capped.step_seconds == pytest.approx((8 + 16 + 24 + 24) / 4)


def test_the_longest_batch_is_timed_only_where_the_memory_phase_cannot_stand_for_it() -> None:
    assert not times_longest(Params(gradient_accumulation_steps=2), memory_steps=2)  # a whole step of 2
    assert times_longest(Params(gradient_accumulation_steps=4), memory_steps=2)  # it runs 2 of the 4
    assert times_longest(Params(), memory_steps=1)  # its only step allocates the optimizer's state
    assert not times_longest(Params(padding="max_length", max_length=64, gradient_accumulation_steps=8), 2)
    # but not under packing: a packed micro-batch is a multiple of max_length long, an epoch several shapes
    assert times_longest(Params(padding="max_length", packing=True, max_length=64, gradient_accumulation_steps=8), 2)
    # Packed: the memory phase's rows of one max_length sample each do not stand for packed rows' time.
    assert times_longest(Params(packing=True, max_length=64), memory_steps=2)


def test_a_typical_mix_crosses_into_the_worker_unchanged() -> None:
    mix = typical_mix([5, 9, 30, 31, 200, 7, 8], Params(batch_size=2), max_length=64, seed=0, data_samples=700)
    assert mix.data_samples == 700
    assert TypicalMix.from_dict(mix.to_dict()) == mix
    assert assumed_mix(Params(batch_size=3), 128).timing_batches == ((128, 128, 128),)
