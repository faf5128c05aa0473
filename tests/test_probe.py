"""Probes. The tests marked integration run a tiny model's training steps (in a child process as a
probe does, or through TRL's loss); the rest check in this process what a probe builds and reads."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
from conftest import TESTS, TINY_GPT2, TINY_LLAMA, make_spec_file

from trainfit.cli import main
from trainfit.errors import TrainfitError
from trainfit.probe import Measurement, run_probe
from trainfit.probe.estimate import epoch_first_sights, first_sights
from trainfit.probe.runner import ProbeSession, build_request
from trainfit.spec import load_spec


def probe(path: Path, *overrides: str) -> Measurement:
    return run_probe(load_spec(path, list(overrides)))


def table_row(text: str, label: str) -> list[str]:
    """The cells of the printed table row whose first cell is ``label`` (``render.table`` pads the
    columns and joins them with two spaces or more): asserting on cells leaves the widths free."""
    rows = [re.split(r" {2,}", line.strip()) for line in text.splitlines()]
    found = [cells for cells in rows if cells[0] == label]
    assert found, f"no row {label!r} in:\n{text}"
    return found[0]


def assert_ok(m: Measurement) -> None:
    assert m.status == "ok", m.message
    assert m.samples_per_second > 0 and m.tokens_per_second > 0
    assert m.steps_measured >= 2 and len(m.step_times_s) == m.steps_measured
    assert m.peak_memory_bytes > 100 * 2**20  # the process holds torch at least
    assert m.model_flops_per_step > 0
    assert m.mfu is None  # no peak FLOP/s on record for a CPU
    assert m.versions["torch"] and m.device == "cpu"


@pytest.mark.integration
def test_full_finetune_llama_measures_real_tokens(llama_spec) -> None:
    m = probe(llama_spec({"batch_size": 2, "gradient_accumulation_steps": 2, "max_length": 64}))
    assert_ok(m)
    assert m.samples_per_step == 4
    # padding=longest: padded tokens include the pad, real tokens do not
    assert m.real_tokens_per_step < m.padded_tokens_per_step
    assert m.tokens_per_second == pytest.approx(m.samples_per_second * m.real_tokens_per_step / 4, rel=1e-6)
    assert m.worst_case_lengths == [64, 64]  # the two longest samples, truncated to max_length
    assert m.truncated_samples > 0 and any("truncated" in n for n in m.notes)
    # Each timed shape's first step (in the burn-in) is kept, but for the worst case's shape, which the
    # memory phase met first; the first sights are what they add.
    timed = [s for s in m.shape_times if s.get("phase") != "memory"]
    new = {k: s for k, s in enumerate(timed) if s["first_seconds"] is not None}
    assert new and all(s["first_seconds"] > 0 for s in new.values())
    assert all(s["padded_length"] == 64 and s["rows"] == 2 for s in timed if s["first_seconds"] is None)
    sights = first_sights({k: s["first_seconds"] for k, s in new.items()}, {k: s["seconds"] for k, s in new.items()})
    assert sights is not None and m.first_sight_s == pytest.approx(sights[1], abs=1e-5)
    assert m.epoch_shapes is not None and m.epoch_shapes >= len(timed)
    assert sights[0] == pytest.approx(max(0.0, new[min(new)]["first_seconds"] - new[min(new)]["seconds"]), abs=1e-5)
    assert m.first_sights_s == pytest.approx(epoch_first_sights((sights[0], m.first_sight_s), m.epoch_shapes),
                                             rel=1e-3, abs=1e-4)
    assert set(m.phases_s) == {"start", "device", "build", "memory", "burn_in", "timed"}
    # No budget.memory_gb: the machine's own memory is the budget, less the headroom (default 1 GiB).
    import psutil

    assert m.budget_memory_gb == pytest.approx(psutil.virtual_memory().total / 2**30)
    assert m.budget_headroom_gb == 1.0 and m.fits and any("is the budget" in n for n in m.notes)
    json.dumps(m.to_dict())  # serializable
    assert Measurement.from_dict(m.to_dict()) == m


@pytest.mark.integration
def test_pad_to_multiple_of_pads_the_probed_batches_as_the_collator_does(llama_spec, tmp_path: Path,
                                                                          texts_file) -> None:
    """The worker's batches, the worst case's included, are padded to multiples of 24: 64-long worst
    samples to 72, past max_length, as TRL's collator pads them. A model whose learned positions
    stop short of that fails as the run would, with a note that says why."""
    m = probe(llama_spec({"batch_size": 2, "max_length": 64, "pad_to_multiple_of": 24}))
    assert m.status == "ok", m.message
    assert m.shape_times and all(s["padded_length"] % 24 == 0 for s in m.shape_times), m.shape_times
    assert max(s["padded_length"] for s in m.shape_times) == 72 and m.worst_case_lengths == [64, 64]
    assert all(s["real_tokens"] <= s["rows"] * s["padded_length"] for s in m.shape_times)
    assert "rounded up to a multiple of 24" in m.speed_basis and m.config["pad_to_multiple_of"] == 24
    gpt2 = make_spec_file(tmp_path / "gpt2", model={"config": {**TINY_GPT2, "n_positions": 100}},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"batch_size": 2, "max_length": 100, "pad_to_multiple_of": 64})
    past = probe(gpt2)
    assert past.status == "error" and "index out of range" in past.message
    assert any("pads the longest batches to 128 positions, past the model's 100" in n for n in past.notes), past.notes


@pytest.mark.integration
@pytest.mark.slow
def test_lora_and_checkpointing_change_the_flops_count(llama_spec) -> None:
    base = probe(llama_spec({"padding": "max_length"}))
    lora = probe(llama_spec({"padding": "max_length", "lora_r": 4, "gradient_checkpointing": True}))
    assert_ok(base)
    assert_ok(lora)
    # Same fixed-shape batches; LoRA skips frozen weight gradients, so fewer model FLOPs per token.
    assert lora.model_flops_per_step / lora.real_tokens_per_step < base.model_flops_per_step / base.real_tokens_per_step


@pytest.mark.integration
def test_a_probe_log_holds_the_libraries_output_not_our_noise(llama_spec, tmp_path: Path) -> None:
    spec = load_spec(llama_spec({"lora_r": 4, "gradient_checkpointing": True, "max_length": 32}))
    assert_ok(run_probe(spec, workdir=tmp_path))
    log = (tmp_path / "probe.log").read_text()
    assert "@@trainfit" not in log  # progress events are read, not logged
    # The worker module is run, not imported twice (runpy warns when the package imports it first).
    assert "found in sys.modules" not in log
    # peft reads transformers' deprecated `is_gradient_checkpointing`: nothing a user can act on.
    assert "is_gradient_checkpointing" not in log


def test_an_event_line_is_told_from_a_log_line() -> None:
    from trainfit.probe.events import Phase, Step, parse_event

    assert parse_event('@@trainfit {"event": "step", "n": 3, "seconds": 0.5}') == Step(n=3, seconds=0.5)
    assert parse_event('@@trainfit {"event": "phase", "phase": "timed"}') == Phase("timed")
    assert parse_event("@@trainfit {cut off") is None  # kept in the log, not lost
    assert parse_event('@@trainfit {"event": "step"}') is None  # not an event this parent knows: a log line
    assert parse_event('@@trainfit {"event": "teleport", "to": 3}') is None
    assert parse_event("Loading checkpoint shards: 100%") is None


def tensor_bytes_of_model(config: dict) -> int:
    """Weights and buffers of the tiny model, built here in the test process."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@pytest.mark.integration
def test_memory_parts_say_where_the_peak_went(llama_spec) -> None:
    full = probe(llama_spec({"batch_size": 2, "max_length": 64}))
    lora = probe(llama_spec({"batch_size": 2, "max_length": 64, "lora_r": 4}))
    assert_ok(full)
    assert_ok(lora)
    for m in (full, lora):
        parts = m.memory_parts_bytes
        assert set(parts) <= {"model", "optimizer", "runtime", "step", "build"}
        assert sum(parts.values()) == m.peak_memory_bytes
        assert parts["runtime"] > 100 * 2**20 and parts["step"] > 0  # the process holds torch
    weights = tensor_bytes_of_model(TINY_LLAMA)
    assert full.memory_parts_bytes["model"] == weights
    # AdamW keeps two fp32 moments per trainable weight (and a 4-byte step count per tensor)
    assert full.memory_parts_bytes["optimizer"] == pytest.approx(2 * weights, rel=0.05)
    # LoRA adds small adapters and trains only them: the optimizer's state shrinks to theirs
    assert weights < lora.memory_parts_bytes["model"] < 1.2 * weights
    assert lora.memory_parts_bytes["optimizer"] < 0.2 * full.memory_parts_bytes["optimizer"]


@pytest.mark.integration
@pytest.mark.parametrize("config, lora_r", [(TINY_LLAMA, None), (TINY_LLAMA, 4), (TINY_GPT2, None)])
def test_trls_fused_loss_is_the_models_loss_computed_another_way(tmp_path: Path, config: dict, lora_r) -> None:
    """loss=fused (what `trl sft` trains with: TRL's fused LM head, no full logits) gives the same
    loss and gradients as the model's own loss over the full logits, on the same weights and batch."""
    import torch

    from trainfit.workloads import build_workload

    spec = load_spec(make_spec_file(tmp_path, model={"config": config}, params={"max_length": 16, "lora_r": lora_r}),
                     ["tune.command_template=python train.py"])
    results = {}
    for loss in ("model", "fused"):
        workload = build_workload(spec, dataclasses.replace(spec.params, loss=loss), torch.device("cpu"))
        value = workload.loss(workload.make_batch([5, 16, 3], 16).inputs)
        value.backward()
        results[loss] = value.item(), [p.grad for p in workload.model.parameters() if p.requires_grad]
    (model_loss, model_grads), (fused_loss, fused_grads) = results["model"], results["fused"]
    assert fused_loss == pytest.approx(model_loss, rel=1e-5)
    assert len(fused_grads) == len(model_grads) > 0
    assert all(torch.allclose(f, m, rtol=1e-3, atol=1e-6) for f, m in zip(fused_grads, model_grads))


def test_lora_on_an_architecture_peft_has_no_default_for_names_the_fix(tmp_path: Path) -> None:
    """peft knows default LoRA targets for some architectures only (not OLMo 2): the error names
    'all-linear' and the model's own linear layers, and 'all-linear' then trains."""
    import torch

    from trainfit.workloads import build_workload

    olmo2 = {**TINY_LLAMA, "model_type": "olmo2", "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    spec = load_spec(make_spec_file(tmp_path, model={"config": olmo2}, params={"max_length": 16, "lora_r": 4}))
    with pytest.raises(TrainfitError) as info:
        build_workload(spec, spec.params, torch.device("cpu"))
    assert "'all-linear'" in info.value.hint
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in info.value.hint
    workload = build_workload(spec, dataclasses.replace(spec.params, lora_target_modules="all-linear"),
                              torch.device("cpu"))
    trainable = {n.split(".")[-4] for n, p in workload.model.named_parameters() if p.requires_grad}
    assert trainable == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

@pytest.mark.parametrize("model_type, frozen", [("gpt_oss", True), ("mixtral", False)])
def test_lora_that_leaves_the_experts_frozen_says_how_to_adapt_them(tmp_path: Path, model_type: str,
                                                                     frozen: bool) -> None:
    """'all-linear' reaches a mixture of experts' stacked expert weights only where peft knows the
    architecture (Mixtral); on gpt-oss it adapts attention alone, and the note names the parameters
    that, set as lora_target_parameters, put adapters on the experts."""
    import torch

    from trainfit.workloads import build_workload

    moe = {**TINY_LLAMA, "model_type": model_type, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2}
    spec = load_spec(make_spec_file(tmp_path, model={"config": moe},
                                    params={"max_length": 16, "lora_r": 4, "lora_target_modules": "all-linear",
                                            "attention": "eager"}))
    notes = [n for n in build_workload(spec, spec.params, torch.device("cpu")).notes if "experts frozen" in n]
    assert len(notes) == int(frozen)
    if frozen:
        targets = notes[0].split("lora_target_parameters: [")[1].rstrip("]").split(", ")
        assert targets == ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
        fixed = dataclasses.replace(spec.params, lora_target_parameters=tuple(targets))
        workload = build_workload(spec, fixed, torch.device("cpu"))
        assert not [n for n in workload.notes if "experts frozen" in n]
        assert any(".experts." in n for n, p in workload.model.named_parameters() if p.requires_grad)


def test_a_config_the_architecture_rejects_is_a_clear_error(tmp_path: Path) -> None:
    """Phi-3's default pad_token_id (32000) is outside a small vocabulary: torch asserts deep in
    the model's constructor; the user gets that one line and what to check, not the traceback."""
    import torch

    from trainfit.workloads import build_workload

    phi3 = {**TINY_LLAMA, "model_type": "phi3"}
    spec = load_spec(make_spec_file(tmp_path, model={"config": phi3}, params={"max_length": 16}))
    with pytest.raises(TrainfitError, match="Padding_idx must be within num_embeddings") as info:
        build_workload(spec, spec.params, torch.device("cpu"))
    assert "pad_token_id=32000, eos_token_id=32000 outside vocab_size=256" in info.value.hint
    fixed = load_spec(spec.source, ["model.config.pad_token_id=0"])
    assert build_workload(fixed, fixed.params, torch.device("cpu")).vocab_size == TINY_LLAMA["vocab_size"]

@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_step_clips_gradients_as_the_trainers_do(precision: str) -> None:
    """max_grad_norm 1.0, the Trainer's and TRL's default: the optimizer sees gradients of total
    norm 1 when the loss's are ~2,000; under fp16 they are unscaled first (clipping the scaled
    gradients would leave them 65,536 times too small)."""
    import torch

    from trainfit.params import Params
    from trainfit.workloads.step import TrainStep
    from trainfit.workloads.base import Batch, Workload

    class Steep(Workload):
        def __init__(self) -> None:
            self.model, self.notes = torch.nn.Linear(4, 1), []

        def make_batch(self, lengths, pad_to):
            return Batch(inputs=torch.ones(len(lengths), 4), seq_lens=tuple(lengths), padded_len=pad_to)

        def loss(self, inputs):
            return 1000.0 * self.model(inputs).mean()

    workload = Steep()
    step = TrainStep(workload, Params(precision=precision), torch.device("cpu"))
    seen = []
    step.optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(
        float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in step.trainable])))))
    for _ in range(20):  # fp16: the scaler skips steps whose scaled gradients overflow, lowering its scale
        step.run([workload.make_batch([1, 1], 1)] * 2)
    assert seen and all(norm == pytest.approx(1.0, rel=1e-3) for norm in seen)

def test_loss_auto_computes_the_loss_as_the_training_command_does(tmp_path: Path) -> None:
    import torch

    from trainfit.workloads import build_workload

    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 16})
    trl = build_workload(load_spec(path), load_spec(path).params, torch.device("cpu"))  # no template: `trl sft`
    assert trl.loss_kind == "fused" and any("as the `trl sft` command computes it" in n for n in trl.notes)
    assert any("32,768 vocabulary columns wide" in n and "(256 here)" in n for n in trl.notes)
    own = load_spec(path, ["tune.command_template=python train.py"])
    workload = build_workload(own, own.params, torch.device("cpu"))
    assert workload.loss_kind == "model" and not any("loss" in n for n in workload.notes)


@pytest.mark.integration
def test_trls_fused_head_allocates_tiles_wider_than_a_small_vocabulary(tmp_path: Path) -> None:
    """What the note above says, against the installed trl: a batch's tile buffer is as wide as
    TRL's chunk (32,768 columns), not as the 256-word vocabulary."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    from trainfit.workloads import build_workload

    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 16}))
    workload = build_workload(spec, spec.params, torch.device("cpu"))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        workload.loss(workload.make_batch([5, 16, 3], 16).inputs).backward()
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert largest == 3 * 15 * _CHUNKED_LOGPROB_CHUNK_SIZE * 4  # 45 shifted positions x 32,768 fp32 columns


def test_without_trls_head_auto_falls_back_to_the_models_loss_and_says_so(tmp_path: Path, monkeypatch) -> None:
    import sys

    import torch

    from trainfit.errors import Unsupported
    from trainfit.workloads import build_workload

    monkeypatch.setitem(sys.modules, "trl.trainer.utils", None)  # as if this trl had no fused head
    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 16}))
    workload = build_workload(spec, spec.params, torch.device("cpu"))
    assert workload.loss_kind == "model"
    assert any("may use other memory than measured" in n for n in workload.notes)
    with pytest.raises(Unsupported, match="loss=fused needs TRL's fused LM head"):
        build_workload(spec, dataclasses.replace(spec.params, loss="fused"), torch.device("cpu"))


@pytest.mark.integration
@pytest.mark.slow
def test_gpt2_bf16(tmp_path: Path, texts_file) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_GPT2},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"batch_size": 2, "max_length": 64, "precision": "bf16"})
    assert_ok(probe(path))


def oom_spec(tmp_path: Path) -> Path:
    """16 x 2048 tokens over a 4096-word vocabulary under a 0.9 GiB cap of which torch's import
    takes ~0.4: the model's own loss would hold 0.5 GiB of fp32 logits alone."""
    model = {"config": {**TINY_LLAMA, "vocab_size": 4096, "max_position_embeddings": 2048}}
    return make_spec_file(tmp_path, model=model, params={"batch_size": 16, "max_length": 2048},
                          budget={"memory_gb": 0.9, "headroom_gb": 0.1}, name="oom.yaml")


def test_the_size_an_allocation_asked_for_is_read_from_either_allocators_message() -> None:
    from trainfit.probe.memory import memory_at_failure

    cpu = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
           "you tried to allocate 16368000 bytes. Error code 12 (Cannot allocate memory)")
    cuda = "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which"
    held, asked = memory_at_failure(cpu, cuda=False)
    assert asked == 16368000 and held > 0  # held: this process's allocated address space
    assert memory_at_failure(cuda, cuda=False)[1] == int(2.5 * 2**30)
    assert memory_at_failure("bad_alloc", cuda=False)[1] is None


@pytest.mark.integration
def test_real_oom_under_a_small_cpu_budget(tmp_path: Path) -> None:
    m = probe(oom_spec(tmp_path))
    assert m.status == "oom", m.message
    assert "can't allocate memory" in m.message or "out of memory" in m.message
    # the cap counts allocations, not touched pages: the message says how much was held and asked
    assert "GiB allocated" in m.message and "against a cap of 0.90 GiB" in m.message
    # what was allocated at the failure plus what was asked: the allocation failed, so past the cap
    assert m.oom_needed_bytes > 0.9 * m.memory_cap_bytes
    from trainfit.cli.render import measurement_report
    from trainfit.format import fmt_bytes

    assert table_row(measurement_report(m), "needs")[1].startswith(f"more than {fmt_bytes(m.oom_needed_bytes)} (")
    assert m.exit_code == 3 and not m.fits
    assert m.samples_per_second is None
    # the failed step is the part that did not fit; the model was built and is counted apart
    parts = m.memory_parts_bytes
    assert sum(parts.values()) == m.peak_memory_bytes
    assert parts["model"] > 0 and parts["step"] > parts["model"]
    assert m.full_logits_bytes is None  # `trl sft`'s loss (TRL's fused head) never builds them
    own_loss = probe(oom_spec(tmp_path), "tune.command_template=python train.py")  # the model's own loss
    assert own_loss.status == "oom", own_loss.message
    assert own_loss.full_logits_bytes == 16 * 2048 * 4096 * 4


@pytest.mark.integration
def test_factory_with_custom_knob(tmp_path: Path) -> None:
    def spec(mul: int) -> Path:
        return make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:scaled"},
                              params={"max_length": 16, "batch_size": 2, "width_mul": mul}, name=f"f{mul}.yaml")

    small, big = probe(spec(1)), probe(spec(4))
    assert_ok(small)
    assert_ok(big)
    assert small.config["width_mul"] == 1 and big.config["width_mul"] == 4
    assert big.model_flops_per_step > 3 * small.model_flops_per_step
    assert any("no dataset" in n for n in small.notes)


@pytest.mark.integration
@pytest.mark.parametrize("factory, status, text", [
    ("crash", "error", "SIGABRT"),
    ("broken", "error", "the factory could not read its config"),
    ("bare_memory_error", "oom", "out of memory: MemoryError"),
])
def test_a_crashing_child_is_a_status_not_a_crash(tmp_path: Path, factory: str, status: str, text: str) -> None:
    path = make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:{factory}"},
                          params={"max_length": 8})
    m = probe(path)
    assert (m.status, m.exit_code) == (status, {"error": 4, "oom": 3}[status])
    assert text in m.message


@pytest.mark.integration
def test_the_worker_runs_in_the_environment_the_runner_prepares(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:environment"},
                          params={"max_length": 8})
    # pyarrow's allocator would reserve 1 GiB of address space that a CPU cap counts (see runner).
    assert "TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 ARROW_DEFAULT_MEMORY_POOL=system" in probe(path).message


@pytest.mark.integration
def test_a_hanging_child_is_killed(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:hang"},
                          params={"max_length": 8}, probe={"timeout_s": 6})
    start = time.monotonic()
    m = probe(path)
    assert m.status == "timeout" and m.exit_code == 5
    assert time.monotonic() - start < 30


@pytest.mark.integration
@pytest.mark.slow
def test_unsupported_knobs_are_clear_errors(llama_spec) -> None:
    m = probe(llama_spec({"attention": "flash_attention_2"}))
    assert m.status == "error" and "needs a CUDA GPU" in m.message
    m = probe(llama_spec({"optimizer": "adamw_8bit"}))
    assert m.status == "error" and "adamw_8bit" in m.message
    m = probe(llama_spec({"tf32": True, "optimizer": "adamw_fused"}))
    assert_ok(m)
    assert "tf32 has no effect on CPU" in m.notes


def test_ligers_loss_is_refused_on_a_cpu_with_the_way_on(llama_spec) -> None:
    """Liger-Kernel's kernels are Triton's: on a CPU loss: liger is a knob value this device cannot
    run (the search skips its configs), not a crash mid-probe."""
    import torch

    from trainfit.errors import Unsupported
    from trainfit.workloads import build_workload

    s = load_spec(llama_spec({"loss": "liger"}), ["tune.command_template=python train.py"])
    with pytest.raises(Unsupported, match="need a CUDA GPU") as info:
        build_workload(s, s.params, torch.device("cpu"))
    assert (info.value.knob, info.value.value) == ("loss", "liger") and "loss: model" in info.value.hint


def test_activation_offloading_is_refused_on_a_cpu_with_the_way_on() -> None:
    """TRL's activation offloading moves a GPU's activations to CPU memory: on a CPU it is a knob value
    this device cannot run (the search skips its configs), with checkpointing named instead."""
    import torch

    from trainfit.errors import Unsupported
    from trainfit.params import Params
    from trainfit.workloads.step import check_support

    with pytest.raises(Unsupported, match="needs a CUDA GPU") as info:
        check_support(Params(activation_offloading=True), torch.device("cpu"))
    assert (info.value.knob, info.value.value) == ("activation_offloading", True)
    assert "gradient_checkpointing" in info.value.hint
    assert check_support(Params(), torch.device("cpu")) == []


@pytest.mark.integration
@pytest.mark.slow
def test_cli_probe_writes_json_and_exits_by_status(llama_spec, tmp_path: Path, capsys) -> None:
    out = tmp_path / "new" / "folder" / "out.json"  # created for it
    assert main(["probe", str(llama_spec()), "--set", "batch_size=3", "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())
    assert data["status"] == "ok" and data["config"]["batch_size"] == 3
    printed = capsys.readouterr().out
    assert "samples/s" in printed and "peak memory" in printed
    assert "data: 200 samples, lengths" in printed  # and how they were counted
    parts = table_row(printed, "of which")[1]  # the memory parts, in the row after peak memory
    assert parts.startswith("model ") and "optimizer state" in parts and "worst-case step" in parts
    # an output path that cannot be written is refused before the probe, not after it
    assert main(["probe", str(llama_spec()), "--json", str(tmp_path), "--quiet"]) == 2
    assert "cannot write --json" in capsys.readouterr().err
    assert main(["probe", str(oom_spec(tmp_path)), "--quiet"]) == 3


@pytest.mark.integration
def test_cpu_peak_memory_is_the_childs_own_not_the_parents(tmp_path: Path) -> None:
    """Linux carries ru_maxrss over fork+exec; the probe must not report its parent's size."""
    ballast = bytearray(1536 * 2**20)  # the parent (a tuner, say) holds 1.5 GiB, touched
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    path = make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:scaled"},
                          params={"max_length": 8, "width_mul": 1})
    m = probe(path)
    assert m.status == "ok", m.message
    assert 50 * 2**20 < m.peak_memory_bytes < 1024 * 2**20
    del ballast


@pytest.mark.integration
def test_a_local_checkpoint_folder_is_loaded_without_downloads(tmp_path: Path, texts_file) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path / "my-model"
    cfg = dict(TINY_LLAMA)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)).save_pretrained(folder)
    path = make_spec_file(tmp_path, model={"path": str(folder)},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"batch_size": 2, "max_length": 64, "lora_r": 4, "precision": "bf16"})
    m = probe(path)
    assert_ok(m)
    assert "LoRA: frozen base weights held in bf16, adapters in fp32" in m.notes


def scaled_spec(tmp_path: Path, **budget: float) -> Path:
    """A factory model whose activations dominate its memory: 1024 positions x 128 wide per sample."""
    return make_spec_file(tmp_path, model={"factory": f"{TESTS / 'factories.py'}:scaled"},
                          params={"max_length": 1024, "batch_size": 256, "width_mul": 8, "padding": "max_length"},
                          budget=budget or None, name="scaled.yaml")


@pytest.mark.integration
@pytest.mark.slow
def test_a_session_reuses_the_model_for_larger_batches_of_the_same_config(tmp_path: Path) -> None:
    spec = load_spec(scaled_spec(tmp_path))

    def params(**changes: object):
        return dataclasses.replace(spec.params, **changes)

    with ProbeSession() as session:
        small = run_probe(spec, params(batch_size=8, gradient_accumulation_steps=2), session=session)
        big = run_probe(spec, session=session)
        smaller = run_probe(spec, params(batch_size=8), session=session)
        other = run_probe(spec, params(batch_size=16, extra={"width_mul": 4}), session=session)
    fresh_big = run_probe(spec)
    for m in (small, big, smaller, other, fresh_big):
        assert_ok(m)
    assert not small.model_reused and small.phases_s["build"] > 0 and small.samples_per_step == 16
    assert big.model_reused and big.phases_s["start"] == big.phases_s["build"] == 0
    # The peak restarts per probe and counts the same as a fresh process's (256 x 1024 x 128
    # activations: ~128 MiB a copy, so a probe that missed them would be far off).
    assert big.peak_memory_bytes == pytest.approx(fresh_big.peak_memory_bytes, rel=0.1)
    assert big.peak_memory_bytes > small.peak_memory_bytes + 200 * 2**20
    # the reused model's parts are the ones measured when it was built; the batch grows the step
    assert big.memory_parts_bytes["model"] == small.memory_parts_bytes["model"] > 0
    assert big.memory_parts_bytes["optimizer"] == small.memory_parts_bytes["optimizer"] > 0
    assert big.memory_parts_bytes["step"] > small.memory_parts_bytes["step"] + 200 * 2**20
    assert not smaller.model_reused  # smaller batches after larger ones get a fresh worker
    assert not other.model_reused  # another width is another model


@pytest.mark.integration
def test_after_an_oom_the_next_probe_gets_a_fresh_worker(tmp_path: Path) -> None:
    spec = load_spec(scaled_spec(tmp_path, memory_gb=0.9, headroom_gb=0.1))
    with ProbeSession() as session:
        ok = run_probe(spec, dataclasses.replace(spec.params, batch_size=4), session=session)
        oom = run_probe(spec, dataclasses.replace(spec.params, batch_size=4096), session=session)
        after = run_probe(spec, dataclasses.replace(spec.params, batch_size=4), session=session)
    assert ok.status == "ok" and oom.status == "oom", oom.message
    assert after.status == "ok" and not after.model_reused


def test_a_worker_is_reused_only_for_batches_padded_no_shorter() -> None:
    from trainfit.params import memory_grows

    assert memory_grows({"batch_size": 2, "max_length": 64}, {"batch_size": 4, "max_length": 64})
    assert not memory_grows({"batch_size": 4}, {"batch_size": 2})
    assert not memory_grows({"max_length": None}, {"max_length": 64})  # the longest sample, then 64
    # Rounded to 64 after 8, every padded length is at least what it was; to 8 after 64, or 48 after 64, not.
    assert memory_grows({"pad_to_multiple_of": 8}, {"pad_to_multiple_of": 64})
    assert memory_grows({}, {"pad_to_multiple_of": 8})
    assert not memory_grows({"pad_to_multiple_of": 64}, {"pad_to_multiple_of": 8})
    assert not memory_grows({"pad_to_multiple_of": 64}, {"pad_to_multiple_of": 48})
    assert not memory_grows({"pad_to_multiple_of": 8}, {"pad_to_multiple_of": None})
    # A packed batch holds full rows: unpacked batches after it are no larger.
    assert memory_grows({"packing": False}, {"packing": True}) and not memory_grows({"packing": True}, {})
    # Checkpointing keeps fewer activations: turned off, a step needs more; turned on, less.
    assert memory_grows({"gradient_checkpointing": True}, {"gradient_checkpointing": False})
    assert not memory_grows({"gradient_checkpointing": False}, {"gradient_checkpointing": True})


def test_a_worker_told_not_to_reuse_its_model_builds_a_new_one_in_the_same_process(tmp_path: Path) -> None:
    """The runner keeps a CUDA worker's process for another model (``reuse_model: false`` in the job):
    here a real worker on the CPU, three jobs of one config: built, reused, then built again, in the
    process that ran the first (no start time paid)."""
    import os
    import subprocess

    from trainfit.probe.runner import worker_command

    spec = load_spec(scaled_spec(tmp_path))
    params = dataclasses.replace(spec.params, batch_size=8, max_length=64)
    request = tmp_path / "request.json"
    request.write_text(build_request(spec, params, None, "cpu").to_json())
    jobs = [{"request": str(request), "result": str(tmp_path / f"result{n}.json"), "reuse_model": reuse}
            for n, reuse in enumerate((True, True, False))]
    events_r, events_w = os.pipe()
    with (tmp_path / "worker.log").open("w") as log:
        proc = subprocess.Popen(worker_command(time.time(), os.getpid(), True, events_w), stdin=subprocess.PIPE,
                                stdout=log, stderr=subprocess.STDOUT, pass_fds=(events_w,), text=True)
        os.close(events_w)
        proc.communicate("".join(json.dumps(job) + "\n" for job in jobs), timeout=300)
    os.close(events_r)
    assert proc.returncode == 0, (tmp_path / "worker.log").read_text()[-2000:]
    built, reused, rebuilt = (json.loads(Path(job["result"]).read_text()) for job in jobs)
    assert built["status"] == reused["status"] == rebuilt["status"] == "ok", rebuilt.get("message")
    assert not built["model_reused"] and reused["model_reused"] and not rebuilt["model_reused"]
    assert rebuilt["phases_s"]["start"] == 0 and rebuilt["phases_s"]["build"] > 0


def test_only_a_cuda_worker_builds_another_model_in_its_process(tmp_path: Path) -> None:
    from trainfit.probe.runner import process_outlives_model

    hf = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64}))
    factory = load_spec(scaled_spec(tmp_path))

    def request(device: str = "cuda", spec=hf, **changes: object):
        return build_request(spec, dataclasses.replace(spec.params, **changes), None, device)

    last = request()
    assert process_outlives_model(last, request(lora_r=8))
    # A CPU's peak RSS never falls back; Liger patches the process; a compiled model is never kept;
    # a factory may patch anything; a multi-process probe's ranks would share the GPU with this process.
    assert not process_outlives_model(last, request("cpu", lora_r=8))
    assert not process_outlives_model(request(loss="liger"), request())
    assert not process_outlives_model(last, request(compile="default"))
    assert not process_outlives_model(request(compile="default"), last)
    assert not process_outlives_model(request(spec=factory), request())
    assert not process_outlives_model(last, request(nproc_per_node=2, parallel="ddp"))


def test_model_key_ignores_only_the_batch_shape(tmp_path: Path) -> None:
    spec = load_spec(scaled_spec(tmp_path))

    def key(**changes: object) -> str | None:
        return build_request(spec, dataclasses.replace(spec.params, **changes), None, "cpu").model_key

    base = key()
    assert base is not None
    assert key(batch_size=2, gradient_accumulation_steps=4, max_length=64, padding="longest") == base
    assert key(extra={"width_mul": 2}) != base and key(lora_r=8) != base
    assert key(compile="default") is None  # a compiled model meeting new shapes is not a fresh run
    no_reuse = load_spec(scaled_spec(tmp_path), ["probe.reuse_model=false"])
    assert build_request(no_reuse, no_reuse.params, None, "cpu").model_key is None


def test_a_hugging_face_models_key_leaves_out_the_checkpointing_its_worker_switches(tmp_path: Path) -> None:
    """A Hugging Face model is switched to the other gradient checkpointing in place; a factory's
    model may apply it itself, so another value is another model."""
    hf = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64}))
    factory = load_spec(scaled_spec(tmp_path))

    def key(spec, **changes: object) -> str | None:
        return build_request(spec, dataclasses.replace(spec.params, **changes), None, "cuda").model_key

    assert key(hf, gradient_checkpointing=True) == key(hf, gradient_checkpointing=False) is not None
    assert key(hf, gradient_checkpointing=True, lora_r=8) != key(hf, gradient_checkpointing=True)
    assert key(factory, gradient_checkpointing=True) != key(factory, gradient_checkpointing=False)


@pytest.mark.parametrize("lora_r", [None, 4])
def test_a_switched_model_recomputes_what_a_model_built_with_checkpointing_does(lora_r: int | None) -> None:
    """Checkpointing switched on a built model (and off again) trains as a model built with it
    (without it): the same loss and gradients, and each layer's forward run again in the backward."""
    import torch

    from trainfit.params import Params
    from trainfit.spec import ModelSpec
    from trainfit.workloads.hf import HFCausalLM
    from trainfit.workloads.knobs import switch_checkpointing

    def built(checkpointing: bool) -> tuple[object, list[int]]:
        params = Params(gradient_checkpointing=checkpointing, lora_r=lora_r, max_length=32, loss="model")
        workload = HFCausalLM(ModelSpec(config=TINY_LLAMA), params, "cpu", seed=0)
        calls = [0]
        layer = workload.model.get_base_model() if lora_r else workload.model
        # a pre-hook: the backward's recompute stops once it holds what the backward needs, maybe
        # inside a layer's last call, before a hook that runs after it
        layer.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        return workload, calls

    def step(workload, calls: list[int]) -> tuple[int, float, list[torch.Tensor]]:
        calls[0] = 0
        ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
        loss = workload.loss({"input_ids": ids, "labels": ids})
        loss.backward()
        grads = [p.grad.clone() for p in workload.model.parameters() if p.grad is not None]
        workload.model.zero_grad()
        return calls[0], loss.item(), grads

    on_calls, on_loss, on_grads = step(*built(True))
    off_calls, off_loss, off_grads = step(*built(False))
    assert (on_calls, off_calls) == (2, 1)
    switched, calls = built(False)
    switch_checkpointing(switched.model, True)
    now_calls, now_loss, now_grads = step(switched, calls)
    assert now_calls == 2 and now_loss == pytest.approx(on_loss)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(now_grads, on_grads, strict=True))
    switch_checkpointing(switched.model, False)
    assert step(switched, calls)[0] == 1


@pytest.mark.integration
def test_a_cpu_session_keeps_its_model_when_checkpointing_is_turned_off(llama_spec) -> None:
    """Turned off, checkpointing needs no less memory, so a CPU worker switches its model in place;
    turned on, the peak would hide under the last one's, so it builds anew."""
    spec = load_spec(llama_spec({"max_length": 64}))
    on, off = (dataclasses.replace(spec.params, gradient_checkpointing=v) for v in (True, False))
    with ProbeSession() as session:
        first = run_probe(spec, on, session=session)
        switched = run_probe(spec, off, session=session)
        again = run_probe(spec, on, session=session)
    for m in (first, switched, again):
        assert_ok(m)
    assert not first.model_reused and switched.model_reused and not again.model_reused
    assert switched.phases_s["build"] == 0 and switched.config["gradient_checkpointing"] is False


def test_a_model_that_is_not_a_causal_lm_is_told_to_use_a_factory(tmp_path: Path) -> None:
    import torch

    from trainfit.errors import TrainfitError
    from trainfit.workloads import build_workload

    t5 = {"model_type": "t5", "d_model": 16, "d_ff": 32, "num_layers": 1, "num_heads": 2, "vocab_size": 64}
    spec = load_spec(make_spec_file(tmp_path, model={"config": t5}, params={"max_length": 8}))
    with pytest.raises(TrainfitError, match="'t5' is not a causal language model") as info:
        build_workload(spec, spec.params, torch.device("cpu"))
    assert "model.factory" in str(info.value) and "LlamaConfig" not in str(info.value)  # not the list of every LM


def test_a_probe_request_crosses_into_the_worker_unchanged(tmp_path: Path) -> None:
    """The request is a frozen, versioned record: what the worker reads back is what the parent built."""
    from trainfit.probe.request import ProbeRequest

    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                                    params={"max_length": 16, "lora_r": 4, "lora_target_modules": ["q_proj"]}))
    request = build_request(spec, spec.params, None, "cpu")
    again = ProbeRequest.from_json(request.to_json())
    assert again == request and again.model_key == request.model_key is not None
    assert again.params.lora_target_modules == ("q_proj",) and again.worst_lengths == (16,)
    with pytest.raises(ValueError, match="probe request schema 0"):
        ProbeRequest.from_json(json.dumps({**request.to_dict(), "schema_version": 0}))


@pytest.mark.integration
def test_a_probe_cut_before_any_shape_repeats_takes_its_spread_from_its_cost_fit(llama_spec) -> None:
    """Four steps over the epoch's timed shapes (and the memory phase's worst case), each of another
    length: the spread of the steps would call their lengths' own costs noise (+-100% and more); the
    residuals of the cost curve through the five stand for it (Student's t on 2 degrees of freedom),
    and the plan does not add the fit's miss to it a second time."""
    from trainfit.plan.inputs import probe_spread
    from trainfit.probe.estimate import fit_noise_ci95, shapes_step_cost

    m = probe(llama_spec(probe={"max_steps": 4, "min_steps": 1}))
    assert m.status == "ok", m.message
    lengths = [s["padded_length"] for s in m.shape_times]
    assert all(s["steps"] == 1 for s in m.shape_times) and len(set(lengths)) == 5, m.shape_times
    cost = shapes_step_cost(m.shape_times)
    assert cost is not None and m.step_time_ci95_basis == "fit"
    assert m.step_time_ci95_rel == pytest.approx(fit_noise_ci95(cost, lengths, [s["seconds"] for s in m.shape_times]),
                                                 rel=0.01)  # the shapes' seconds are kept rounded to 1 us
    assert probe_spread(m) == m.step_time_ci95_rel  # no timing decides this test: which spread is larger is the machine's
    assert fit_noise_ci95(cost, lengths[:4], [s["seconds"] for s in m.shape_times][:4]) is None  # 1 dof: too few
