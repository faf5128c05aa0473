"""``trainfit ablate``: what each speed or memory technique buys on your model, data and device,
measured instead of claimed.

From the spec's config a **baseline** with every technique off (fp32, eager attention, no
checkpointing, no TF32, no compile, plain AdamW, padding to the batch's longest) is probed, then
each technique alone on top of it, then all the available ones together. Every row is a real
probe (:func:`trainfit.run_probe`) on the same worst-case and typical batches, so the ratios
compare like with like. A technique the device or the model cannot run (flash attention on a
CPU, 8-bit Adam without bitsandbytes, an attention kernel a factory model does not take) is
listed as unavailable with the probe's reason, never measured as zero. Where the seeds' in-house
guide claims a figure, it is shown beside the measured one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainfit.data.analyze import analyze_spec
from trainfit.errors import TrainfitError
from trainfit.json_record import Record
from trainfit.params import KNOBS, Params
from trainfit.probe.runner import ProbeSession, run_probe
from trainfit.spec import Spec

SCHEMA_VERSION = 1
FIXED = "fixed padding at max_length"

BASELINE: dict[str, Any] = {k.name: k.off for k in KNOBS.values() if k.ablated}
"""Every technique off: each knob's ``off`` value (its declaration in params.py)."""

CLAIM_SOURCE = ("a speed and memory guide's rules of thumb, not measured by trainfit (taken on an RTX 4090, a TTS "
                "fine-tune at batch 8): for comparison only")


@dataclass(frozen=True)
class Technique:
    """One row: a name, the knobs that turn it on over the baseline, and the guide's claim."""

    name: str
    knobs: Mapping[str, Any]
    claim: str | None = None
    changes_learning: bool = False
    not_applicable: str | None = None
    """Why the model cannot take it (then it is listed, not probed)."""
    versus: str | None = None
    """The row it is compared with, when not the baseline (compile: fixed padding, which it needs)."""


def techniques(spec: Spec, recommended_length: int | None) -> list[Technique]:
    """The rows to measure for ``spec`` (``recommended_length``: the data analysis's fixed padding
    length, for the fixed-padding row)."""
    factory = spec.model.factory is not None
    own = "a factory model's attention is its own (trainfit applies it only when the factory lists it in handles)"
    no_length = None if spec.params.max_length else "needs params.max_length (the length every batch is padded to)"
    rows = [
        Technique("gradient checkpointing", {"gradient_checkpointing": True}, "memory -20-30%, speed 0.90-0.95x"),
        Technique("SDPA attention", {"attention": "sdpa"}, "speed 1.3-1.5x, memory -30-40%",
                  not_applicable=own if factory else None),
        Technique("flash attention 2", {"attention": "flash_attention_2"}, not_applicable=own if factory else None),
        Technique("bf16 mixed precision", {"precision": "bf16"}, "speed +20-40%, memory -30-40% (over SDPA)"),
        Technique("fp16 mixed precision", {"precision": "fp16"}, "speed +20-40%, memory -30-40% (over SDPA)"),
        Technique("TF32 matmuls", {"tf32": True}, "speed +10-15% (with cuDNN benchmark)"),
        Technique("fused AdamW", {"optimizer": "adamw_fused"}),
        Technique("8-bit AdamW", {"optimizer": "adamw_8bit"}),
        Technique("4-bit base (QLoRA)", {"quantization": "4bit"}, changes_learning=True,
                  not_applicable="a factory quantizes its own model" if factory else
                  None if spec.params.lora_r is not None else "needs LoRA adapters to train on it (params.lora_r)"),
        Technique(FIXED, {"padding": "max_length"}, not_applicable=no_length),
        Technique("torch.compile", {"compile": "default", "padding": "max_length"}, versus=FIXED,
                  not_applicable=no_length),
    ]
    longest = spec.params.max_length
    if recommended_length is not None and longest is not None and recommended_length != longest:
        rows.append(Technique(f"fixed padding at {recommended_length} (the data's)",
                              {"padding": "max_length", "max_length": recommended_length},
                              changes_learning=recommended_length < longest))
    if spec.params.lora_r is None:
        rows.append(_lora(spec))
    return rows


def _lora(spec: Spec) -> Technique:
    """LoRA r=16 on every linear layer of a Hugging Face model. A factory model's modules to adapt
    are named only by its spec, with LoRA on (it is then part of every row, the baseline too)."""
    if spec.model.factory is None:
        return Technique("LoRA r=16, all linear layers", {"lora_r": 16, "lora_target_modules": "all-linear"},
                         changes_learning=True)
    return Technique("LoRA r=16", {"lora_r": 16}, changes_learning=True,
                     not_applicable="a factory model's modules to adapt are named by its spec: set params.lora_r and "
                                    "params.lora_target_modules there (LoRA is then in every row)")


@dataclass(frozen=True, kw_only=True)
class Row(Record):
    """One measured (or unavailable) row of the table."""

    name: str
    knobs: dict[str, Any]
    """What differs from the baseline."""
    status: str
    """``ok``, ``unavailable`` (the device or model cannot run it), ``oom``, ``error``, ``timeout`` or ``diverged``."""
    reason: str | None = None
    samples_per_second: float | None = None
    spread_rel: float | None = None
    """The probe's step-time 95% interval, relative."""
    speedup: float | None = None
    """Samples/s over the baseline's (or ``versus``'s)."""
    versus: str | None = None
    """The row the ratios are against, when not the baseline."""
    speedup_low: float | None = None
    speedup_high: float | None = None
    """The speed-up's 95% interval, from both probes' step-time intervals."""
    peak_gb: float | None = None
    memory_change: float | None = None
    """Peak memory over the baseline's, less 1 (-0.3: 30% less)."""
    step_memory_gb: float | None = None
    """The steps' own memory above what is held between steps (activations, mostly)."""
    mfu: float | None = None
    claim: str | None = None
    changes_learning: bool = False
    notes: list[str] = field(default_factory=list)
    device: str = ""
    """Where it was measured."""


@dataclass(frozen=True, kw_only=True)
class Ablation(Record):
    """``ablation.json``."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    device: str
    baseline: dict[str, Any]
    """Every knob of the baseline config."""
    rows: list[Row]
    """The baseline first, each technique alone, the baseline again, then the ones that helped together."""
    claim_source: str = CLAIM_SOURCE
    drift: float = 0.0
    """How far the baseline's two probes (first and after the techniques) differ, relative: the
    machine's drift over the ablation, in every ratio's interval."""
    measured_on: dict[str, Any] | None = field(default=None, metadata={"omit_none": True})
    """What the rows were measured on besides the baseline's knobs (:func:`measured_on`): a resume
    checks it. Absent from an ablation written before it was kept."""


MEASURED_ON = ("model", "data", "tokenizer", "budget", "probe")
"""The spec's sections a row's figures depend on, besides the knobs (``params``)."""
PROBE_FIGURES = ("device", "memory_steps", "burn_in_steps", "seed", "data")
"""Of the probe settings, those that change a row's figures (a timeout or a time limit does not)."""


def measured_on(spec: Spec) -> dict[str, Any]:
    """The spec's model, data, tokenizer, memory budget and the probe settings that change a figure."""
    whole = spec.to_dict()
    scope = {k: whole.get(k) for k in MEASURED_ON}
    if isinstance(scope["probe"], dict):
        scope["probe"] = {k: v for k, v in scope["probe"].items() if k in PROBE_FIGURES}
    return scope


def row_of(name: str, knobs: Mapping[str, Any], m: Any, *, claim: str | None = None,
           changes_learning: bool = False, versus: str | None = None) -> Row:
    """A :class:`Row` of measurement ``m``, its ratios not yet filled (:func:`with_ratios`)."""
    status = "unavailable" if m.status != "ok" and m.unsupported else m.status
    common = {"name": name, "knobs": dict(knobs), "claim": claim, "changes_learning": changes_learning,
              "notes": [n for n in m.notes if "no budget" not in n], "device": m.device_name or m.device,
              "versus": versus}
    if status != "ok":
        return Row(status=status, reason=m.message, peak_gb=m.peak_memory_gb, **common)
    return Row(status="ok", samples_per_second=m.samples_per_second, spread_rel=m.step_time_ci95_rel,
               peak_gb=m.peak_memory_gb, step_memory_gb=_gb(m.memory_parts_bytes.get("step")), mfu=m.mfu,
               **common)


def reference(first: Row, again: Row | None) -> tuple[Row, float, float]:
    """The baseline the ratios are against: the mean speed and peak of its probe before the
    techniques and after them; the drift of its speed between the two (relative), which widens
    every ratio's interval; and that of its peak memory, the noise a memory change must exceed."""
    if again is None or again.status != "ok" or first.status != "ok" or not first.samples_per_second:
        return first, 0.0, 0.0
    a, b = first.samples_per_second, again.samples_per_second or 0.0
    mean = (a + b) / 2
    spread = max(first.spread_rel or 0.0, again.spread_rel or 0.0)
    pa, pb = first.peak_gb or 0.0, again.peak_gb or 0.0
    peak = (pa + pb) / 2
    ref = dataclasses.replace(first, samples_per_second=mean, spread_rel=spread, peak_gb=peak or None)
    return ref, abs(a - b) / mean, abs(pa - pb) / peak if peak else 0.0


def with_ratios(row: Row, ref: Row, drift: float) -> Row:
    """``row`` with its speed-up over ``ref`` (95% interval: both probes' step-time intervals and
    the baseline's ``drift``) and its peak memory against ``ref``'s."""
    if row.status != "ok" or ref.status != "ok" or not ref.samples_per_second or not row.samples_per_second:
        return row
    speedup = row.samples_per_second / ref.samples_per_second
    spread = math.sqrt((row.spread_rel or 0.0) ** 2 + (ref.spread_rel or 0.0) ** 2 + drift ** 2)
    change = row.peak_gb / ref.peak_gb - 1 if row.peak_gb and ref.peak_gb else None
    # A spread past 100% leaves the interval no low end (a ratio is never below 0): it reads "up to HIGH".
    return dataclasses.replace(row, speedup=speedup, speedup_low=max(0.0, speedup * (1 - spread)),
                               speedup_high=speedup * (1 + spread), memory_change=change)


def as_baseline(row: Row, ref: Row) -> Row:
    """The baseline's first probe against ``ref``, the reference every ratio is against (the mean
    of its two probes; the probe itself where there is one): x1.00 with one probe, beside its
    second probe's ratio with two, each within its own probe's spread."""
    if row.status != "ok" or not row.samples_per_second or not ref.samples_per_second:
        return row
    speedup, spread = row.samples_per_second / ref.samples_per_second, row.spread_rel or 0.0
    return dataclasses.replace(row, speedup=speedup, speedup_low=max(0.0, speedup * (1 - spread)),
                               speedup_high=speedup * (1 + spread),
                               memory_change=row.peak_gb / ref.peak_gb - 1 if row.peak_gb and ref.peak_gb else None)


def helped(row: Row, memory_noise: float = 0.0, versus: Row | None = None) -> bool:
    """Whether a technique's row earns its place in "all that helped": it ran, learns the same,
    has an effect on this device, and was faster beyond its interval or lowered peak memory by 5%
    and by more than the baseline's own two probes differ (``memory_noise``). A row compared with
    another (``versus``: compile with fixed padding) also needs that one to have helped: its knobs
    come along."""
    if row.status != "ok" or row.changes_learning or any("no effect" in n for n in row.notes):
        return False
    if row.versus is not None and (versus is None or not helped(versus, memory_noise)):
        return False
    faster = row.speedup_low is not None and row.speedup_low > 1
    leaner = row.memory_change is not None and row.memory_change <= -max(0.05, memory_noise)
    return faster or leaner


def helpful(rows: Sequence[Row], memory_noise: float = 0.0) -> list[Row]:
    """The technique rows that :func:`helped`."""
    by_name = {r.name: r for r in rows}
    return [r for r in rows if helped(r, memory_noise, by_name.get(r.versus) if r.versus else None)]


def all_together(rows: Sequence[Row], memory_noise: float = 0.0) -> dict[str, Any]:
    """The knobs of the :func:`helpful` rows: for the knobs with rival values (attention,
    precision, optimizer) the one whose row was fastest, for the others the first."""
    ran = helpful(rows, memory_noise)
    chosen: dict[str, Any] = {}
    for knob in ("attention", "precision", "optimizer"):
        best = max((r for r in ran if knob in r.knobs), key=lambda r: r.samples_per_second or 0.0, default=None)
        if best is not None:
            chosen[knob] = best.knobs[knob]
    for r in ran:
        for knob, value in r.knobs.items():
            chosen.setdefault(knob, value)
    return chosen


AGAIN = "baseline, again"
TOGETHER = "all that helped, together"


def ablate(spec: Spec, *, stats: Any = None, done: Mapping[str, Row] | None = None, only: Sequence[str] = (),
           on_row: Callable[[Row], None] | None = None) -> Ablation:
    """Probe the baseline, each technique of :func:`techniques`, the baseline again (the machine's
    drift), and the techniques that helped, together. ``stats``: the data's length analysis
    (default: computed). ``done``: rows an interrupted ablation measured, by name: reused when
    their knobs are the same. ``only``: the techniques whose names contain one of these words
    (default: all). ``on_row`` hears each row as it is measured (or reused), before its ratios."""
    import datetime as _dt


    if stats is None and spec.data is not None:
        stats = analyze_spec(spec, progress=False)
    earlier = dict(done or {})
    say = on_row or (lambda row: None)
    base_params = baseline_params(spec)
    everything = techniques(spec, stats.recommended_max_length if stats is not None else None)
    chosen = _chosen(everything, only)
    rows: list[Row] = []
    with ProbeSession() as session:
        def measure(name: str, knobs: Mapping[str, Any], **kw: Any) -> Row:
            kept = earlier.get(name)
            if kept is not None and kept.knobs == dict(knobs) and kept.status != "error":
                row = kept
            else:
                row = row_of(name, knobs, run_probe(spec, _params(base_params, knobs), stats=stats, session=session),
                             **kw)
            say(row)
            return row

        rows.append(measure("baseline", {}))
        if rows[0].status != "ok":  # nothing to compare with: the techniques are not probed
            return Ablation(created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            device=rows[0].device, baseline=base_params.to_dict(), rows=rows,
                            measured_on=measured_on(spec))
        for t in chosen:
            if t.not_applicable:
                rows.append(Row(name=t.name, knobs=dict(t.knobs), status="unavailable", reason=t.not_applicable,
                                claim=t.claim))
                say(rows[-1])
            else:
                rows.append(measure(t.name, t.knobs, claim=t.claim, changes_learning=t.changes_learning,
                                    versus=t.versus))
        rows.append(measure(AGAIN, {}))
        ref, drift, memory_noise = reference(rows[0], rows[-1])
        by_name = {r.name: r for r in rows}
        rows = [as_baseline(rows[0], ref), *(with_ratios(r, by_name[r.versus] if r.versus else ref, drift) for r in rows[1:])]
        together = all_together(rows[1:-1], memory_noise)
        if len(helpful(rows[1:-1], memory_noise)) >= 2:
            rows.append(with_ratios(measure(TOGETHER, together, claim="speed 2.1x, memory -58% (checkpointing, SDPA, "
                                                                        "mixed precision: their 'all optimizations')"),
                                    ref, drift))
    return Ablation(created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    device=rows[0].device, baseline=base_params.to_dict(), rows=rows, drift=drift,
                    measured_on=measured_on(spec))


def _chosen(everything: Sequence[Technique], only: Sequence[str]) -> list[Technique]:
    """The techniques whose names hold one of the words ``only`` (all without any), with the rows
    they are compared with; a word that names none is refused (a typo among good words would
    silently measure less than asked)."""
    def names(word: str, t: Technique) -> bool:
        return word.lower() in t.name.lower()

    unmatched = [word for word in only if not any(names(word, t) for t in everything)]
    if unmatched:
        raise TrainfitError(f"--only {','.join(unmatched)} names no technique",
                            f"the techniques: {', '.join(t.name for t in everything)}")
    chosen = [t for t in everything if not only or any(names(word, t) for word in only)]
    needed = {t.versus for t in chosen if t.versus}  # what a compared row is compared with is measured too
    return [t for t in everything if t in chosen or t.name in needed]


def baseline_params(spec: Spec) -> Params:
    """The spec's config with every technique off (:data:`BASELINE`); a factory keeps its attention."""
    own = {"attention": spec.params.attention} if spec.model.factory is not None else {}
    return _params(spec.params, {**BASELINE, **own})


def _params(params: Params, changes: Mapping[str, Any]) -> Params:
    return params.replace(**changes)


def _gb(value: int | None) -> float | None:
    return None if value is None else value / 2**30
