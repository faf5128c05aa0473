"""The knobs a workload applies to a built model (workloads/knobs.py), the same for Hugging Face
and custom models: gradient checkpointing, then LoRA, unless the factory handles them itself."""

from __future__ import annotations

import pytest
import torch

from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.workloads.knobs import apply_knobs


class Tiny(torch.nn.Module):
    """A custom model whose checkpointing switch takes no arguments (as a hand-written one may)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 2)
        self.checkpointing = 0

    def gradient_checkpointing_enable(self) -> None:
        self.checkpointing += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.proj(x))


def test_checkpointing_then_lora_unless_the_factory_handles_them() -> None:
    model = Tiny()
    wrapped = apply_knobs(model, Params(gradient_checkpointing=True, lora_r=2, lora_target_modules=("proj",)))
    assert model.checkpointing == 1  # enabled on the model itself, before peft wrapped it
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and ".proj." in n for n in trainable)

    handled = Tiny()
    same = apply_knobs(handled, Params(gradient_checkpointing=True, lora_r=2, lora_target_modules=("proj",)),
                       handles={"gradient_checkpointing", "lora_r"})
    assert same is handled and handled.checkpointing == 0


def test_a_knob_the_model_cannot_take_is_one_clear_error() -> None:
    with pytest.raises(TrainfitError, match="no gradient_checkpointing_enable"):
        apply_knobs(torch.nn.Linear(2, 2), Params(gradient_checkpointing=True))
    with pytest.raises(TrainfitError, match="this model's linear layers: proj, out"):
        apply_knobs(Tiny(), Params(lora_r=2, lora_target_modules=("attention",)))
