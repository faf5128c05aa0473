"""One training step with every speed/memory knob applied, in one place and a fixed order.

Order (each later step wraps the earlier ones, as in torchtitan):
1. math mode: TF32 for matmuls and cuDNN (CUDA only);
2. the workload builds the model: attention kernel and weight dtype, checkpointing, LoRA;
3. ``torch.compile`` wraps the finished model (so it sees checkpointing and adapters);
4. the optimizer is built over trainable parameters only;
5. each micro-batch runs under autocast (bf16/fp16), its forward and backward inside TRL's
   activation offloading when asked; fp16 scales the loss;
6. gradients are clipped to a total norm of 1.0 before the optimizer step, as the Hugging Face
   Trainer and TRL do by default (``max_grad_norm``), since the commands trainfit writes train so.

The probe and the training loop both use :class:`TrainStep`, so what is measured is what runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
from collections.abc import Sequence
from typing import Any

from trainfit.devices import cpu_flags
from trainfit.errors import TrainfitError, Unsupported
from trainfit.params import Params
from trainfit.spec.training import MAX_GRAD_NORM, Schedule
from trainfit.workloads.base import Batch, Workload


def check_support(params: Params, device: Any) -> list[str]:
    """Notes on knobs that fall back (recorded in the measurement); raises for knobs that cannot run."""
    import torch

    notes: list[str] = []
    cuda = device.type == "cuda"
    if params.precision == "bf16":
        if cuda and not torch.cuda.is_bf16_supported():
            raise Unsupported("precision=bf16 but this GPU has no bf16 support", "use precision: fp16 or fp32",
                              knob="precision", value="bf16")
        if not cuda and not ({"avx512_bf16", "amx_bf16"} & cpu_flags()):
            notes.append("bf16 on a CPU without native bf16 instructions runs emulated (slow)")
    if params.precision == "fp16" and not cuda:
        notes.append("fp16 autocast on CPU: supported by torch, but CPUs rarely run it faster than fp32")
    if params.attention == "flash_attention_2":
        _needs_cuda_and(cuda, "flash_attn", "flash-attn", knob="attention", value="flash_attention_2",
                        instead="use attention: sdpa", install="pip install flash-attn --no-build-isolation")
    if params.optimizer == "adamw_8bit":
        _needs_cuda_and(cuda, "bitsandbytes", "bitsandbytes", knob="optimizer", value="adamw_8bit",
                        instead="use adamw or adamw_fused", install="pip install bitsandbytes")
    if params.quantization != "none":  # bitsandbytes' 4- and 8-bit linear layers run on CUDA
        _needs_cuda_and(cuda, "bitsandbytes", "bitsandbytes", knob="quantization", value=params.quantization,
                        instead="use quantization: none (LoRA over a bf16 or fp16 base)", install="pip install bitsandbytes")
    if params.activation_offloading:  # TRL's: it moves a GPU's activations to CPU memory and back
        _needs_cuda_and(cuda, "trl", "trl", knob="activation_offloading", value=True,
                        instead="use gradient_checkpointing to save activation memory", install="pip install trl")
    if params.fsdp_cpu_offload and params.parallel == "fsdp" and not cuda:
        raise Unsupported("fsdp_cpu_offload=true moves a GPU's shards to host memory: on a CPU there is nothing "
                          "to offload", "use fsdp_cpu_offload: false on this device", knob="fsdp_cpu_offload",
                          value=True)
    if params.tf32 and not cuda:
        notes.append("tf32 has no effect on CPU")
    notes += _idle_loader_knobs(params)
    if params.compile != "off" and not cuda:
        if shutil.which("cc") is None and shutil.which("g++") is None:
            raise Unsupported("compile on CPU needs a C++ compiler (inductor)", "install gcc, or use compile: off",
                              knob="compile", value=params.compile)
        if params.compile == "reduce-overhead":
            notes.append("compile=reduce-overhead uses CUDA graphs; on CPU it compiles like 'default'")
    if params.compile != "off" and params.padding == "longest":
        notes.append("compile with padding=longest: new batch shapes trigger recompiles; "
                     "padding=max_length gives one shape, pad_to_multiple_of far fewer")
    return notes


def _idle_loader_knobs(params: Params) -> list[str]:
    """A note on the loader knobs that apply to worker processes (``prefetch_factor``,
    ``persistent_workers``) set at ``num_workers: 0``, where the batches are made in the training
    process: torch's loader and the written command leave them out, so they change nothing."""
    idle = [knob for knob, on in (("prefetch_factor", params.prefetch_factor is not None),
                                  ("persistent_workers", params.persistent_workers)) if on]
    if params.num_workers > 0 or not idle:
        return []
    # "ignored", not "no effect": an ablation leaves out of "all that helped" a row noted "no effect"
    return [f"{' and '.join(idle)} {'is' if len(idle) == 1 else 'are'} ignored at num_workers: 0 (they apply to "
            "loader worker processes; here the batches are made in the training process): set num_workers above 0 "
            "for them to count"]


def _needs_cuda_and(cuda: bool, module: str, package: str, *, knob: str, value: Any, instead: str,
                    install: str) -> None:
    """Refuse ``knob=value`` (:class:`Unsupported`, so a search skips it) off a CUDA GPU, saying
    what to use ``instead``, or where ``module`` (of the ``package``) is missing, saying how to
    ``install`` it."""
    shown = f"{knob}={str(value).lower() if isinstance(value, bool) else value}"
    if not cuda:
        raise Unsupported(f"{shown} needs a CUDA GPU", f"{instead} on this device", knob=knob, value=value)
    if importlib.util.find_spec(module) is None:
        raise Unsupported(f"{shown} needs the {package} package", f"{install}, or {instead}", knob=knob, value=value)


def _optimizer(params: Params, trainable: list[Any], schedule: Schedule | None = None) -> Any:
    import torch

    lr = schedule.learning_rate if schedule else 1e-5  # the learning rate does not change a step's cost
    decay: dict[str, Any] = {"weight_decay": schedule.weight_decay} if schedule else {}  # else: their defaults
    if params.optimizer == "adamw":
        return torch.optim.AdamW(trainable, lr=lr, foreach=True, **decay)
    if params.optimizer == "adamw_fused":
        return torch.optim.AdamW(trainable, lr=lr, fused=True, **decay)
    import bitsandbytes as bnb  # checked by check_support

    return bnb.optim.AdamW8bit(trainable, lr=lr, **decay)


def _offloading(params: Params, model: Any) -> Any:
    """The context a micro-batch's forward and backward run in: TRL's activation offloading on
    ``model`` (the very one ``trl sft --activation_offloading true`` trains in; checked by
    :func:`check_support`), entered again at every micro-batch; else one that does nothing."""
    if not params.activation_offloading:
        return contextlib.nullcontext()
    from trl.models.activation_offloading import get_act_offloading_ctx_manager

    # A model with no output head TRL knows (a factory's) is offloaded whole: no warning, which TRL
    # would log through accelerate's logger, unset up in a probe.
    return get_act_offloading_ctx_manager(model=model, warn_if_no_head=False)


def _gradient_sync(model: Any, sync: bool) -> Any:
    """The context a micro-batch's backward runs in: under DDP or FSDP2, the gradients synced across
    the ranks only at the step's last micro-batch, as accelerate's ``no_sync`` does for the trainers
    (FSDP2 then holds the unsharded gradients between micro-batches, as the real run does)."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2's fully_shard
        model.set_requires_gradient_sync(sync)
    elif not sync and hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    return contextlib.nullcontext()


class TrainStep:
    """Runs optimizer steps of ``gradient_accumulation_steps`` micro-batches each. ``schedule``:
    the learning rate, its schedule, weight decay and clipping of a real run (None: a probe's,
    whose figures do not depend on them)."""

    def __init__(self, workload: Workload, params: Params, device: Any, schedule: Schedule | None = None) -> None:
        import torch

        self.workload, self.params, self.device = workload, params, device
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = params.tf32
            torch.backends.cudnn.allow_tf32 = params.tf32
            torch.backends.cudnn.benchmark = True
        if params.compile != "off":
            mode = None if params.compile == "default" else params.compile
            workload.model = torch.compile(workload.model, mode=mode)
        trainable = [p for p in workload.model.parameters() if p.requires_grad]
        if not trainable:
            raise TrainfitError("the model has no trainable parameters",
                                "check lora_target_modules, or that the factory leaves parameters trainable")
        self.trainable = trainable
        self.optimizer = _optimizer(params, trainable, schedule)
        self.max_grad_norm = schedule.max_grad_norm if schedule else MAX_GRAD_NORM
        self.scheduler = (torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule.factor)
                          if schedule is not None else None)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.precision)
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
        self.scaler = torch.amp.GradScaler(device.type) if params.precision == "fp16" else None
        self.offloading = _offloading(params, workload.model)
        self.sync_gradients = True
        """False: no micro-batch syncs its gradients across the ranks (the probe's communication share)."""
        self.skipped_steps = 0
        """fp16: the optimizer steps whose update the loss scaler skipped (their gradients overflowed)."""
        self.last_skipped = False
        self.grad_norm: Any = None
        """The last step's total gradient norm before clipping (a device tensor: :meth:`figures` reads it)."""

    def run(self, micro_batches: Sequence[Batch]) -> float:
        """One optimizer step over ``micro_batches`` (at least one); returns the mean loss (a host sync)."""
        return self.run_inputs([batch.inputs for batch in micro_batches])

    def run_inputs(self, micro_inputs: Sequence[Any]) -> float:
        """:meth:`run` over each micro-batch's inputs (what the workload's ``loss`` takes)."""
        n = len(micro_inputs)
        total = None
        for i, inputs in enumerate(micro_inputs):
            with _gradient_sync(self.workload.model, self.sync_gradients and i == n - 1), \
                    self.offloading:  # as TRL's training_step
                with self.autocast():
                    loss = self.workload.loss(inputs) / n
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        assert total is not None  # at least one micro-batch
        import torch

        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        self.grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.max_grad_norm)  # read when logged
        if self.scaler is not None:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.last_skipped = self.scaler.get_scale() < scale  # it lowers its scale exactly when it skips
            self.skipped_steps += self.last_skipped
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(total)  # one host sync per step, as a training loop that logs its loss has

    def figures(self) -> dict[str, float]:
        """The last step's gradient norm and the learning rate of the next, as the Hugging Face
        trainer logs them beside the loss (``grad_norm``, ``learning_rate``); a host sync."""
        out = {} if self.grad_norm is None else {"grad_norm": round(float(self.grad_norm), 6)}
        return {**out, "learning_rate": float(self.optimizer.param_groups[0]["lr"])}

    def evaluate(self, inputs: Any) -> float:
        """The loss of one evaluation batch: forward only, no gradients, the model in eval mode
        (dropout off), under the same autocast as training; the model is put back in train mode."""
        import torch

        model = self.workload.model
        model.eval()
        try:
            with torch.no_grad(), self.autocast():
                return float(self.workload.loss(inputs))
        finally:
            model.train()
