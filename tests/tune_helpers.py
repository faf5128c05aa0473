"""What the tune tests share: a deterministic synthetic surface standing in for the probe (it tests
search logic only, never a measurement), the spec it is searched with, and a store opened as
another run of a study would open it.

The Surface: memory = 10 GiB + batch x per-sample cost, throughput saturates in the batch size.
Its feasible optimum under BUDGET - HEADROOM is (batch 12, no checkpointing, LoRA rank 8); the
runner-up RUNNER_UP is 3.1% behind it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from conftest import TINY_LLAMA, make_spec_file

from trainfit.files import write_atomically
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.spec import Spec, load_spec

GiB = 1024**3
BUDGET, HEADROOM = 40.0, 2.0
"""The synthetic spec's budget.memory_gb and budget.headroom_gb (GiB)."""

GRID = [{"batch_size": b, "gradient_checkpointing": g, "lora_r": r}
        for b in (1, 2, 4, 8, 12, 16, 24, 32) for g in (False, True) for r in (8, 16)]
"""Every config of `synthetic_spec`'s search space (32)."""

RUNNER_UP = (24, True, 8)  # 3.1% behind the best feasible config of Surface (12, False, 8)

PROBE_S = 0.0
"""How long a Slow probe lasts (s): instant, the hardest case for two runs' claims on one config.
``TrialStore.claimed_elsewhere`` reads RUNNING trials before COMPLETE ones, so a probe that ends
between the two reads is still seen (read the other way round, about half the runs of
test_runs_sharing_a_storage_split_the_work_without_probing_a_config_twice[grid] probed a config twice)."""

RENDEZVOUS_GUARD_S = 60.0
"""How long a run's first probe waits for the other runs' before the test fails (a hang guard only)."""


class Surface:
    """Memory = 10 GiB + bs x per-sample cost; throughput saturates in bs. Checkpointing halves
    activation memory and costs 30% speed; LoRA rank 16 is 5% slower than 8."""

    def __init__(self, budget_gb: float = BUDGET) -> None:
        self.calls: list[dict[str, Any]] = []
        self.budget_gb = budget_gb

    def memory_gb(self, p: Params) -> float:
        return 10.0 + p.batch_size * (0.9 if p.gradient_checkpointing else 1.8) * (1 + (p.lora_r or 0) / 200)

    def throughput(self, p: Params) -> float:
        step = (1.3 if p.gradient_checkpointing else 1.0) * (1.05 if p.lora_r == 16 else 1.0)
        return p.batch_size / (0.5 + 0.1 * step * (p.batch_size + 1.5))

    def __call__(self, p: Params, number: int) -> Measurement:
        self.calls.append(p.to_dict())
        common = {"config": p.to_dict(), "budget_memory_gb": self.budget_gb, "budget_headroom_gb": HEADROOM,
                  "device": "cpu", "device_name": "synthetic", "wall_time_s": 1.0 + p.batch_size / 16}
        mem = self.memory_gb(p)
        if mem > self.budget_gb:  # the allocator fails before the step completes
            return Measurement(status="oom", message="synthetic OOM", peak_memory_bytes=int(self.budget_gb * GiB),
                               **common)
        sps = self.throughput(p)
        return Measurement(status="ok", samples_per_second=sps, tokens_per_second=sps * 100,
                           peak_memory_bytes=int(mem * GiB), steps_measured=5, stable=True, **common)

    def best_feasible(self, configs: list[dict[str, Any]]) -> float:
        ok = [self.throughput(Params(**c)) for c in configs
              if self.memory_gb(Params(**c)) + HEADROOM <= BUDGET]
        return max(ok)


class Noisy(Surface):
    """Each probe's CI: 4% for the runner-up, 0.1% elsewhere."""

    def __call__(self, p: Params, number: int) -> Measurement:
        m = super().__call__(p, number)
        ci = 0.04 if (p.batch_size, p.gradient_checkpointing, p.lora_r) == RUNNER_UP else 0.001
        return Measurement.from_dict({**m.to_dict(), "step_time_ci95_rel": ci})


class Slow(Surface):
    """The probe of one of several runs sharing a storage (each in its own process): its calls go
    to the file ``log``, and each lasts PROBE_S, as a real probe outlasts the storage round trips
    of a run's claim on a config (see the note at PROBE_S).

    With ``rendezvous`` (a folder every run is given), the first probe of each run marks its
    arrival there and waits until ``parties`` runs have started one: the runs overlap by
    construction, not by timing, and each probes at least one config."""

    def __init__(self, log: Path, rendezvous: Path | None = None, parties: int = 2) -> None:
        super().__init__()
        self.log = log
        self.rendezvous = rendezvous
        self.parties = parties

    def arrive(self) -> None:
        """Mark this run's arrival at the rendezvous, and wait for the other runs' (see the class)."""
        assert self.rendezvous is not None
        self.rendezvous.mkdir(parents=True, exist_ok=True)
        (self.rendezvous / str(os.getpid())).touch()
        deadline = time.monotonic() + RENDEZVOUS_GUARD_S
        while len(list(self.rendezvous.iterdir())) < self.parties:
            assert time.monotonic() < deadline, f"the other runs never started a probe ({self.rendezvous})"
            time.sleep(0.01)

    def __call__(self, p: Params, number: int) -> Measurement:
        if self.rendezvous is not None and not self.calls:
            self.arrive()
        time.sleep(PROBE_S)
        m = super().__call__(p, number)
        write_atomically(self.log, json.dumps(self.calls))  # read while the runs go on: never half of it
        return m


def synthetic_spec(tmp_path: Path, strategy: str, *, no_budget: bool = False, **tune_extra: Any) -> Spec:
    """A spec searching GRID with ``strategy`` at effective batch 32; ``tune_extra``: more tune: keys."""
    budget = {"headroom_gb": HEADROOM} if no_budget else {"memory_gb": BUDGET, "headroom_gb": HEADROOM}
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64}, budget=budget)
    text = path.read_text() + (
        "search:\n  batch_size: [1, 2, 4, 8, 12, 16, 24, 32]\n  gradient_checkpointing: [false, true]\n"
        "  lora_r: [8, 16]\n"
        f"tune:\n  strategy: {strategy}\n  target_effective_batch: 32\n"
        + "".join(f"  {k}: {v}\n" for k, v in tune_extra.items()))
    path.write_text(text)
    return load_spec(path)


def store_for(spec: Any, output: Path, **kw: Any) -> Any:
    """The study store a run of ``spec`` writing to ``output`` opens (``kw``: resume, storage, join)."""
    from trainfit.search.study import TrialStore

    return TrialStore(output=output, spec=spec, space=spec.search, objective="samples_per_second",
                      seed=0, **{"resume": False, "storage": None, **kw})


def fixed_speed(samples_per_second: float = 50.0, step_time_s: float | None = None, ci95_rel: float | None = None):
    """A probe function that is not a probe, for tests about what a tune leaves behind (its folder,
    its command, its calibration): every config fits, at ``samples_per_second`` (an expected step of
    ``step_time_s``, where a trainer's cost must be added to it; its step time's 95% interval
    ``ci95_rel``)."""

    def probe(params: Params, number: int) -> Measurement:
        return Measurement(status="ok", config=params.to_dict(), samples_per_second=samples_per_second,
                           tokens_per_second=samples_per_second * 100, peak_memory_bytes=GiB, steps_measured=5,
                           stable=True, device="cpu", cpu_threads=2, expected_step_time_s=step_time_s,
                           step_time_ci95_rel=ci95_rel)

    return probe

