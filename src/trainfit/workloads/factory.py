"""Custom models through a user factory (``package.module:function`` or ``file.py:function``).

The factory is called as ``factory(params, device)`` and returns a :class:`CustomWorkload`::

    def make_workload(params: trainfit.Params, device) -> trainfit.CustomWorkload:
        model = MyTTS(ddpm_batch_mul=params.extra.get("ddpm_batch_mul", 4)).to(device)
        return trainfit.CustomWorkload(
            model=model,
            make_batch=lambda lengths, pad_to: ...,   # inputs on `device`
            loss=lambda model, inputs: model(**inputs),
            collate=lambda rows: ...,                 # optional: real rows -> inputs, for `trainfit train`
        )

trainfit applies precision, compile, tf32, the optimizer, batch size, accumulation and padding.
Gradient checkpointing uses the model's own ``gradient_checkpointing_enable`` when it has one,
LoRA uses peft on ``lora_target_modules``; a factory that applies a knob itself lists it in
``handles``. A knob that neither can honour is an error, never silently ignored.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.flops import StepFlops
from trainfit.params import Params
from trainfit.workloads.base import Batch, Workload
from trainfit.workloads.knobs import apply_knobs


@dataclass
class CustomWorkload:
    """What a factory returns."""

    model: Any
    """The ``torch.nn.Module`` to train, already on the device."""
    make_batch: Callable[[Sequence[int], int], Any]
    """``(lengths, pad_to) -> inputs``: a batch of samples with these real lengths padded to ``pad_to``."""
    loss: Callable[[Any, Any], Any]
    """``(model, inputs) -> scalar loss``; ``model`` may be the compiled/LoRA-wrapped module."""
    flops_per_sample: Callable[[int], float] | None = None
    """Model FLOPs of forward+backward for one sample of a given length (enables MFU)."""
    max_positions: int | None = None
    """Longest length the model accepts, if any."""
    handles: Collection[str] = ()
    """Knobs the factory applied itself: any of gradient_checkpointing, lora_r, attention."""
    collate: Callable[[list[dict[str, Any]]], Any] | None = None
    """``(rows) -> inputs``: real samples (rows of the spec's ``data``, as read) made into the
    inputs ``loss`` takes, padded as ``params.padding`` says; what ``trainfit train`` trains on,
    and what a probe's timed steps load through a ``DataLoader`` (``probe.data``). It runs in the
    loader's worker processes when ``num_workers`` > 0, where CUDA cannot be used: return CPU
    tensors (trainfit moves them to the device; a probe whose collate returns device tensors runs
    on synthetic inputs, saying why). None: the model can be probed and tuned, not trained by trainfit."""


def load_factory(target: str) -> Callable[..., CustomWorkload]:
    """Import ``module:function`` or ``path/file.py:function``."""
    module_name, _, func_name = target.rpartition(":")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            spec = importlib.util.spec_from_file_location(f"trainfit_factory_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")
            module = importlib.import_module(module_name)
    except ImportError as err:
        raise TrainfitError(f"cannot import factory module {module_name!r}: {err}",
                            "check model.factory and that the module is importable from here") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise TrainfitError(f"{module_name} has no function {func_name!r}",
                            f"define def {func_name}(params, device) -> trainfit.CustomWorkload")
    return func


class FactoryWorkload(Workload):
    name = "factory"

    def __init__(self, target: str, params: Params, device: Any) -> None:
        self.notes = []
        self.device = device
        made = load_factory(target)(params, device)
        if not isinstance(made, CustomWorkload):
            raise TrainfitError(f"factory {target} returned {type(made).__name__}, not trainfit.CustomWorkload",
                                "return trainfit.CustomWorkload(model=..., make_batch=..., loss=...)")
        self.custom = made
        self.max_positions = made.max_positions
        handles = set(made.handles)
        model = made.model
        if params.attention != "sdpa" and "attention" not in handles:
            raise TrainfitError(f"attention={params.attention} cannot be applied to a custom model by trainfit",
                                "apply it in the factory and add 'attention' to handles, or keep sdpa")
        if params.lora_r is not None and "lora_r" not in handles and not (params.lora_target_modules
                                                                        or params.lora_target_parameters):
            raise TrainfitError("lora_r is set for a custom model but lora_target_modules is not",
                                "name the modules to adapt, or apply LoRA in the factory and add 'lora_r' "
                                "to handles")
        model = apply_knobs(model, params, handles=handles)
        self.model = model
        self.model.train()

    def make_batch(self, lengths: Sequence[int], pad_to: int) -> Batch:
        inputs = self.custom.make_batch(list(lengths), pad_to)
        return Batch(inputs=inputs, seq_lens=tuple(int(x) for x in lengths), padded_len=pad_to)

    @property
    def collates_rows(self) -> bool:
        return self.custom.collate is not None

    def collate_rows(self, rows: Sequence[Any], pad_to: int, packed: bool) -> Any:
        """The factory's own ``collate`` of the rows (it pads as ``params.padding`` says)."""
        assert self.custom.collate is not None, "collates_rows is checked first"
        return self.custom.collate(list(rows))

    def loss(self, inputs: Any) -> Any:
        return self.custom.loss(self.model, inputs)

    def flops(self, seq_lens: Sequence[int], recompute: bool) -> StepFlops | None:
        if self.custom.flops_per_sample is None:
            return None
        total = float(sum(self.custom.flops_per_sample(n) for n in seq_lens))
        return StepFlops(model=total, hardware=total)
