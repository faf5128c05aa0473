"""The probe's input pipeline (``probe.data``): the timed steps on the dataset's own rows through a
real ``DataLoader`` with the config's loader knobs, the wait for data measured and counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import EXAMPLES, make_spec_file, write_frames

from trainfit.cli import main
from trainfit.data.row_length import BAD
from trainfit.errors import TrainfitError
from trainfit.probe import Measurement, run_probe
from trainfit.probe.real_rows import pick_rows
from trainfit.spec import load_spec
from trainfit.trainer.command import trl_args

FACTORY = f"{Path(__file__).parent / 'factories.py'}:learnable"
TOKENIZER = str(EXAMPLES / "data" / "tokenizer.json")


def frames_spec(tmp_path: Path, **params: object) -> Path:
    data = write_frames(tmp_path / "frames.jsonl", 40)
    return make_spec_file(tmp_path, model={"factory": FACTORY}, data={"path": str(data), "length_field": "n"},
                          params={"batch_size": 2, "max_length": 16, "width_mul": 1, **params},
                          probe={"max_steps": 8, "min_steps": 6, "max_seconds": 10})


def probe(path: Path, *overrides: str) -> Measurement:
    return run_probe(load_spec(path, list(overrides)))


def test_a_loader_that_sleeps_is_input_bound_and_workers_lift_its_speed(tmp_path: Path) -> None:
    """A collate that takes 60 ms (as decoding audio would) under a model step of a millisecond:
    in the training process every step waits for it; four workers prepare the next batches while
    the steps run, so a step waits far less and the epoch's samples/s rises."""
    spec = frames_spec(tmp_path, collate_sleep_s=0.06)
    alone = probe(spec)
    assert alone.status == "ok", alone.message
    assert alone.data == "real"
    assert alone.data_wait_s is not None and alone.data_wait_s >= 0.06  # one micro-batch a step, each 60 ms
    assert alone.input_bound_share is not None and alone.input_bound_share > 0.5
    assert any(n.startswith("input-bound") and "num_workers (now 0)" in n for n in alone.notes), alone.notes
    # The wait is part of the step the speeds stand for.
    assert alone.expected_step_time_s is not None and alone.expected_step_time_s >= alone.data_wait_s

    workers = probe(spec, "num_workers=4", "persistent_workers=true", "prefetch_factor=4")
    assert workers.status == "ok", workers.message
    assert workers.data == "real" and workers.loader_start_s is not None
    assert workers.data_wait_s is not None and workers.data_wait_s < alone.data_wait_s / 2
    assert workers.samples_per_second is not None and alone.samples_per_second is not None
    assert workers.samples_per_second > 1.5 * alone.samples_per_second
    # A CPU's peak is the probe process's RSS: the workers' memory is left out, and said so (issue 45).
    uncounted = "the 4 DataLoader worker processes' memory (the rows each collates, the batches it prefetches) is not"
    assert any(uncounted in n for n in workers.notes), workers.notes
    assert not any("DataLoader worker" in n for n in alone.notes), alone.notes


def test_worker_knobs_at_no_workers_are_said_to_be_ignored(tmp_path: Path) -> None:
    """``prefetch_factor`` and ``persistent_workers`` at ``num_workers: 0`` were dropped without a word
    (torch's loader and the written command take them with workers only) (issue 45)."""
    import torch

    from trainfit.params import Params
    from trainfit.workloads.step import check_support

    m = probe(frames_spec(tmp_path), "persistent_workers=true", "prefetch_factor=4")
    assert m.status == "ok", m.message
    assert any(n.startswith("prefetch_factor and persistent_workers are ignored at num_workers: 0") for n in m.notes), \
        m.notes
    cpu = torch.device("cpu")
    assert check_support(Params(prefetch_factor=2), cpu)[0].startswith("prefetch_factor is ignored at num_workers: 0")
    assert check_support(Params(num_workers=2, prefetch_factor=2, persistent_workers=True), cpu) == []


def test_synthetic_inputs_wait_for_nothing_and_say_so(tmp_path: Path) -> None:
    m = probe(frames_spec(tmp_path, collate_sleep_s=0.06), "probe.data=synthetic")
    assert m.status == "ok", m.message
    assert m.data == "synthetic" and m.data_wait_s == 0.0 and m.input_bound_share == 0.0
    assert not any(n.startswith("input-bound") for n in m.notes)


def test_a_hf_model_times_the_same_shapes_on_its_tokenized_rows(llama_spec) -> None:
    """The rows of each timed micro-batch have the lengths the parent picked: a real probe times the
    same shapes as a synthetic one, so the two differ only by the loading."""
    spec = llama_spec({"batch_size": 2, "max_length": 64})
    spec.write_text(spec.read_text() + f"tokenizer: {TOKENIZER}\n")
    real, synthetic = probe(spec), probe(spec, "probe.data=synthetic")
    assert real.status == synthetic.status == "ok", (real.message, synthetic.message)
    assert (real.data, synthetic.data) == ("real", "synthetic")

    def shapes(m: Measurement) -> list[tuple[int, int, int]]:
        return [(s["rows"], s["padded_length"], s["real_tokens"]) for s in m.shape_times]

    assert shapes(real) == shapes(synthetic)


def test_real_data_needs_a_tokenizer_for_a_hf_model(llama_spec, capsys) -> None:
    spec = llama_spec({"batch_size": 2, "max_length": 64})  # no tokenizer: lengths are word pieces
    m = probe(spec)
    assert m.status == "ok" and m.data == "synthetic"
    assert any("synthetic inputs: no tokenizer" in n and "probe.data: auto" in n for n in m.notes), m.notes
    with pytest.raises(TrainfitError, match="probe.data: real, but no tokenizer"):
        probe(spec, "probe.data=real")
    assert main(["probe", str(spec), "--set", "probe.data=real"]) == 2
    err = capsys.readouterr().err
    assert "probe.data: real, but no tokenizer" in err and "Traceback" not in err


def test_a_factory_without_collate_falls_back_or_refuses(tmp_path: Path) -> None:
    data = write_frames(tmp_path / "frames.jsonl", 20)
    spec = make_spec_file(tmp_path, model={"factory": f"{Path(__file__).parent / 'factories.py'}:scaled"},
                          data={"path": str(data), "length_field": "n"},
                          params={"batch_size": 2, "max_length": 16, "width_mul": 1})
    m = probe(spec)
    assert m.status == "ok" and m.data == "synthetic"
    assert any("the factory returns no collate" in n for n in m.notes), m.notes
    refused = probe(spec, "probe.data=real")
    assert refused.status == "error" and "probe.data: real, but the factory returns no collate" in refused.message


def test_rows_are_picked_by_length_first_in_the_file_each_once() -> None:
    lengths = np.array([5, 3, BAD, 3, 9, 5, 3, 12])
    # max_length 9 cuts row 7 (12) to 9: rows 4 and 7 both stand for a 9.
    assert pick_rows(lengths, [(3, 3), (5, 9), (9, 3)], max_length=9) == [[1, 3], [0, 4], [7, 6]]
    # No 4 anywhere: the nearest lengths not taken, a shorter before a longer (the 3s, then a 5); BAD never.
    assert pick_rows(lengths, [(4, 4, 4, 4)], max_length=9) == [[1, 3, 6, 0]]


def test_the_loader_knobs_reach_the_written_command() -> None:
    from trainfit.params import Params

    assert trl_args(Params()) == trl_args(Params(persistent_workers=True, prefetch_factor=4))  # no workers
    words = trl_args(Params(num_workers=4, persistent_workers=True, prefetch_factor=4, pin_memory=False))
    text = " ".join(words)
    for flag in ("--dataloader_num_workers 4", "--dataloader_persistent_workers true",
                 "--dataloader_prefetch_factor 4", "--dataloader_pin_memory false"):
        assert flag in text


def test_num_workers_is_searched_and_the_faster_loader_wins(tmp_path: Path) -> None:
    spec = frames_spec(tmp_path, collate_sleep_s=0.04)
    spec.write_text(spec.read_text() + "search:\n  num_workers: [0, 3]\n")
    out = tmp_path / "tune"
    assert main(["tune", str(spec), "--output", str(out), "--strategy", "grid"]) == 0
    best = json.loads((out / "summary.json").read_text())["best_config"]
    assert best["config"]["num_workers"] == 3


@pytest.mark.parametrize("accumulation", [1, 3])
def test_a_factory_run_with_loader_workers_trains_the_same_steps_as_without(tmp_path: Path,
                                                                            accumulation: int) -> None:
    """trainfit's loop collates in the loader's workers as the probe timed it: each worker takes
    every n-th micro-batch and the loader returns them in order, and the loader's seeds come from a
    generator of its own, not the one the model's dropout draws from: the weights match a run that
    collates in the training process, bit for bit (the epoch's partial last step included)."""
    import torch

    from trainfit.train.loop import run_loop

    data = write_frames(tmp_path / "frames.jsonl", 23)

    def train(workers: int) -> dict[str, torch.Tensor]:
        spec = load_spec(make_spec_file(tmp_path / f"w{workers}", model={"factory": FACTORY},
                                        data={"path": str(data), "length_field": "n"},
                                        params={"batch_size": 2, "gradient_accumulation_steps": accumulation,
                                                "max_length": 16, "width_mul": 1, "num_workers": workers,
                                                "dropout": 0.5}))
        out = tmp_path / f"out{workers}"
        out.mkdir()
        steps, total = run_loop(spec, spec.params, samples=23, epochs=2, max_steps=None, output=out, checkpoint=None,
                                callbacks=[], say=lambda line: None)
        assert steps == total
        return torch.load(out / "model.pt")

    alone, workers = train(0), train(3)
    assert alone.keys() == workers.keys()
    assert all(torch.equal(alone[k], workers[k]) for k in alone)


def test_num_workers_auto_searches_what_this_machine_can_run(tmp_path: Path, monkeypatch: Any) -> None:
    from trainfit.devices import loader_worker_candidates

    assert loader_worker_candidates(cores=2, memory_gib=20) == [0, 1]
    assert loader_worker_candidates(cores=16, memory_gib=100) == [0, 1, 2, 4, 8, 15]
    assert loader_worker_candidates(cores=64, memory_gib=9) == [0, 1, 2, 4]  # memory caps it: 2 GiB a worker
    assert loader_worker_candidates(cores=64, memory_gib=500) == [0, 1, 2, 4, 8, 16]
    spec = frames_spec(tmp_path)
    spec.write_text(spec.read_text() + "search:\n  num_workers: auto\n")
    loaded = load_spec(spec)
    assert loaded.search.dim("num_workers").choices == tuple(loader_worker_candidates())
    # The choices name the study: a resume finds it however much memory is free then.
    import psutil

    from trainfit.search.storage import study_name

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))  # cores enough for memory to cap it
    many = load_spec(spec)
    free = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free._replace(available=free.total // 64))
    assert study_name(load_spec(spec)) == study_name(many)
    spec.write_text(spec.read_text().replace("num_workers: auto", "num_workers: many"))
    with pytest.raises(TrainfitError, match="or auto"):
        load_spec(spec)


def test_fp16_whose_scaler_skips_every_step_diverges_and_a_sound_one_counts_its_skips(tmp_path: Path) -> None:
    """A loss of ~1e37 is finite, but scaled by fp16's loss scaler (2**16 and halving at each skip)
    its gradients overflow at every step: the scaler skips every update, the steps train nothing and
    run faster than real ones. The probe calls it diverged; an ordinary fp16 config counts its skips."""
    spec = frames_spec(tmp_path, precision="fp16")
    blown = probe(spec, "loss_times=1e37")
    assert blown.status == "diverged", blown.message
    assert "loss scaler skipped every timed step" in blown.headline and blown.samples_per_second is None
    sound = probe(spec)
    assert sound.status == "ok", sound.message
    assert sound.scaler_skipped_steps is not None and sound.scaler_skipped_steps < sound.steps_measured
    assert probe(spec, "precision=fp32").scaler_skipped_steps is None  # no scaler, nothing to count


def test_qlora_on_a_cpu_is_unsupported_in_one_probe_and_its_command_loads_the_base_quantized(llama_spec) -> None:
    """bitsandbytes' 4-bit layers run on CUDA: on this CPU a quantized config is `unsupported` (a
    search skips every config with it); the written command and training_args.json carry TRL's
    flags, which its own parser and BitsAndBytesConfig take."""
    from transformers import BitsAndBytesConfig
    from trl import ModelConfig, SFTConfig, TrlParser

    from trainfit.params import Params
    from trainfit.trainer.command import training_arguments

    spec = llama_spec({"batch_size": 2, "max_length": 64, "lora_r": 8, "precision": "bf16"})
    m = probe(spec, "quantization=4bit")
    assert m.status == "error" and m.unsupported == {"quantization": "4bit"}
    assert "quantization=4bit needs a CUDA GPU" in m.message
    params = Params(lora_r=8, precision="bf16", quantization="4bit", bnb_4bit_quant_type="fp4", bnb_double_quant=True)
    words = trl_args(params, 64, cpu=True)  # parsed here, on a CPU
    _, model_args = TrlParser((SFTConfig, ModelConfig)).parse_args_into_dataclasses(
        ["--model_name_or_path", "m", "--output_dir", "/tmp/x", *words])
    assert (model_args.load_in_4bit, model_args.bnb_4bit_quant_type, model_args.use_bnb_nested_quant) == (True, "fp4", True)
    quantized = training_arguments(load_spec(spec), params, max_length=64)["model_init_kwargs"]["quantization_config"]
    config = BitsAndBytesConfig(**quantized)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "fp4" and config.bnb_4bit_use_double_quant
    assert str(config.bnb_4bit_compute_dtype) == "torch.bfloat16"


def test_a_quantized_base_needs_a_rank_and_a_hugging_face_model(llama_spec, tmp_path: Path) -> None:
    with pytest.raises(TrainfitError, match="quantization: 4bit holds the base in 4bit.*lora_r is null"):
        load_spec(llama_spec({"quantization": "4bit"}))
    with pytest.raises(TrainfitError, match="applies to Hugging Face models"):
        load_spec(frames_spec(tmp_path, quantization="8bit"))


def test_a_collate_that_returns_device_tensors_is_not_loaded(tmp_path: Path) -> None:
    """A loader's workers cannot make CUDA tensors (a forked process) nor pin them: a collate whose
    tensors are not on the CPU (here on torch's meta device, standing in for a GPU) is collated once
    in the probe's process and found out: synthetic inputs under auto, saying why; an error under real."""
    spec = frames_spec(tmp_path, collate_device="meta")
    m = probe(spec)
    assert m.status == "ok" and m.data == "synthetic", m.message
    assert any("collate returns tensors on the device" in n and "probe.data: auto" in n for n in m.notes), m.notes
    refused = probe(spec, "probe.data=real")
    assert refused.status == "error" and "return CPU tensors from collate" in refused.message
