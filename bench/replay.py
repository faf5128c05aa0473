"""Tune's wall time, replayed on the GPU searches that were recorded: the real search code against a
recorded surface, each probe's cost taken from its recorded phases.

    python bench/replay.py                 # every recorded surface: a table, and JSON with --json FILE
    python bench/replay.py --trace race-b  # one surface, probe by probe: what was asked, what it cost

What runs is trainfit's own search (``trainfit.search.loop.open_search``: the ``auto`` strategy, its
memory line, pruning, saturation and stop rules), with a probe function that answers from a
recording instead of a GPU. Which probe needs a fresh worker process is decided as the probe
session decides it (``ProbeRequest.model_key``, ``probe.runner.process_outlives_model``, a failed
probe ends its worker), on the requests the real code builds for a CUDA device.

**The cost model**, said plainly (``Costs``): a probe on a kept model costs its recorded memory,
burn-in and timed phases; a new model in a kept CUDA process adds the recording's median ``build``;
a fresh process adds the median process start and what fresh probes spent outside every phase
(imports, the CUDA context). An OOM costs the recording's median memory phase. The search's own
time (Optuna, the strategy) is real time on this machine, counted apart.

**Timed as today's probe times** (``cut_at``). Race-a kept each probe's step times, timed in its day
to a 2% target or 200 steps: today's 5% rule (``probe.timing.StopRule`` with ``ProbeSettings``'s
defaults) ends each where it would, and the median probe a recording lacks the phases of costs is
the median of those. **The bar** (``Bar``, issue 47): the search tells each probe the fastest config
of its learning values, and a probe clearly slower stops timing (``probe.phases.clearly_slower``):
cut on race-a's recorded prefixes, else from a probe's steps and its interval at the end, the
interval at ``k`` of ``n`` steps modelled as ``ci_n * sqrt(n / k)``; race-b kept no interval, and 3.5%
is assumed (``ASSUMED_CI``: race-a's three stable-era probes reached 2.8-3.6%; at 3-4% the search asks
for the recorded configs, at 5% for one more). A probe ended early costs its timed phase times ``k / n``.

**Memory parts.** On a GPU ``auto`` jumps from a family's first probe along the line its ``step``
part draws (``AutoStrategy._jump``). Race-a and the sweep kept every probe's parts; race-b kept its
peaks alone, and its ``step`` part is modelled as the peak above the family's line at batch 0 (see
``race_b``).

**Configs the recording lacks** are modelled from the config's family (the same values but the
batch size): the speed interpolated in the batch size between the family's measured neighbours
(held flat past the last one), the peak from the least-squares line of the family's peaks against
the batch (an OOM where it passes the budget's cap). A config whose family was never measured stops
the replay there. Every modelled probe is counted and named.

The surfaces (``SURFACES``): the session-28 H100 race (``docs/results/epoch_race-2026-11-27b-h100.json``,
26 probes of batch x checkpointing x loss x packing), the session-26 race (its 4 recorded probes),
and the 1.1B-shape sweep of 2026-11-24 (5 batch sizes). The H200 runs recorded no probe's phases,
so they cannot be replayed. The target (issue 47): at most 60 simulated seconds a tune, and a pick
at 0.98 or more of the best recorded config's speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.probe.request import Bar, ProbeRequest
from trainfit.probe.runner import build_request, process_outlives_model
from trainfit.probe.timing import StopRule, relative_ci95
from trainfit.search.auto import AutoStrategy
from trainfit.search.pruned import pruned as pruned_families
from trainfit.search.loop import open_search
from trainfit.search.options import SearchOptions
from trainfit.spec import ProbeSettings, Spec, build_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import environment  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
GiB = 1024**3
TARGET_S = 60.0
"""Issue 47's goal for a tune's wall time."""
TARGET_PICK = 0.98
"""Issue 47's goal for the pick's speed against the best recorded config's."""

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2000, "max_position_embeddings": 4096}
"""The spec's model: the probe never builds it (the recording answers), so a tiny one stands in."""


@dataclass(frozen=True)
class Recorded:
    """One recorded probe: its searched values, what it measured and what each phase took."""

    values: dict[str, Any]
    status: str
    samples_per_second: float | None
    peak_gb: float | None
    phases_s: dict[str, float]
    wall_s: float | None
    ci95_rel: float | None = None
    steps: int | None = None
    """Its timed steps, where recorded."""
    step_times: tuple[float, ...] = ()
    """Each timed step's seconds, where recorded (race-a)."""
    parts_gb: dict[str, float] = field(default_factory=dict)
    """Where its peak went (``Measurement.memory_parts_bytes``, in GiB), where recorded (race-a, the sweep)."""

    @property
    def measure_s(self) -> float:
        """The probe's own phases: memory, burn-in, timed (no start, no build)."""
        return sum(self.phases_s.get(k, 0.0) for k in ("memory", "burn_in", "timed"))

    @property
    def fresh(self) -> bool:
        return self.phases_s.get("build", 0.0) > 0


@dataclass(frozen=True)
class Surface:
    """A recorded search: its space, budget, every probe it recorded."""

    name: str
    source: str
    device: str
    search: dict[str, list[Any]]
    budget_gb: float
    headroom_gb: float
    probes: list[Recorded]
    recorded_tune_s: float | None = None
    """What the recorded tune took on the GPU (None: not a tune, a sweep)."""
    todays_builds_from: int = 0
    """The recorded probes before this one built their model as older code did: their builds are not
    today's, and do not price one."""
    params: dict[str, Any] = field(default_factory=dict)

    def best(self) -> Recorded:
        """The fastest recorded config that fits the budget (peak + headroom within it)."""
        return max((p for p in self.probes if self.fits(p)), key=lambda p: p.samples_per_second or 0.0)

    def fits(self, p: Recorded) -> bool:
        return p.status == "ok" and p.peak_gb is not None and p.peak_gb + self.headroom_gb <= self.budget_gb


@dataclass(frozen=True)
class Costs:
    """The cost model (see the module): medians of the recording's own phases."""

    build_s: float
    fresh_extra_s: float
    oom_s: float
    measure_s: float
    """A probe whose phases the recording lacks costs the median probe's, as today's stop rule times it
    (:func:`today_measure_s`)."""

    @classmethod
    def of(cls, surface: Surface) -> Costs:
        fresh = [p for p in surface.probes[surface.todays_builds_from:] if p.fresh]
        measured = [p for p in surface.probes if p.status == "ok"]
        outside = [p.wall_s - sum(p.phases_s.values()) for p in fresh if p.wall_s is not None]
        return cls(build_s=statistics.median(p.phases_s["build"] for p in fresh),
                   fresh_extra_s=statistics.median(p.phases_s.get("start", 0.0) for p in fresh)
                   + (statistics.median(outside) if outside else 0.0),
                   oom_s=statistics.median(p.phases_s.get("memory", 0.0) for p in measured if "memory" in p.phases_s),
                   measure_s=statistics.median(today_measure_s(p) for p in measured if "timed" in p.phases_s))


class Unrecorded(Exception):
    """The search asked for a config whose family the recording never measured."""


@dataclass
class Replay:
    """The probe function a replayed search calls: answers from the recording, prices each probe."""

    surface: Surface
    spec: Spec
    costs: Costs
    simulated_s: float = 0.0
    fresh_processes: int = 0
    modelled: list[dict[str, Any]] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)
    last: ProbeRequest | None = None
    alive: bool = False
    parts: dict[str, float] = field(default_factory=lambda: {"fresh processes": 0.0, "model builds": 0.0,
                                                             "probes' own phases": 0.0})
    """The simulated seconds by what they went to."""

    def __call__(self, params: Params, number: int, slower_than: Bar | None = None) -> Measurement:
        values = {k: getattr(params, k) for k in self.surface.search}
        recorded = next((p for p in self.surface.probes if p.values == values), None)
        modelled = recorded is None
        if recorded is None:
            recorded = model(self.surface, values)
            self.modelled.append(values)
        cut = cut_at(recorded, slower_than) if recorded.status == "ok" else None
        m = measurement(self.surface, params, recorded, cut, slower_than)
        builds = self.parts["model builds"]
        cost = self.price(params, recorded, cut)
        self.simulated_s += cost
        self.asked.append({"trial": number, "values": values, "status": m.status, "fits": m.fits,
                           "samples_per_second": m.samples_per_second, "cost_s": round(cost, 2),
                           "recorded_speed": recorded.samples_per_second, "modelled": modelled,
                           "built": self.parts["model builds"] > builds,
                           "cut": None if cut is None else
                           {"steps": cut.steps, "of": recorded.steps, "ci95_rel": round(cut.ci95_rel, 3),
                            "bar_trial": slower_than.trial if cut.by_bar and slower_than else None}})
        return m

    def price(self, params: Params, recorded: Recorded, cut: Cut | None = None) -> float:
        """The probe's simulated seconds: its phases (the timed one up to ``cut``), and a build or a
        fresh process as the session would need."""
        request = build_request(self.spec, params, None, "cuda")
        same_model = self.alive and self.last is not None and request.model_key is not None \
            and request.model_key == self.last.model_key
        kept_process = self.alive and self.last is not None and process_outlives_model(self.last, request)
        cost = self.costs.oom_s if recorded.status == "oom" else recorded.measure_s if "timed" in recorded.phases_s \
            else self.costs.measure_s
        if cut is not None:
            cost -= recorded.phases_s["timed"] * (1 - cut.steps / (recorded.steps or cut.steps))
        self.parts["probes' own phases"] += cost
        if not same_model:
            cost += self.costs.build_s
            self.parts["model builds"] += self.costs.build_s
            if not kept_process:
                cost += self.costs.fresh_extra_s
                self.parts["fresh processes"] += self.costs.fresh_extra_s
                self.fresh_processes += 1
        # a failed probe ends its worker; so does a model that must not be kept
        self.alive = recorded.status == "ok" and request.model_key is not None
        self.last = request
        return cost


ASSUMED_CI = 0.035
"""A recorded probe that stopped before its step cap without its interval on record (race-b) reached
the stop rule's target, ``probe.target_rel_ci``: its interval is taken as that."""
CYCLE = 4
"""Race-b's probes timed whole cycles of 4 shapes (their steps are multiples of 4, 8 at the least):
the bar is looked at after each whole cycle from the second on, as ``probe.phases.clearly_slower`` does."""


@dataclass(frozen=True)
class Cut:
    """Where a recorded probe's timing ends as today's probe would end it: after ``steps`` steps, its
    interval and speed then; ``by_bar``: cut short at the search's bar, else stopped by the 5% rule."""

    steps: int
    ci95_rel: float
    samples_per_second: float
    by_bar: bool


RULE = ProbeSettings()
"""Today's stop rule (``probe.min_steps``, ``max_steps``, ``max_seconds``, ``target_rel_ci``: 5%)."""


def cut_at(p: Recorded, bar: Bar | None) -> Cut | None:
    """Where today's probe would have ended ``p``'s timed phase, None where it runs to the recorded end.
    With its step times on record (race-a, timed to a 2% target or 200 steps in its day), each
    prefix's speed and interval, cycles of one step (fixed length): the 5% rule
    (``probe.timing.StopRule``), or ``bar`` (``Bar.beats``). Else its steps and its interval at the end
    (:data:`ASSUMED_CI` where not recorded), at ``k`` steps of ``n`` modelled as ``ci_n * sqrt(n / k)``
    at the recorded speed, after each whole cycle of :data:`CYCLE`: the bar alone (the rule ended it)."""
    if not p.steps or p.samples_per_second is None:
        return None
    if p.step_times:
        times = list(p.step_times)
        rule = StopRule(RULE.min_steps, RULE.max_steps, RULE.max_seconds, RULE.target_rel_ci)
        whole = statistics.median(times)
        for k in range(3, len(times)):
            ci = relative_ci95(times[:k])
            speed = p.samples_per_second * whole / statistics.median(times[:k])
            if rule.done(times[:k])[0]:
                return Cut(k, ci, speed, by_bar=False)
            if bar is not None and bar.beats(speed, ci):
                return Cut(k, ci, speed, by_bar=True)
        return None
    if bar is None:
        return None
    ci_n = p.ci95_rel if p.ci95_rel is not None else ASSUMED_CI
    for k in range(2 * CYCLE, p.steps, CYCLE):
        ci = ci_n * math.sqrt(p.steps / k)
        if bar.beats(p.samples_per_second, ci):
            return Cut(k, ci, p.samples_per_second, by_bar=True)
    return None


def today_measure_s(p: Recorded) -> float:
    """``p``'s own phases with its timed phase as today's stop rule ends it (:func:`cut_at`, no bar)."""
    cut = cut_at(p, None)
    return p.measure_s - (p.phases_s["timed"] * (1 - cut.steps / (p.steps or cut.steps)) if cut else 0.0)


def model(surface: Surface, values: dict[str, Any]) -> Recorded:
    """A config the recording lacks, from its family's measured probes (see the module)."""
    family = [p for p in surface.probes if {k: v for k, v in p.values.items() if k != "batch_size"}
              == {k: v for k, v in values.items() if k != "batch_size"}]
    fits = sorted((p for p in family if p.status == "ok" and p.samples_per_second), key=lambda p: p.values["batch_size"])
    if not fits:
        raise Unrecorded(f"{values}: its family was never measured")
    batch = values["batch_size"]
    below = [p for p in fits if p.values["batch_size"] <= batch]
    above = [p for p in fits if p.values["batch_size"] >= batch]
    if below and above and below[-1] is not above[0]:
        lo, hi = below[-1], above[0]
        share = (batch - lo.values["batch_size"]) / (hi.values["batch_size"] - lo.values["batch_size"])
        speed = lo.samples_per_second + share * (hi.samples_per_second - lo.samples_per_second)
    else:
        speed = (below or above)[-1 if below else 0].samples_per_second
    peaks = [(p.values["batch_size"], p.peak_gb) for p in family if p.peak_gb is not None]
    peak = line_at(peaks, batch) if len(peaks) >= 2 else peaks[0][1] if peaks else None
    status = "oom" if peak is not None and peak > surface.budget_gb else "ok"
    nearest = min(fits, key=lambda p: abs(p.values["batch_size"] - batch))
    return Recorded(values=values, status=status, samples_per_second=speed if status == "ok" else None,
                    peak_gb=peak, phases_s={k: v for k, v in nearest.phases_s.items() if k in ("memory", "burn_in",
                                                                                                "timed")},
                    wall_s=None, ci95_rel=nearest.ci95_rel, steps=nearest.steps)


def line_at(points: list[tuple[float, float]], x: float) -> float:
    """The least-squares line through ``points`` at ``x``."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my + slope * (x - mx)


def measurement(surface: Surface, params: Params, p: Recorded, cut: Cut | None = None,
                bar: Bar | None = None) -> Measurement:
    """The recorded probe as the probe would have returned it (cut short at ``bar`` where ``cut``)."""
    common: dict[str, Any] = {"config": params.to_dict(), "device": "cuda", "device_name": surface.device,
                              "budget_memory_gb": surface.budget_gb, "budget_headroom_gb": surface.headroom_gb,
                              "memory_cap_bytes": int(surface.budget_gb * GiB), "phases_s": p.phases_s}
    peak = int(p.peak_gb * GiB) if p.peak_gb is not None else None
    common["memory_parts_bytes"] = {k: int(v * GiB) for k, v in p.parts_gb.items()}
    if p.status != "ok":
        return Measurement(status="oom", message="CUDA out of memory (recorded)", peak_memory_bytes=peak, **common)
    ci = cut.ci95_rel if cut is not None else p.ci95_rel if p.ci95_rel is not None or not p.steps else ASSUMED_CI
    speed = cut.samples_per_second if cut is not None else p.samples_per_second
    by_bar = cut is not None and cut.by_bar and bar is not None
    return Measurement(status="ok", samples_per_second=speed, tokens_per_second=(speed or 0.0) * 512,
                       peak_memory_bytes=peak, steps_measured=cut.steps if cut is not None else p.steps or 20,
                       stable=not by_bar, step_time_ci95_rel=ci,
                       slower_than=dataclasses.asdict(bar) if by_bar and bar else None, **common)


def race_b() -> Surface:
    """Its 26 probes kept their peaks, not where each went: each probe's ``step`` part (what a step
    holds over the model, its optimizer state and the runtime, which a real probe measures) is modelled
    as its peak above its family's line at batch 0 (the least-squares line of the family's recorded
    peaks against the batch; race-a's probes, which kept their parts, held 1.01x their line's slope a
    sample at batch 1)."""
    doc = json.loads((RESULTS / "epoch_race-2026-11-27b-h100.json").read_text())

    def family(values: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in values.items() if k != "batch_size"}, sort_keys=True)

    lines: dict[str, list[tuple[float, float]]] = {}
    for p in doc["probes"]:  # an OOM's peak is where it stopped, not what it needed: not on the line
        if p["status"] == "ok":
            lines.setdefault(family(p["searched"]), []).append((p["searched"]["batch_size"], p["peak_memory_gb"]))

    def parts(p: dict[str, Any]) -> dict[str, float]:
        line = lines.get(family(p["searched"]), [])
        base = line_at(line, 0.0) if len(line) >= 2 else 0.0
        return {"model": base, "step": p["peak_memory_gb"] - base}

    probes = [Recorded(values=p["searched"], status=p["status"], samples_per_second=p["samples_per_second"],
                       peak_gb=p["peak_memory_gb"], phases_s=p["phases_s"], wall_s=p["wall_s_rounded"],
                       steps=p.get("steps_measured"), parts_gb=parts(p))
              for p in doc["probes"]]
    return Surface(name="race-b", source="epoch_race-2026-11-27b-h100.json", device="NVIDIA H100 80GB HBM3",
                   search={"batch_size": [1, 2, 4, 8, 16, 32, 64], "gradient_checkpointing": [False, True],
                           "loss": ["model", "liger"], "packing": [False, True]},
                   budget_gb=24.0, headroom_gb=1.0, probes=probes,
                   recorded_tune_s=doc["results"]["trainfit"]["tune_wall_s"],
                   params={"max_length": 2048, "precision": "bf16", "lora_r": 16, "lora_alpha": 32})


def race_a() -> Surface:
    """Its 4 probes without checkpointing in full; its 2 with checkpointing from the summary (speed and
    peak; their phases were not kept, so they cost the median probe's)."""
    doc = json.loads((RESULTS / "epoch_race-2026-11-27-h100.json").read_text())
    probes = [Recorded(values={"batch_size": p["config"]["batch_size"],
                               "gradient_checkpointing": p["config"]["gradient_checkpointing"]},
                       status=p["status"], samples_per_second=p.get("samples_per_second"),
                       peak_gb=p["peak_memory_bytes"] / GiB if p.get("peak_memory_bytes") else None,
                       phases_s=p["phases_s"], wall_s=None, ci95_rel=p.get("step_time_ci95_rel"),
                       steps=p.get("steps_measured"), step_times=tuple(p.get("step_times_s", ())),
                       parts_gb={k: v / GiB for k, v in (p.get("memory_parts_bytes") or {}).items()})
              for p in doc["probes"]]
    summary = doc["tune_summary"]
    probes += [Recorded(values=e["searched"], status="ok", samples_per_second=e["samples_per_second"],
                        peak_gb=e["memory_peak_gb"], phases_s={}, wall_s=None)
               for e in summary["runners_up"] if e["searched"]["gradient_checkpointing"]]
    return Surface(name="race-a", source="epoch_race-2026-11-27-h100.json", device="NVIDIA H100 80GB HBM3",
                   search={"batch_size": [1, 2, 4, 8, 16, 32, 64], "gradient_checkpointing": [False, True]},
                   budget_gb=24.0, headroom_gb=1.0, probes=probes, recorded_tune_s=doc["trainfit"]["tune_wall_s"],
                   params={"max_length": 2048, "precision": "bf16", "lora_r": 16, "lora_alpha": 32})


def sweep_1b() -> Surface:
    """Its first three probes built the random-init model on the CPU (67-79 s); 29a9b66, in the same
    session, builds it on the GPU, and the last two took 15-16 s: today's builds, which price one."""
    doc = json.loads((RESULTS / "gpu_sweep-lora_r16-2026-11-24-h100.json").read_text())
    probes = [Recorded(values={"batch_size": r["batch_size"]}, status=r["status"],
                       samples_per_second=r["samples_per_second"], peak_gb=r["peak_reserved_gb"],
                       phases_s=r["phases_s"], wall_s=r["probe_wall_s"], parts_gb=r["memory_parts_gb"])
              for r in doc["rows"]]
    return Surface(name="sweep-1b", source="gpu_sweep-lora_r16-2026-11-24-h100.json", device="NVIDIA H100 80GB HBM3",
                   search={"batch_size": [1, 2, 4, 8, 16]}, budget_gb=79.0, headroom_gb=1.0, probes=probes,
                   todays_builds_from=3,
                   params={"max_length": 2048, "precision": "bf16", "lora_r": 16, "lora_alpha": 32})


SURFACES: dict[str, Callable[[], Surface]] = {"race-b": race_b, "race-a": race_a, "sweep-1b": sweep_1b}


def surface_spec(surface: Surface) -> Spec:
    """A spec searching the surface's space under its budget, for a trainer of one's own (the races'
    Hugging Face Trainer: a ``command_template``), on CUDA."""
    template = ("python train.py --per_device_train_batch_size {batch_size} --gradient_accumulation_steps "
                "{gradient_accumulation_steps} --gradient_checkpointing {gradient_checkpointing} "
                "--use_liger_kernel {use_liger_kernel} --packing {packing} --max_steps {max_steps}")
    doc = {"model": {"config": TINY}, "params": {**surface.params, "loss": "model", "attention": "sdpa"},
           "budget": {"memory_gb": surface.budget_gb, "headroom_gb": surface.headroom_gb},
           "probe": {"device": "cuda"}, "search": surface.search,
           "tune": {"command_template": template, "strategy": "auto"}}
    return build_spec(doc, base_dir=ROOT, source=f"replay:{surface.name}")


def replay(surface: Surface) -> dict[str, Any]:
    """The search run against ``surface``: simulated seconds, probes, fresh processes, the pick."""
    spec = surface_spec(surface)
    costs = Costs.of(surface)
    probe = Replay(surface, spec, costs)
    stopped = None
    start = time.perf_counter()
    pruned: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="replay-") as folder:
        options = SearchOptions(output=folder, probe_fn=probe, device_type="cuda")
        try:
            with open_search(spec, options) as search:
                for _ in search.measured():
                    pass
                outcome = search.outcome()
                auto = AutoStrategy(search.space, surface.budget_gb, surface.headroom_gb, "cuda")
                pruned = [{"family": p.family, "below_batch": p.below_batch, "reason": p.reason}
                          for p in pruned_families(auto, outcome.trials)]
        except Unrecorded as err:
            stopped, outcome = str(err), None
    search_s = time.perf_counter() - start
    fits = [a for a in probe.asked if a["fits"]]
    pick = max(fits, key=lambda a: a["samples_per_second"]) if fits else None
    best = surface.best()
    return {"surface": surface.name, "source": surface.source, "simulated_s": round(probe.simulated_s, 1),
            "search_code_s": round(search_s, 2), "probes": len(probe.asked), "fresh_processes": probe.fresh_processes,
            "modelled": probe.modelled, "stopped": stopped, "pruned": pruned, "stop_reason": outcome.stop_reason if outcome else None,
            "pick": pick["values"] if pick else None,
            "pick_speed_share": round(pick["recorded_speed"] / best.samples_per_second, 3) if pick else None,
            "recorded_best": best.values, "recorded_tune_s": surface.recorded_tune_s,
            "simulated_parts_s": {k: round(v, 1) for k, v in probe.parts.items()},
            "costs": {"build_s": round(costs.build_s, 2), "fresh_extra_s": round(costs.fresh_extra_s, 2),
                      "oom_s": round(costs.oom_s, 2)},
            "meets_target": bool(pick and probe.simulated_s <= TARGET_S
                                 and pick["recorded_speed"] >= TARGET_PICK * best.samples_per_second),
            "trace": probe.asked}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", choices=SURFACES, help="one surface, probe by probe")
    ap.add_argument("--json", type=Path, help="write every surface's replay here")
    args = ap.parse_args()
    names = [args.trace] if args.trace else list(SURFACES)
    results = [replay(SURFACES[name]()) for name in names]
    print(f"{'surface':10} {'simulated':>9} {'probes':>6} {'fresh':>5} {'modelled':>8} {'pick/best':>9}  pick")
    for r in results:
        print(f"{r['surface']:10} {r['simulated_s']:>8.0f}s {r['probes']:>6} {r['fresh_processes']:>5} "
              f"{len(r['modelled']):>8} {r['pick_speed_share'] or 0:>9.3f}  {r['pick']}"
              + (f"  STOPPED: {r['stopped']}" if r["stopped"] else ""))
    if args.trace:
        for a in results[0]["trace"]:
            print(f"  trial {a['trial']:>2} {a['cost_s']:>5.1f}s {a['status']:4} {'fits' if a['fits'] else '    '} "
                  f"{a['samples_per_second'] or 0:6.1f}/s {'(modelled) ' if a['modelled'] else ''}{a['values']}")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "replay", "environment": environment(), "results": results},
                                        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
