"""Which levers the spec's trainer takes, read from the spec alone (so a resumed study searches the
same space, whatever is installed), and the padding past which a lever that cuts padding pays: length
grouping joins the default search, packing is measured aside on its pick (``trainfit.tune.aside``)."""

from __future__ import annotations

from trainfit.spec import Spec
from trainfit.template import placeholders

PADDING_SHARE = 0.25
"""Random batches more than this share padding make a lever that cuts padding worth a probe."""


def trainer_takes(spec: Spec, knob: str) -> bool:
    """Does the spec's training command take ``knob`` (``group_by_length``, ``packing``): a
    ``tune.command_template`` that passes ``{knob}``, else the written ``trl sft`` command, which
    takes both? (``trainfit train``'s own loop, which a custom model trains in without a template,
    streams its rows shuffled and unpacked.)"""
    template = spec.tune.command_template
    return knob in placeholders(template) if template else spec.uses_trl_sft


def takes_liger(spec: Spec) -> bool:
    """Does the spec's trainer take Liger's cross-entropy: a Hugging Face model trained by a
    ``tune.command_template`` that passes ``{use_liger_kernel}`` or ``{loss}``? Then the default
    search tries ``loss: liger`` beside the spec's loss. Where Liger-Kernel or CUDA is missing, the
    probe says so and the search skips the value."""
    template = spec.tune.command_template
    return (spec.model.factory is None and template is not None
            and bool(placeholders(template) & {"use_liger_kernel", "loss"}))
