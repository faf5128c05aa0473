"""Search efficiency (issue 4) on real CPU workloads, and on a GPU (``llama1b``).

For each workload the full grid (>= 24 configs) is measured with real probes under a real memory
cap, in this run, each in a fresh worker (``probe.reuse_model=false``: independent ground truth).
Then every strategy is replayed against those measurements: a probe returns the grid's
measurement of that config and costs its measured wall time, minus its start and model build
when it follows a successful probe of the same model family (what ``tune`` does with a reused
worker, see ``probe.reuse_model``). Reported:
- auto: best found vs the grid's best, and its probe time as a share of the grid's (the grid
  with fresh workers, as measured, and the grid with reuse, as ``tune --strategy grid`` runs it);
- random, Optuna TPE and the GP sampler (bayes): best found within auto's probe time, per seed;
- OOM probes spent by each, and the probe time each needs to first find a config within 3% of
  the grid's best (random/TPE/GP: median over seeds, with the whole grid's worth of probes);
- auto live: a real ``tune`` (real probes, reused workers) of the same space, its probe time and
  the grid-measured speed of the config it recommends.

    python bench/search_efficiency.py [--seeds 5] [--workloads llama,gpt2,tts] [--save-tables DIR]
    python bench/search_efficiency.py --tables DIR     # replay saved grids (strategy work, not for the docs)
    python bench/search_efficiency.py --workloads llama1b --work DIR --time-budget 480   # on a GPU; again
                                                       # with the same DIR until it prints the results
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from gpu_sweep import LLAMA_1B_OVERRIDES  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune

# The model's own loss over the full logits (a trainer of one's own, not `trl sft`): TRL's fused head
# allocates 32,768-column tiles for these 2,000-word vocabularies and runs its CPU fallback, which
# on this CPU makes the fastest config batch 1-2 whatever the budget (tested: 2026-11-22), a space
# with no memory boundary to find. The full logits make batch 4-8 the best and the boundary real.
OWN_LOSS = "tune.command_template=python train.py"
FAST = ["probe.max_seconds=2", "probe.min_steps=3", "probe.max_steps=40", "probe.burn_in_steps=1"]
CPU = ["probe.device=cpu"]
WORKLOADS: dict[str, tuple[str, list[str], dict[str, list[Any]]]] = {
    "llama": ("tiny-llama.yaml", [*CPU, "budget.memory_gb=0.8", "budget.headroom_gb=0.05", "max_length=1024", OWN_LOSS],
              {"batch_size": [1, 2, 4, 8, 16, 32], "gradient_checkpointing": [False, True], "lora_r": [None, 8]}),
    "gpt2": ("tiny-gpt2.yaml", [*CPU, "budget.memory_gb=0.8", "budget.headroom_gb=0.05", "max_length=1024", OWN_LOSS],
             {"batch_size": [1, 2, 4, 8, 16, 32], "padding": ["longest", "max_length"], "precision": ["fp32", "bf16"]}),
    "tts": ("tiny-tts.yaml", [*CPU, "budget.memory_gb=1.0", "budget.headroom_gb=0.05"],
            {"batch_size": [1, 2, 4, 8, 16, 32], "ddpm_batch_mul": [2, 8], "gradient_checkpointing": [False, True]}),
    # Issue 4's GPU figure: the ~1.1B Llama shape of gpu_sweep.py in bf16 on the bundled data, computing
    # the loss as `trl sft` does (its fused head), under a 40 GiB budget that full fine-tuning without
    # checkpointing meets within the batch sizes searched.
    "llama1b": ("tiny-llama.yaml", [*LLAMA_1B_OVERRIDES, "probe.device=cuda", "precision=bf16", "max_length=2048",
                                    "budget.memory_gb=40", "budget.headroom_gb=1"],
                {"batch_size": [1, 2, 4, 8, 16, 32], "gradient_checkpointing": [False, True], "lora_r": [None, 16]}),
}


def load(workload: str):
    import yaml

    from trainfit.spec import load_spec

    name, overrides, space = WORKLOADS[workload]
    src = ROOT / "examples" / name
    doc = yaml.safe_load(src.read_text())
    doc["search"] = space
    doc.setdefault("tune", {})["target_effective_batch"] = None
    doc["tune"]["max_trials"] = None
    for key in ("model", "data"):
        for k in ("path", "factory"):
            if isinstance(doc.get(key), dict) and doc[key].get(k):
                doc[key][k] = str(src.parent / doc[key][k])
    if "tokenizer" in doc:
        doc["tokenizer"] = str(src.parent / doc["tokenizer"])
    tmp = Path(tempfile.mkdtemp()) / name
    tmp.write_text(yaml.safe_dump(doc))
    return load_spec(tmp, overrides + FAST)


def replay(spec, strategy: str, table: dict[str, Any], seed: int, sampler: Any = None):
    from trainfit.search.trials import config_key
    from trainfit.spec import TuneSettings
    from trainfit.tune import tune

    # patience = the grid's size: "no better config in the last N probes" never ends a replay early,
    # while a sampler that only proposes measured configs still stops after N in a row (as in a tune;
    # an unbounded patience let a converged GP replay ask forever, each ask a GP fit)
    spec = dataclasses.replace(spec, tune=TuneSettings(strategy=strategy, seed=seed, patience=len(table),
                                                       objective="samples_per_second"))
    with tempfile.TemporaryDirectory() as tmp:
        res = tune(with_tune(spec, max_trials=len(table)), TuneOptions(
            output=tmp, probe_fn=lambda p, n: table[config_key({k: p.to_dict()[k] for k in spec.search.names})],
            sampler=sampler, device_type=spec.probe.device, calibrate_steps=0))
    return sorted(res.trials, key=lambda t: t.number)


def probe_costs(trials) -> list[float]:
    """Seconds each trial's probe costs in a tune with reused workers: its measured (fresh) wall
    time, less start and build when the previous probe was a successful one of the same family
    with batches no larger (the rule of ProbeSession)."""
    from trainfit.params import memory_grows
    from trainfit.search.trials import model_family

    costs, previous = [], None
    for t in trials:
        m = t.measurement
        cost = m.wall_time_s or 0.0
        if previous is not None and previous.measurement.status == "ok" and \
                model_family(previous.values) == model_family(t.values) and \
                memory_grows(previous.values, t.values) and t.values.get("compile", "off") == "off":
            cost -= m.phases_s.get("start", 0.0) + m.phases_s.get("build", 0.0)
        costs.append(cost)
        previous = t
    return costs


def best_within(trials, budget_s: float) -> tuple[float, int, int]:
    """(best feasible samples/s, probes, OOM probes) among the trials run within ``budget_s``."""
    spent, best, n, ooms = 0.0, 0.0, 0, 0
    for t, cost in zip(trials, probe_costs(trials), strict=True):
        spent += cost
        if spent > budget_s:
            break
        n += 1
        ooms += t.measurement.status == "oom"
        if t.feasible and t.objective:
            best = max(best, t.objective)
    return best, n, ooms


def progress(label: str):
    from trainfit.search.events import TrialEnd

    return lambda e: isinstance(e, TrialEnd) and print(
        f"  {label} {e.index}/{e.max_trials}", file=sys.stderr, flush=True)


def measure(spec, strategy: str, folder: Path | None, label: str, time_budget_s: float | None):
    """A real ``tune`` of ``spec`` (real probes); in ``folder``, resumed if a call before was cut
    short by its ``time_budget_s``. None when this call's time ran out first."""
    from trainfit.tune import tune

    with contextlib.ExitStack() as stack:
        out = folder or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        res = tune(with_tune(spec, strategy=strategy, max_trials=10**6, time_budget_s=time_budget_s),
                             TuneOptions(output=out, resume=(out / "study.journal").exists(), on_event=progress(label),
                                         calibrate_steps=0))
    return None if res.stop_reason.startswith("time budget") else res


def live_auto(res, table: dict[str, Any], truth: float) -> dict[str, Any]:
    """A real ``tune`` with ``auto``: real probes in reused workers. Its pick is scored by the
    grid's measurement of that config (one noisy probe is no ground truth)."""
    from trainfit.search.trials import config_key

    pick = table[config_key(res.best.values)] if res.best else None
    return {"probes": len(res.trials), "probe_wall_s": round(sum(t.measurement.wall_time_s for t in res.trials), 1),
            "reused_probes": sum(t.measurement.model_reused for t in res.trials),
            "oom_probes": sum(t.measurement.status == "oom" for t in res.trials),
            "pick": res.best.values if res.best else None,
            "pick_grid_samples_per_s_over_truth": pick.samples_per_second / truth if pick and pick.fits else 0.0,
            "pick_fits_per_grid": bool(pick and pick.fits)}


def time_to_reach(trials, target: float) -> float:
    """Probe seconds until a feasible config with samples/s >= ``target`` was found (inf: never)."""
    spent = 0.0
    for t, cost in zip(trials, probe_costs(trials), strict=True):
        spent += cost
        if t.feasible and t.objective and t.objective >= target:
            return spent
    return float("inf")


def main() -> None:
    import optuna

    from trainfit.probe.measurement import Measurement
    from trainfit.search.trials import config_key

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workloads", default="llama,gpt2,tts")
    ap.add_argument("--save-tables", type=Path, help="write each measured grid here as JSON")
    ap.add_argument("--tables", type=Path, help="replay grids saved by --save-tables instead of measuring")
    ap.add_argument("--work", type=Path, help="keep the grids and the live searches here: the same command "
                                             "again (after --time-budget or a crash) goes on")
    ap.add_argument("--time-budget", type=float, help="start no probe after this many seconds (this call)")
    args = ap.parse_args()
    deadline = time.monotonic() + args.time_budget if args.time_budget else None

    def left() -> float | None:
        return None if deadline is None else max(1.0, deadline - time.monotonic())

    def folder(name: str, what: str) -> Path | None:
        return args.work / name / what if args.work else None

    results = {}
    for name in args.workloads.split(","):
        spec = load(name)
        if args.tables:
            saved = json.loads((args.tables / f"{name}.json").read_text())
            table = {k: Measurement.from_dict(v) for k, v in saved.items()}
        else:  # ground truth: the whole grid, real probes, each in a fresh worker
            fresh = dataclasses.replace(spec, probe=dataclasses.replace(spec.probe, reuse_model=False))
            grid = measure(fresh, "grid", folder(name, "grid"), f"{name} grid", left())
            live = grid and measure(spec, "auto", folder(name, "live"), f"{name} auto live", left())
            if live is None:
                dump("search_efficiency", {"status": "incomplete", "workload": name,
                                           "next": "run the same command again: it goes on"})
                return
            table = {config_key(t.values): t.measurement for t in grid.trials}
        if args.save_tables:
            args.save_tables.mkdir(parents=True, exist_ok=True)
            (args.save_tables / f"{name}.json").write_text(json.dumps({k: m.to_dict() for k, m in table.items()}))
        grid_time = sum(m.wall_time_s for m in table.values())
        grid_reuse_time = sum(probe_costs(replay(spec, "grid", table, 0)))
        truth = max(m.samples_per_second for m in table.values() if m.fits)
        auto = replay(spec, "auto", table, 0)
        auto_time = sum(probe_costs(auto))
        auto_best, auto_n, auto_oom = best_within(auto, float("inf"))
        rows: dict[str, Any] = {"auto": {"best_over_truth": auto_best / truth, "probes": auto_n, "oom_probes": auto_oom,
                                         "probe_time_share_of_grid": auto_time / grid_time,
                                         "probe_time_share_of_grid_with_reuse": auto_time / grid_reuse_time,
                                         "seconds_to_within_3pct": time_to_reach(auto, 0.97 * truth)}}
        for label, strategy, make_sampler in (
            ("random", "random", lambda s: None),
            ("tpe", "bayes", lambda s: optuna.samplers.TPESampler(seed=s)),
            ("gp", "bayes", lambda s: optuna.samplers.GPSampler(seed=s, n_startup_trials=5)),
        ):
            runs = [replay(spec, strategy, table, s, make_sampler(s)) for s in range(args.seeds)]
            per_seed = [best_within(trials, auto_time) for trials in runs]
            rows[label] = {"median_best_over_truth_at_auto_time": statistics.median(b / truth for b, _, _ in per_seed),
                           "median_probes": statistics.median(n for _, n, _ in per_seed),
                           "mean_oom_probes": statistics.fmean(o for _, _, o in per_seed),
                           # the whole grid's worth of probes, not only auto's time
                           "median_seconds_to_within_3pct": statistics.median(
                               time_to_reach(trials, 0.97 * truth) for trials in runs)}
        if not args.tables:
            rows["auto_live"] = live_auto(live, table, truth)
        results[name] = {"grid_configs": len(table), "grid_probe_time_s": round(grid_time, 1),
                         "grid_with_reuse_probe_time_s": round(grid_reuse_time, 1),
                         "grid_oom": sum(1 for m in table.values() if m.status == "oom"),
                         "grid_best_samples_per_s": truth, "strategies": rows}
    dump("search_efficiency", {"seeds": args.seeds, "workloads": results})


if __name__ == "__main__":
    main()
