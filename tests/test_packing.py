"""Packing (``packing: true``): samples packed into rows of max_length as TRL packs them, each
batch trained padding-free as one row. Checked against TRL's own packing, a real model's forward
(a packed sample sees only itself), and a real probe whose tokens/s counts real tokens only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, TINY_LLAMA, make_spec_file

from trainfit.data.packing import pack_bfd, packed_epoch
from trainfit.params import Params
from trainfit.probe import run_probe
from trainfit.probe.estimate import assumed_mix, typical_mix
from trainfit.spec import load_spec


def lognormal(n: int, scale: float, seed: int = 0) -> np.ndarray:
    return np.maximum(0, np.random.default_rng(seed).lognormal(0.0, 0.8, n) * scale).astype(np.int64)


@pytest.mark.parametrize("max_length, seed, n", [(64, 0, 500), (256, 1, 500), (16, 2, 500), (64, 3, 2500)])
def test_the_rows_are_the_ones_trls_own_packing_makes(max_length: int, seed: int, n: int) -> None:
    """The same rows, each holding samples of the same lengths in the same order, as
    ``trl.data_utils.pack_dataset(..., "bfd")``: empty samples dropped, long ones cut, and past
    1,000 samples each run of 1,000 packed on its own (``datasets``' map batches)."""
    datasets = pytest.importorskip("datasets")
    from trl.data_utils import pack_dataset

    lengths = lognormal(n, max_length / 3, seed)
    lengths[:3] = [0, max_length * 3, max_length]  # an empty one, one to cut, one that fills a row alone
    dataset = datasets.Dataset.from_dict({"input_ids": [list(range(1, n + 1)) for n in lengths]})
    theirs = [list(row) for row in pack_dataset(dataset, max_length, "bfd")["seq_lengths"]]
    ours = [[min(int(lengths[i]), max_length) for i in row] for row in pack_bfd(lengths, max_length)]
    assert ours == theirs
    assert sorted(i for row in pack_bfd(lengths, max_length) for i in row) == [i for i in range(n) if lengths[i]]
    if n > 1000:  # packed all at once, fewer rows: not what TRL trains
        assert len(pack_bfd(lengths, max_length, chunk=None)) < len(theirs)


def test_a_packed_epoch_visits_every_sample_once_in_fewer_fuller_batches() -> None:
    lengths = lognormal(1000, 40)
    lengths[lengths == 0] = 1
    epoch = packed_epoch(lengths, 4, max_length=256, seed=3)
    assert sorted(epoch.order.tolist()) == list(range(1000))  # every sample once
    assert epoch.packed_rows is not None and set(epoch.packed_rows[:-1].tolist()) == {4}
    assert epoch.rows.sum() == 1000 and epoch.total_real_tokens == int(np.minimum(lengths, 256).sum())
    assert (epoch.padded_length == epoch.real_tokens).all() and epoch.padding_share == 0.0  # padding-free
    assert epoch.padded_length.max() <= 4 * 256
    unpacked_batches = -(-1000 // 4)
    assert epoch.batches < unpacked_batches / 3  # ~6 samples a row: far fewer steps
    # Rounded up to a multiple (pad_to_multiple_of), the one row pads only its end.
    rounded = packed_epoch(lengths, 4, max_length=256, seed=3, multiple=64)
    assert (rounded.padded_length % 64 == 0).all() and (rounded.padded_length - rounded.real_tokens < 64).all()
    shapes, counts = rounded.shape_counts()
    assert set(shapes[:, 0].tolist()) == {1} and counts.sum() == rounded.batches  # each batch one row


def test_the_probes_mix_of_a_packed_config_counts_samples_and_real_tokens() -> None:
    lengths = lognormal(2000, 40).tolist()
    packed = Params(batch_size=2, packing=True)
    mix = typical_mix(lengths, packed, max_length=128, seed=0)
    cut = np.minimum(np.maximum(lengths, 0), 128)
    assert mix.samples == int((cut > 0).sum()) and mix.real_tokens == int(cut.sum())
    assert mix.padded_tokens == mix.real_tokens and mix.padding_share == 0.0
    assert "packed into rows of max_length=128" in mix.batching
    assert all(sum(b) <= 2 * 128 for b in mix.timing_batches) and mix.timing_batches
    # The same data unpacked: as many micro-batches as samples / 2, most positions padding-free only by luck.
    plain = typical_mix(lengths, Params(batch_size=2), max_length=128, seed=0)
    assert mix.micro_batches < plain.micro_batches / 2 and plain.padding_share > 0.1
    no_data = assumed_mix(packed, 128)
    assert no_data.padded_tokens == no_data.real_tokens == 256 and no_data.padded_lengths == (256,)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_packed_sample_sees_only_itself(attention: str, tmp_path: Path) -> None:
    """The padding-free row a probe trains: each sample's logits are those of the sample alone,
    as TRL's padding-free batches are (position ids restart, the mask is block-diagonal)."""
    import torch

    from trainfit.workloads import build_workload

    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"attention": attention, "max_length": 32}))
    workload = build_workload(spec, dataclasses.replace(spec.params, packing=True), torch.device("cpu"))
    workload.model.eval()
    batch = workload.make_packed_batch([5, 9, 3], 20)
    inputs = batch.inputs
    assert batch.padded_tokens == 20 and batch.real_tokens == 17 and batch.samples == 3
    assert inputs["position_ids"][0].tolist() == [*range(5), *range(9), *range(3), 0, 0, 0]
    assert (inputs["labels"][0][[0, 5, 14, 17, 18, 19]] == -100).all() and "attention_mask" not in inputs
    with torch.no_grad():
        packed = workload.model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]).logits[0]
        start = 0
        for n in (5, 9, 3):
            alone = workload.model(input_ids=inputs["input_ids"][:, start:start + n]).logits[0]
            torch.testing.assert_close(packed[start:start + n], alone, atol=1e-4, rtol=1e-4)
            start += n


@pytest.mark.integration
def test_a_probe_of_a_packed_config_trains_real_steps_and_counts_real_tokens(tmp_path: Path) -> None:
    data = tmp_path / "lengths.jsonl"
    lengths = [int(n) for n in np.clip(lognormal(400, 30), 1, 100)]  # none reaches max_length 128
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in lengths))
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, data={"path": str(data), "length_field": "n"},
                          params={"batch_size": 2, "max_length": 128, "packing": True})
    m = run_probe(load_spec(path), workdir=tmp_path / "probe")
    assert m.status == "ok", m.message
    assert m.padding_share == 0.0 and "packed into rows" in (m.speed_basis or "")
    cut = np.minimum(lengths, 128)
    # tokens over samples: the real length of the mean sample, not a padded one
    assert m.tokens_per_second / m.samples_per_second == pytest.approx(cut.mean(), rel=1e-6)
    assert m.worst_case_lengths == [128, 128]  # two full packed rows, whatever the data's longest
    assert all(s["rows"] >= 2 for s in m.shape_times)  # each timed micro-batch holds the samples of 2 rows
    # Samples a step: the epoch's mean (a fraction), what a plan counts the run's steps by.
    assert m.samples_per_step is not None and m.samples_per_step > 2
    assert m.samples_per_step == pytest.approx(m.samples_per_second * m.expected_step_time_s, rel=1e-6)


def test_a_custom_model_cannot_pack_and_says_so(tmp_path: Path) -> None:
    """Refused as the spec loads; a workload asked anyway (the spec checks bypassed) says why, and
    the search would skip every packed config."""
    import torch

    from trainfit.errors import SpecError, Unsupported
    from trainfit.workloads import build_workload

    for sets in (["packing=true"], ["search={packing: [false, true]}"]):
        with pytest.raises(SpecError, match="this is a factory model, whose own collate makes its batches"):
            load_spec(EXAMPLES / "tiny-tts.yaml", sets)
    # Grouping likewise where trainfit's own loop trains it; a template that passes it may.
    with pytest.raises(SpecError, match="does not group them by length"):
        load_spec(EXAMPLES / "tiny-tts.yaml", ["group_by_length=true", "tune.command_template=null"])
    load_spec(EXAMPLES / "tiny-tts.yaml", ["group_by_length=true",
                                           "tune.command_template=python t.py --group {group_by_length}"])
    spec = load_spec(EXAMPLES / "tiny-tts.yaml")
    workload = build_workload(spec, spec.params, torch.device("cpu"))
    with pytest.raises(Unsupported, match="cannot pack samples into one row") as err:
        workload.make_packed_batch([3, 4], 8)
    assert (err.value.knob, err.value.value) == ("packing", True)
