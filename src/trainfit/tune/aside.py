"""Levers the default search leaves aside because they change what is learned, measured on its pick
(issue 47): what packing would buy, so that a user decides knowing it, instead of never learning of
it. Packing won 2.3x over Hugging Face's own batch finder on the recorded H100 race, where 55% of
the positions of random batches were padding."""

from __future__ import annotations

from collections.abc import Callable

from trainfit.errors import SpecError
from trainfit.probe.measurement import Measurement
from trainfit.search.trials import Trial
from trainfit.spec import Spec
from trainfit.summary import LeverAside
from trainfit.tune.levers import PADDING_SHARE, trainer_takes

PACKING_WHY = ("packing puts several samples in one row: they attend to each other unless the attention "
               "is padding-free (flash attention's variable-length kernels, TRL's padding_free), and an "
               "optimizer step holds a different number of samples, so it changes what is learned")

PACKING_HOW = "search it with `search: {packing: [false, true]}` (or set `params: {packing: true}`), then tune again"


def packing_aside(spec: Spec, pick: Trial, probe: Callable[..., Measurement]) -> list[LeverAside]:
    """Packing measured on ``pick``, the final pick of a default search (``spec``: with its space),
    where the trainer packs, the pick does not, and its batches are more than :data:`PADDING_SHARE`
    padding: one probe by ``probe(params, name)`` (``Search.probe_aside``: outside the study, kept for
    a resume). Empty otherwise."""
    if spec.search is None or not trainer_takes(spec, "packing"):
        return []
    share = pick.measurement.padding_share
    if pick.values.get("packing") or spec.params.packing or share is None or share <= PADDING_SHARE:
        return []
    values = {**pick.values, "packing": True}
    if "group_by_length" in values:  # packed rows have no lengths to group
        values["group_by_length"] = False
    try:
        params = spec.search.params(values)
    except (SpecError, ValueError):  # a config packing cannot run with: nothing to measure
        return []
    m = probe(params, f"aside-packing-of-trial-{pick.number:04d}")
    mine = pick.measurement.samples_per_second
    speed = m.samples_per_second if m.status == "ok" else None
    return [LeverAside(knob="packing", value=True, searched=values, status=m.status, samples_per_second=speed,
                       speedup=speed / mine if speed and mine else None, peak_gb=m.peak_memory_gb, fits=m.fits,
                       why=PACKING_WHY, how=PACKING_HOW)]
