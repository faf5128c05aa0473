"""Do a real run's steps keep one pace, or speed up as it goes? (issue 20)

The plan's calibration times a few tens of trainer steps near the start of a run; the monitor
projects the end from the first tenth. Both assume the steps keep one pace. On an H200 (2026-11-26)
a ~0.93B Llama padded to the longest ran its second epoch 29% faster per step than its first, on
the same samples: this script shows such a trajectory, one run at a time.

The setup of bench/plan_eta.py (the long-tailed standard-library docstrings, LoRA r=16, padding to
the longest, or with ``--padding max_length`` to one fixed length), a tune of one config (batch 4), a plan of ``--epochs`` epochs without calibration,
then `trainfit train` of it with an on-track check every 0.2 s. The result: the run's wall time,
its seconds and real tokens per 10 steps (the trainer's own log), each on-track check (step,
elapsed, projected end), the seconds per step of each epoch, and the monitor's projection at 10%
against the end. ``--env K=V`` (repeatable) goes into
the training process's environment, e.g. ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

    python bench/step_trajectory.py --cuda --model-1b --epochs 2          # on a GPU
    python bench/step_trajectory.py --samples 40 --epochs 2               # a CPU rehearsal
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from epoch_fidelity import base_overrides, corpus_file  # noqa: E402
from plan_eta import at_tenth, model_overrides  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune

ROOT = Path(__file__).resolve().parents[1]


def per_epoch(logs: list[dict], steps_per_epoch: int) -> dict[int, float]:
    """Seconds per step of each epoch (numbered from 1), from the trainer's logs (every 10 steps)
    that fall on or inside its bounds (the first epoch from the first log, past the first step's
    warm-up); an epoch with fewer than two logs is left out."""
    marks = {e["step"]: e["elapsed_s"] for e in logs}
    bounds = sorted(marks)
    out = {}
    for epoch, start in enumerate(range(0, max(bounds), steps_per_epoch), start=1):
        inside = [s for s in bounds if start <= s <= start + steps_per_epoch]
        if len(inside) >= 2:
            out[epoch] = (marks[inside[-1]] - marks[inside[0]]) / (inside[-1] - inside[0])
    return out


def trajectory(args: argparse.Namespace, work: Path) -> dict:
    from trainfit.plan import make_plan
    from trainfit.spec import load_spec
    from trainfit.tune import tune

    data = corpus_file(work, args.samples)
    overrides = [*base_overrides(data, args.max_length, probe_seconds=15, cuda=args.cuda), *model_overrides(args),
                 f"padding={args.padding}", f"search.batch_size=[{args.batch_size}]", "search.gradient_checkpointing=[false]",
                 "search.lora_r=[16]", "tune.target_effective_batch=null"]
    run_dir = work / "run"
    start = time.perf_counter()
    tune(with_tune(load_spec(ROOT / "examples" / "tiny-llama.yaml", overrides), strategy="grid"),
         TuneOptions(output=run_dir, calibrate_steps=0))
    tune_s = time.perf_counter() - start
    plan = make_plan(run_dir, max_hours=10, epochs=args.epochs, priority="fast")
    (run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf"), **dict(kv.split("=", 1) for kv in args.env)}
    out = work / "train"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainfit", "train", str(run_dir), "--output", str(out),
                           "--monitor-seconds", "0.2", "--", "--report_to", "none"],
                          env=env, capture_output=True, text=True, timeout=7200, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"trainfit train failed:\n{(done.stdout + done.stderr)[-3000:]}")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    logs = [{"step": e["step"], "elapsed_s": e["elapsed_s"], "num_tokens": e["num_tokens"]}
            for e in log if e["event"] == "log" and "num_tokens" in e]
    end = next(e for e in log if e["event"] == "end")
    return {"tune_s": tune_s, "train_wall_s": wall, "steps": end["step"], "elapsed_s": end["elapsed_s"],
            "planned_s": plan.eta.total_s, "probe_step_s": plan.eta.step_time_s,
            "seconds_per_step_by_epoch": per_epoch(logs, max(1, round(plan.eta.steps / args.epochs))),
            "monitor_at_tenth": at_tenth(log, end),
            "logs": logs,
            "on_track": [{"step": e["step"], "elapsed_s": e["elapsed_s"], "projected_s": e["projected_s"]}
                         for e in log if e["event"] == "on_track"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=float, default=2)
    ap.add_argument("--padding", choices=["longest", "max_length"], default="longest",
                    help="max_length: one padded shape for every step (does the speed-up need new shapes?)")
    ap.add_argument("--cuda", action="store_true", help="probe and train on the GPU, in bf16")
    ap.add_argument("--model-1b", action="store_true", help="a ~0.93B Llama shape (bench/plan_eta.py)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="set in the training process's environment (repeatable)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="step-trajectory-") as work:
        result = trajectory(args, Path(work))
    dump("step_trajectory", {"setup": vars(args), "device": "cuda" if args.cuda else "cpu", **result})


if __name__ == "__main__":
    main()
