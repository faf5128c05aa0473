"""GPU checks: run where CUDA is present (`pytest -m gpu`), skipped cleanly elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_spec_file

from trainfit.probe import run_probe
from trainfit.spec import load_spec

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.integration,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096, "max_position_embeddings": 2048}


def spec(tmp_path: Path, params: dict, budget: dict | None = None) -> Path:
    return make_spec_file(tmp_path, model={"config": LLAMA}, params={"max_length": 1024, **params},
                          budget=budget, probe={"device": "cuda"})


def test_bf16_probe_reports_reserved_memory_and_mfu(tmp_path: Path) -> None:
    m = run_probe(load_spec(spec(tmp_path, {"batch_size": 8, "precision": "bf16", "padding": "max_length"})))
    assert m.status == "ok", m.message
    assert m.peak_memory_bytes >= m.peak_allocated_bytes > 0
    assert m.alloc_retries is not None
    # no budget.memory_gb: the GPU's own memory is the budget
    assert m.budget_memory_gb == pytest.approx(torch.cuda.get_device_properties(0).total_memory / 2**30)
    parts = m.memory_parts_bytes  # fp32 weights under autocast; AdamW: two fp32 moments each
    assert sum(parts.values()) == m.peak_memory_bytes
    assert parts["optimizer"] == pytest.approx(2 * parts["model"], rel=0.05)
    assert parts["step"] > 0 and parts["allocator_cache"] >= 0
    if any(k in m.device_name for k in ("H100", "H200", "A100")):
        assert 0 < m.mfu < 1 and m.hfu >= m.mfu


def test_memory_fraction_cap_turns_an_overflow_into_oom(tmp_path: Path) -> None:
    m = run_probe(load_spec(spec(tmp_path, {"batch_size": 256, "padding": "max_length"},
                                 budget={"memory_gb": 1.0, "headroom_gb": 0.1})))
    assert m.status == "oom", m.message
    assert m.exit_code == 3
    # tensors held at the failure plus the allocation torch's message says failed: past the cap
    assert m.oom_needed_bytes > 0.9 * 2**30


def test_fused_adamw_and_checkpointing_run_on_cuda(tmp_path: Path) -> None:
    m = run_probe(load_spec(spec(tmp_path, {"batch_size": 4, "precision": "bf16", "optimizer": "adamw_fused",
                                            "gradient_checkpointing": True, "tf32": True})))
    assert m.status == "ok", m.message
    assert m.hfu is None or m.hfu > m.mfu  # recomputation counted as hardware FLOPs only


def test_activation_offloading_runs_in_trls_context_and_holds_less_on_the_gpu(tmp_path: Path) -> None:
    """The same config with TRL's activation offloading: a lower step part of the peak (the
    activations wait in pinned CPU memory), the same loss (only where tensors live changes)."""
    base = {"batch_size": 8, "precision": "bf16", "padding": "max_length"}
    plain = run_probe(load_spec(spec(tmp_path / "plain", base)))
    offloaded = run_probe(load_spec(spec(tmp_path / "offloaded", {**base, "activation_offloading": True})))
    assert plain.status == "ok" and offloaded.status == "ok", (plain.message, offloaded.message)
    assert offloaded.memory_parts_bytes["step"] < plain.memory_parts_bytes["step"]


@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_a_quantized_lora_base_holds_less_than_a_bf16_one(tmp_path: Path, bits: str) -> None:
    """QLoRA as trl sft loads it: the base's linear layers in 4 (8) bits, the adapters in bf16; the
    model part of the peak shrinks, the step still trains."""
    pytest.importorskip("bitsandbytes")
    base = {"batch_size": 4, "precision": "bf16", "lora_r": 16, "lora_target_modules": "all-linear"}
    plain = run_probe(load_spec(spec(tmp_path / "bf16", base)))
    quantized = run_probe(load_spec(spec(tmp_path / bits, {**base, "quantization": bits})))
    assert plain.status == quantized.status == "ok", (plain.message, quantized.message)
    assert quantized.memory_parts_bytes["model"] < 0.75 * plain.memory_parts_bytes["model"]
    assert quantized.samples_per_second and quantized.samples_per_second > 0


def test_a_reused_worker_measures_the_peak_a_fresh_one_does(tmp_path: Path) -> None:
    import dataclasses

    from trainfit.probe.runner import ProbeSession

    s = load_spec(spec(tmp_path, {"batch_size": 2, "precision": "bf16", "padding": "max_length"}))
    big = dataclasses.replace(s.params, batch_size=16)
    with ProbeSession() as session:
        first = run_probe(s, session=session)
        reused = run_probe(s, big, session=session)
        smaller = run_probe(s, session=session)  # on CUDA a kept model serves smaller batches too
    fresh = run_probe(s, big)
    assert first.status == reused.status == fresh.status == smaller.status == "ok"
    assert reused.model_reused and smaller.model_reused and not fresh.model_reused
    assert smaller.peak_memory_bytes == pytest.approx(first.peak_memory_bytes, rel=0.05)
    assert reused.peak_memory_bytes == pytest.approx(fresh.peak_memory_bytes, rel=0.05)
    assert reused.peak_allocated_bytes == pytest.approx(fresh.peak_allocated_bytes, rel=0.02)
    assert reused.memory_parts_bytes["model"] == fresh.memory_parts_bytes["model"] > 0
    assert reused.memory_parts_bytes["step"] == pytest.approx(fresh.memory_parts_bytes["step"], rel=0.05)


def test_another_model_in_a_kept_process_measures_the_peak_a_fresh_one_does(tmp_path: Path) -> None:
    """On CUDA the runner builds a new model in the worker's process (no start, no CUDA context):
    the old model dropped first, its peak the one a fresh process measures."""
    import dataclasses

    from trainfit.probe.runner import ProbeSession

    s = load_spec(spec(tmp_path, {"batch_size": 4, "precision": "bf16", "padding": "max_length"}))
    lora = dataclasses.replace(s.params, lora_r=16, lora_target_modules="all-linear")
    with ProbeSession() as session:
        first = run_probe(s, session=session)
        kept = run_probe(s, lora, session=session)
    fresh = run_probe(s, lora)
    assert first.status == kept.status == fresh.status == "ok", (kept.message, fresh.message)
    assert not kept.model_reused and kept.phases_s["start"] == 0 and fresh.phases_s["start"] > 0
    assert kept.peak_memory_bytes == pytest.approx(fresh.peak_memory_bytes, rel=0.05)
    assert kept.memory_parts_bytes["model"] == fresh.memory_parts_bytes["model"] > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_probe_on_the_second_gpu_measures_that_gpu(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": LLAMA}, params={"max_length": 1024, "batch_size": 4},
                          probe={"device": "cuda:1"})
    m = run_probe(load_spec(path))
    assert m.status == "ok", m.message
    assert m.device == "cuda:1" and m.peak_allocated_bytes > 0 and m.memory_parts_bytes["model"] > 0


def test_trls_fused_head_on_cuda_is_the_models_loss(tmp_path: Path) -> None:
    """On CUDA, TRL's fused head runs its Triton path (only real tokens scored): same loss and
    gradients as the model's own over the full logits."""
    pytest.importorskip("trl")
    import dataclasses

    from trainfit.workloads import build_workload

    s = load_spec(spec(tmp_path, {"batch_size": 2, "lora_r": 8}), ["tune.command_template=python train.py"])
    results = {}
    for loss in ("model", "fused"):
        workload = build_workload(s, dataclasses.replace(s.params, loss=loss), torch.device("cuda"))
        value = workload.loss(workload.make_batch([700, 1024], 1024).inputs)
        value.backward()
        results[loss] = value.item(), [p.grad for p in workload.model.parameters() if p.requires_grad]
    (model_loss, model_grads), (fused_loss, fused_grads) = results["model"], results["fused"]
    assert fused_loss == pytest.approx(model_loss, rel=1e-4)
    assert all(torch.allclose(f, m, rtol=1e-2, atol=1e-5) for f, m in zip(fused_grads, model_grads))


def test_ligers_loss_on_cuda_is_the_models_loss_without_its_logits(tmp_path: Path) -> None:
    """loss: liger (the transformers Trainer's use_liger_kernel): the model's loss and gradients, and a
    probe that fits where the full logits take most of the step's memory."""
    pytest.importorskip("liger_kernel")
    import dataclasses

    from trainfit.workloads import build_workload

    s = load_spec(spec(tmp_path, {"batch_size": 2, "lora_r": 8}), ["tune.command_template=python train.py"])
    results = {}
    for loss in ("model", "liger"):  # the same seed: the same weights and token ids
        workload = build_workload(s, dataclasses.replace(s.params, loss=loss), torch.device("cuda"))
        batch = workload.make_batch([700, 1024], 1024)
        assert (workload.logits_bytes(batch) is None) == (loss == "liger")
        value = workload.loss(batch.inputs)
        value.backward()
        results[loss] = value.item(), [p.grad for p in workload.model.parameters() if p.requires_grad]
    (model_loss, model_grads), (liger_loss, liger_grads) = results["model"], results["liger"]
    assert liger_loss == pytest.approx(model_loss, rel=1e-3)
    assert all(torch.allclose(g, m, rtol=1e-2, atol=1e-5) for g, m in zip(liger_grads, model_grads))
    probes = {loss: run_probe(load_spec(spec(tmp_path / loss, {"batch_size": 4, "lora_r": 8, "precision": "bf16",
                                                                "loss": loss}), ["tune.command_template=python train.py"]))
              for loss in ("model", "liger")}
    assert all(m.status == "ok" for m in probes.values()), {k: m.message for k, m in probes.items()}
    assert probes["liger"].peak_allocated_bytes < probes["model"].peak_allocated_bytes
    assert any("Liger-Kernel's fused linear cross-entropy" in n for n in probes["liger"].notes)


def test_two_micro_batches_reach_the_peak_of_a_longer_accumulation(tmp_path: Path) -> None:
    """Why the probe's memory phase runs at most two micro-batches per step (memory.memory_micro_batches):
    the peak allocated by a step of 2 equals that of a step of 6 on the same worst-case batch."""
    from trainfit.workloads.step import TrainStep
    from trainfit.workloads import build_workload

    s = load_spec(spec(tmp_path, {"batch_size": 4, "precision": "bf16", "padding": "max_length"}))
    device = torch.device("cuda")
    workload = build_workload(s, s.params, device)
    step = TrainStep(workload, s.params, device)
    batch = workload.make_batch([1024] * 4, 1024)
    step.run([batch])  # the optimizer state exists from here on, as in the probe's second step
    peaks = {}
    for n in (1, 2, 6, 2):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step.run([batch] * n)
        torch.cuda.synchronize()
        peaks.setdefault(n, []).append(torch.cuda.max_memory_allocated())
    assert peaks[6][0] == pytest.approx(max(peaks[2]), rel=0.01), peaks
    assert peaks[1][0] <= peaks[6][0]  # the second micro-batch is the first beside accumulated gradients
