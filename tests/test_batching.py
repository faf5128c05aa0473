"""The epoch simulation: hand-computed shapes where the order cannot matter, and the length grouping
checked against transformers' own ``get_length_grouped_indices`` on the same permutation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from trainfit.data.batching import EpochBatches, length_grouped_order, simulate_epoch
from trainfit.params import Params


def test_equal_lengths_pad_nothing_and_the_last_batch_is_short() -> None:
    epoch = simulate_epoch([5] * 10, 3, padding="longest", max_length=None)
    assert epoch.rows.tolist() == [3, 3, 3, 1]
    assert epoch.padded_length.tolist() == [5, 5, 5, 5]
    assert epoch.real_tokens.tolist() == [15, 15, 15, 5]
    assert (epoch.batches, epoch.samples, epoch.total_real_tokens, epoch.total_padded_positions) == (4, 10, 50, 50)
    assert epoch.padding_share == 0.0
    shapes, counts = epoch.shape_counts()
    assert shapes.tolist() == [[1, 5], [3, 5]]
    assert counts.tolist() == [1, 3]


def test_batch_size_one_never_pads() -> None:
    lengths = [7, 1, 30, 2, 2, 9]
    epoch = simulate_epoch(lengths, 1, padding="longest", max_length=None, seed=3)
    assert sorted(epoch.padded_length.tolist()) == sorted(lengths)
    assert (epoch.padded_length == epoch.real_tokens).all()
    assert epoch.total_padded_positions == epoch.total_real_tokens == 51
    assert epoch.padding_share == 0.0


def test_one_batch_of_everything_pads_to_the_longest() -> None:
    epoch = simulate_epoch([1, 3, 2, 2], 4, padding="longest", max_length=None)
    assert (epoch.rows.tolist(), epoch.padded_length.tolist(), epoch.real_tokens.tolist()) == ([4], [3], [8])
    assert epoch.padding_share == pytest.approx(1 - 8 / 12)


@pytest.mark.parametrize("group_by_length", [False, True])
def test_max_length_padding_and_truncation(group_by_length: bool) -> None:
    lengths = [1, 3, 2, 2, 6]
    fixed = simulate_epoch(lengths, 2, padding="max_length", max_length=4, group_by_length=group_by_length)
    assert fixed.padded_length.tolist() == [4, 4, 4]
    assert fixed.total_padded_positions == 5 * 4
    assert fixed.total_real_tokens == 1 + 3 + 2 + 2 + 4  # the 6 is truncated to 4
    truncated = simulate_epoch([10, 1], 2, padding="longest", max_length=4, group_by_length=group_by_length)
    assert (truncated.padded_length.tolist(), truncated.real_tokens.tolist()) == ([4], [5])


def test_pad_to_multiple_of_rounds_every_batch_up() -> None:
    short = simulate_epoch([5, 5, 5], 3, padding="longest", max_length=None, pad_to_multiple_of=8)
    assert (short.padded_length.tolist(), short.total_padded_positions, short.total_real_tokens) == ([8], 24, 15)
    exact = simulate_epoch([5, 16], 2, padding="longest", max_length=None, pad_to_multiple_of=8)
    assert exact.padded_length.tolist() == [16]
    longer = simulate_epoch([5, 17], 2, padding="longest", max_length=None, pad_to_multiple_of=8)
    assert longer.padded_length.tolist() == [24]
    fixed = simulate_epoch([5, 5, 5], 3, padding="max_length", max_length=10, pad_to_multiple_of=8)
    assert fixed.padded_length.tolist() == [16]
    # trainfit's trl command pads to max_length with pad_to_multiple_of=max_length (trainer/command.py): same shapes.
    lengths = np.random.default_rng(1).integers(1, 200, size=101)
    as_multiple = simulate_epoch(lengths, 4, padding="longest", max_length=64, pad_to_multiple_of=64)
    as_fixed = simulate_epoch(lengths, 4, padding="max_length", max_length=64)
    assert as_multiple.padded_length.tolist() == as_fixed.padded_length.tolist()


def test_a_batch_is_padded_by_the_epochs_rule() -> None:
    """``Params.padded_length`` (what the probe, the eval pass and the command pad one batch to) and
    ``simulate_epoch`` (a whole epoch at once) are one rule: every batch of an epoch agrees."""
    assert Params().padded_length(17, 64) == 17  # no rounding: the longest sample
    assert Params(pad_to_multiple_of=8).padded_length(17, 64) == 24
    assert Params(pad_to_multiple_of=8).padded_length(16, 64) == 16  # already a multiple
    assert Params(pad_to_multiple_of=48).padded_length(60, 64) == 96  # past max_length, as TRL's collator pads
    fixed = Params(padding="max_length", max_length=100, pad_to_multiple_of=64)
    assert fixed.padded_length(5, 100) == 128  # transformers rounds a fixed max_length up too
    lengths = np.random.default_rng(2).integers(1, 300, size=203)
    for params in (Params(batch_size=4, pad_to_multiple_of=8), Params(batch_size=4, pad_to_multiple_of=48),
                   Params(batch_size=4), Params(batch_size=3, padding="max_length", max_length=100,
                                                pad_to_multiple_of=64)):
        epoch = simulate_epoch(lengths, params.batch_size, padding=params.padding, max_length=100,  # type: ignore[arg-type]
                               pad_to_multiple_of=params.pad_to_multiple_of, seed=3)
        starts = np.concatenate([[0], np.cumsum(epoch.rows)[:-1]])
        each = [params.padded_length(int(np.minimum(lengths, 100)[epoch.order[a:a + n]].max()), 100)
                for a, n in zip(starts, epoch.rows, strict=True)]
        assert each == epoch.padded_length.tolist() and len(each) == epoch.batches, params


def test_drop_last_drops_only_the_short_batch() -> None:
    kept = simulate_epoch([4] * 10, 3, padding="longest", max_length=None, drop_last=True)
    assert (kept.rows.tolist(), kept.samples, kept.total_real_tokens) == ([3, 3, 3], 9, 36)
    dropped = set(range(10)) - set(kept.order.tolist())
    assert len(dropped) == 1 and kept.order.size == 9
    exact = simulate_epoch([4] * 9, 3, padding="longest", max_length=None, drop_last=True)
    assert exact.rows.tolist() == [3, 3, 3]


def test_the_seed_changes_the_order_not_the_tokens() -> None:
    lengths = np.random.default_rng(0).integers(1, 500, size=1000)
    a = simulate_epoch(lengths, 8, padding="longest", max_length=None, seed=1)
    b = simulate_epoch(lengths, 8, padding="longest", max_length=None, seed=1)
    c = simulate_epoch(lengths, 8, padding="longest", max_length=None, seed=2)
    assert a.padded_length.tolist() == b.padded_length.tolist()
    assert a.padded_length.tolist() != c.padded_length.tolist()
    assert a.total_real_tokens == c.total_real_tokens == int(lengths.sum())
    assert a.order.tolist() == np.random.default_rng(1).permutation(1000).tolist()  # numpy's seeded permutation
    batches = np.split(lengths[a.order], np.cumsum(a.rows)[:-1])
    assert a.padded_length.tolist() == [int(b.max()) for b in batches]
    assert a.real_tokens.tolist() == [int(b.sum()) for b in batches]
    shapes, counts = a.shape_counts()
    pairs, pair_counts = np.unique(np.stack([a.rows, a.padded_length], axis=1), axis=0, return_counts=True)
    assert (shapes.tolist(), counts.tolist()) == (pairs.tolist(), pair_counts.tolist())
    assert int((shapes[:, 0] * shapes[:, 1] * counts).sum()) == a.total_padded_positions
    assert int(counts.sum()) == a.batches == 125


def test_grouping_by_length_provably_cuts_padding() -> None:
    # Half the samples 10 long, half 1000: in random order nearly every batch of 8 holds a long one.
    lengths = np.array([10, 1000] * 2000)
    batch = 8
    shuffled = simulate_epoch(lengths, batch, padding="longest", max_length=None, seed=5)
    grouped = simulate_epoch(lengths, batch, padding="longest", max_length=None, seed=5, group_by_length=True)
    assert grouped.total_real_tokens == shuffled.total_real_tokens == 2000 * 1010
    assert grouped.samples == shuffled.samples == 4000
    assert shuffled.padding_share > 0.45
    # 4000 // (8 * 4) = 125 > 50: megabatches of 50 batches, 10 of them, each sorted, so at most one batch
    # per megabatch mixes the two lengths, and it pads at most 7 rows by 990 positions.
    megabatches = 4000 // (50 * batch)
    worst_padding = megabatches * (batch - 1) * (1000 - 10)
    assert grouped.total_padded_positions - grouped.total_real_tokens <= worst_padding
    assert grouped.padding_share < shuffled.padding_share / 10


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_longest_sample_opens_the_grouped_epoch(seed: int) -> None:
    lengths = np.random.default_rng(seed).integers(1, 100, size=2003)
    lengths[1234] = 5000
    grouped = simulate_epoch(lengths, 8, padding="longest", max_length=None, seed=seed, group_by_length=True)
    assert grouped.padded_length[0] == 5000
    assert grouped.order[0] == 1234
    permutation = np.random.default_rng(seed).permutation(lengths.size)
    order = length_grouped_order(lengths, permutation, 8)
    assert order[0] == 1234
    assert sorted(order.tolist()) == list(range(lengths.size))  # every sample once


@pytest.mark.parametrize(("n", "batch_size"), [(1000, 4), (37, 8), (130, 4), (10_001, 8), (5, 1)])
def test_grouped_order_is_transformers_order(n: int, batch_size: int) -> None:
    torch = pytest.importorskip("torch")
    from transformers.trainer_pt_utils import get_length_grouped_indices

    # Short lengths: many ties, so the stable order of equal lengths and the first-maximum rule both count.
    lengths = np.random.default_rng(n).integers(1, 20, size=n)
    for seed in range(3):
        permutation = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
        expected = get_length_grouped_indices(lengths.tolist(), batch_size,
                                              generator=torch.Generator().manual_seed(seed))
        assert length_grouped_order(lengths, permutation, batch_size).tolist() == expected


def test_grouped_epoch_is_the_trainers_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole simulation against transformers' sampler order cut into DataLoader batches, with the
    Trainer's sampler batch size (batch x accumulation), truncation and a short last batch."""
    torch = pytest.importorskip("torch")
    from transformers import trainer_pt_utils

    lengths = np.random.default_rng(7).integers(1, 600, size=3001)
    batch, accumulation, max_length, seed = 4, 3, 512, 11
    epoch = simulate_epoch(lengths, batch, padding="longest", max_length=max_length, seed=seed,
                           group_by_length=True, gradient_accumulation_steps=accumulation)
    # Feed transformers the simulation's own (numpy) permutation in place of torch.randperm's.
    permutation = torch.from_numpy(np.random.default_rng(seed).permutation(lengths.size))
    monkeypatch.setattr(trainer_pt_utils.torch, "randperm", lambda n, generator=None: permutation)
    truncated = np.minimum(lengths, max_length)
    order = trainer_pt_utils.get_length_grouped_indices(truncated.tolist(), batch * accumulation)
    batches = [truncated[order[i:i + batch]] for i in range(0, len(order), batch)]
    assert epoch.order.tolist() == order
    assert epoch.rows.tolist() == [len(b) for b in batches]
    assert epoch.padded_length.tolist() == [int(b.max()) for b in batches]
    assert epoch.real_tokens.tolist() == [int(b.sum()) for b in batches]


def test_accumulation_changes_nothing_in_random_order() -> None:
    lengths = np.random.default_rng(4).integers(1, 300, size=999)
    one = simulate_epoch(lengths, 4, padding="longest", max_length=None)
    four = simulate_epoch(lengths, 4, padding="longest", max_length=None, gradient_accumulation_steps=4)
    assert one.padded_length.tolist() == four.padded_length.tolist()


def test_the_record_is_frozen() -> None:
    rows = np.array([2, 1])
    epoch = EpochBatches(rows=rows, padded_length=np.array([3, 3]), real_tokens=np.array([5, 2]),
                         order=np.array([2, 0, 1]))
    rows[0] = 9  # the caller's array stays theirs
    assert epoch.rows.tolist() == [2, 1]
    with pytest.raises(ValueError):
        epoch.rows[0] = 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(epoch, "rows", rows)  # noqa: B010 (assigning plainly is a type error, which is the point)
    with pytest.raises(ValueError, match="equally long"):
        EpochBatches(rows=np.array([1]), padded_length=np.array([1, 2]), real_tokens=np.array([1]),
                     order=np.array([0]))
    with pytest.raises(ValueError, match="order must list the 3 samples"):
        EpochBatches(rows=np.array([2, 1]), padded_length=np.array([3, 3]), real_tokens=np.array([5, 2]),
                     order=np.array([0, 1]))


def test_whole_float_lengths_are_accepted() -> None:
    epoch = simulate_epoch(np.array([2.0, 4.0]), 2, padding="longest", max_length=None)
    assert (epoch.padded_length.tolist(), epoch.real_tokens.tolist()) == ([4], [6])


@pytest.mark.parametrize(("lengths", "kwargs", "message"), [
    ([1, 2], {"batch_size": 2, "padding": "max_length", "max_length": None}, "padding='max_length' needs max_length"),
    ([1, 2], {"batch_size": 0, "padding": "longest", "max_length": None}, "batch_size must be >= 1"),
    ([], {"batch_size": 2, "padding": "longest", "max_length": None}, "lengths is empty"),
    ([1, -2], {"batch_size": 2, "padding": "longest", "max_length": None}, "lengths must be >= 0"),
    ([1.5, 2], {"batch_size": 2, "padding": "longest", "max_length": None}, "whole numbers"),
    ([[1, 2]], {"batch_size": 2, "padding": "longest", "max_length": None}, "must be 1-D"),
    ([1, 2], {"batch_size": 2, "padding": "pack", "max_length": None}, "padding must be one of"),
    ([1, 2], {"batch_size": 2, "padding": "longest", "max_length": 0}, "max_length must be >= 1"),
    ([1, 2], {"batch_size": 2, "padding": "longest", "max_length": None, "pad_to_multiple_of": 0},
     "pad_to_multiple_of must be >= 1"),
    ([1, 2], {"batch_size": 2, "padding": "longest", "max_length": None, "gradient_accumulation_steps": 0},
     "gradient_accumulation_steps must be >= 1"),
    ([1, 2], {"batch_size": 3, "padding": "longest", "max_length": None, "drop_last": True}, "leaves no batch"),
])
def test_bad_input_is_refused_with_the_reason(lengths: list, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simulate_epoch(lengths, **kwargs)


def test_every_batching_problem_is_reported_at_once() -> None:
    with pytest.raises(ValueError, match="batch_size must be >= 1.*padding='max_length' needs max_length"):
        simulate_epoch([1, 2], 0, padding="max_length", max_length=None)
