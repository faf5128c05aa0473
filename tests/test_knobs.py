"""The knobs: each declared once, as a ``Params`` field made with ``knob(...)`` (params.py), and
applied to a built model (workloads/knobs.py) the same for Hugging Face and custom models:
gradient checkpointing, then LoRA, unless the factory handles them itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from trainfit.errors import TrainfitError
from trainfit.knob_table import knob_table_markdown
from trainfit.params import KNOBS, Knob, Params, parse_params
from trainfit.workloads.knobs import apply_knobs


def fields_without_a_knob(cls: type) -> list[str]:
    """The fields of a ``Params``-like dataclass, but ``extra``, not declared with ``knob(...)``."""
    return [f.name for f in dataclasses.fields(cls)
            if f.name != "extra" and not isinstance(f.metadata.get("knob"), Knob)]


def test_every_params_field_is_a_knob_and_every_knob_a_field_with_its_documented_default() -> None:
    assert fields_without_a_knob(Params) == [], "declare every Params field with knob(default, kind=..., doc=...)"
    fields = [f for f in dataclasses.fields(Params) if f.name != "extra"]
    assert len(fields) >= 16 and list(KNOBS) == [f.name for f in fields]  # same knobs, declaration order
    # The check catches a field added the plain way.
    plain = dataclasses.make_dataclass("Plain", [("warmup", int, dataclasses.field(default=0))], bases=(Params,),
                                       frozen=True, kw_only=True)
    assert fields_without_a_knob(plain) == ["warmup"]

    rows = {row.split(" | ")[0].strip("|` "): row.split(" | ")[2] for row in knob_table_markdown().splitlines()[2:]}
    assert list(rows) == list(KNOBS)
    for f in fields:
        knob = KNOBS[f.name]
        assert knob.name == f.name and knob == dataclasses.replace(f.metadata["knob"], name=f.name)
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        assert getattr(Params(), f.name) == default
        # The documented default, written in a spec as the table shows it, is the field's default.
        documented = yaml.safe_load(rows[f.name].strip("`"))
        parsed, problems = parse_params({f.name: documented}, allow_custom=False)
        assert not problems and getattr(parsed, f.name) == default, (f.name, rows[f.name], default)


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


def test_a_knob_declares_its_prior_or_why_none_and_the_ablation_reads_its_off_value() -> None:
    """A knob is one declaration: ``auto``'s device priors and the ablation's baseline are read from it."""
    from trainfit.ablate import BASELINE
    from trainfit.params import knob
    from trainfit.search.auto import _PRIOR, NO_PRIOR

    for bad in ({}, {"prior": {"cuda": (1,), "cpu": (1,)}, "no_prior": "both"}):
        with pytest.raises(TypeError, match="give a device prior or the reason for none"):
            knob(0, kind="int", doc="x", **bad)
    assert _PRIOR["cuda"]["tf32"] == (True, False) and _PRIOR["cpu"]["tf32"] == (False, True)
    assert NO_PRIOR["packing"].startswith("changes what is learned") and "packing" not in _PRIOR["cuda"]
    assert BASELINE == {k.name: k.off for k in KNOBS.values() if k.ablated}
    assert BASELINE["attention"] == "eager" and "loss" not in BASELINE and "batch_size" not in BASELINE


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
