"""Does `trainfit plan`'s ETA, made before training, hold for the whole run? (issue 20)

The same long-tailed real text as bench/epoch_fidelity.py (docstrings of Python's standard
library) and its ~18M-parameter Llama shape with LoRA r=16 in fp32 on the CPU. For each padding
(to the longest sample, to max_length): `trainfit tune` over batch sizes 1/2/4 (grid), then
`trainfit plan` with and without `--calibrate N`, then the planned `trl sft` command (the plan's
own: one epoch, its checkpoint flags) run as a user runs it, timed from launch to exit, then
`trainfit train` of the same plan (the plan.json written into the tune folder), timed from
launch to exit, with its monitor's projection of the end read from its log at 10% of the steps.
Each runner is held to its own ETA: `trainfit train` to the plan's (`eta.total_s`), the written
command to `eta.command_total_s` (the same steps, its own start-up under `accelerate launch`).
With ``--eval-samples N`` the run evaluates on N other docstrings ``--eval-passes`` times
(``trainfit plan --eval-data``: one pass timed forward-only and priced into the ETA); the row
then holds the plan's pass against each pass's ``eval_runtime`` in `trainfit train`'s log.

    python bench/plan_eta.py [--samples 300] [--calibrate 20] [--modes longest,max_length]
    python bench/plan_eta.py --modes longest --eval-samples 60 --eval-passes 4
    python bench/plan_eta.py ... --results plan_eta.json   # kept as each mode ends: run again to go on
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Results, dump  # noqa: E402
from epoch_fidelity import SHAPE, base_overrides, corpus, corpus_file  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune

ROOT = Path(__file__).resolve().parents[1]
MODES = {"longest": ["padding=longest"], "max_length": ["padding=max_length"]}


def run_written(command: str, cwd: Path) -> float:
    """Launch-to-exit seconds of ``command`` run by bash in ``cwd`` (trl beside this Python first)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.perf_counter()
    done = subprocess.run(["bash", "-c", command + " --report_to none"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=7200)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the planned command failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return wall


def run_trainfit_train(run_dir: Path, out: Path, monitor_every_s: float) -> tuple[float, dict, list[dict]]:
    """Launch-to-exit seconds of `trainfit train` of ``run_dir``'s plan, its train_result.json and log."""
    import json

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out.parent / "hf")}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainfit", "train", str(run_dir), "--output", str(out),
                           "--monitor-seconds", f"{monitor_every_s:g}", "--", "--report_to", "none"],
                          env=env, capture_output=True, text=True, timeout=7200, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"trainfit train failed:\n{(done.stdout + done.stderr)[-3000:]}")
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return wall, json.loads((out / "train_result.json").read_text()), log


def at_tenth(log: list[dict], result: dict) -> dict | None:
    """The monitor's first projection at or past 10% of the steps, against the actual end; beside
    it, where the plan was calibrated, the projection at the run's own pace alone (``own_pace``)."""
    first = next((e for e in log if e["event"] == "on_track" and e["step"] >= 0.1 * e["max_steps"]), None)
    if first is None:
        return None
    end = result["elapsed_s"]
    own = first.get("own_pace_projected_s")
    return {"step": first["step"], "max_steps": first["max_steps"], "projected_s": first["projected_s"],
            "actual_elapsed_s": end, "error": (first["projected_s"] - end) / end,
            "own_pace_projected_s": own, "own_pace_error": None if own is None else (own - end) / end}


def eval_file(work: Path, n: int) -> Path:
    """``n`` docstrings drawn with another seed than the training corpus's, as ``work/eval.jsonl``."""
    import json

    path = work / "eval.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(n, seed=1)))
    return path


def evaluations(log: list[dict], planned: object) -> dict | None:
    """The plan's evaluation against the passes `trainfit train` logged."""
    ev = getattr(planned, "evaluation", None)
    if ev is None:
        return None
    runtimes = [e["eval_runtime"] for e in log if e["event"] == "log" and "eval_runtime" in e]
    eta = planned.eta  # type: ignore[attr-defined]
    return {"every": ev.every, "planned_passes": eta.evals, "planned_pass_s": ev.pass_s, "planned_eval_s": eta.eval_s,
            "spread_rel": ev.spread_rel, "passes": len(runtimes), "eval_runtime_s": runtimes,
            "actual_eval_s": sum(runtimes),
            "error_per_pass": (ev.pass_s - sum(runtimes) / len(runtimes)) / (sum(runtimes) / len(runtimes))
            if runtimes else None}


def one_mode(mode: str, args: argparse.Namespace, data: Path, work: Path) -> dict:
    from dataclasses import replace

    from trainfit.plan import make_plan
    from trainfit.plan.inputs import best_step_cost
    from trainfit.trainer.calibration import calibrate
    from trainfit.spec import load_spec
    from trainfit.tune import tune

    overrides = [*base_overrides(data, args.max_length, probe_seconds=20, cuda=args.cuda), *model_overrides(args),
                 *MODES[mode],
                 "search.batch_size=[1, 2, 4]", "search.gradient_checkpointing=[false]", "search.lora_r=[16]",
                 "tune.target_effective_batch=null"]
    spec = load_spec(ROOT / "examples" / "tiny-llama.yaml", overrides)
    run_dir = work / mode
    start = time.perf_counter()
    tune(with_tune(spec, strategy="grid"), TuneOptions(output=run_dir, calibrate_steps=0))
    tune_s = time.perf_counter() - start
    evaluate = {}
    if args.eval_samples:
        steps = make_plan(run_dir, max_hours=10, epochs=1, priority="fast").eta.steps
        evaluate = {"eval_data": eval_file(work, args.eval_samples), "eval_every": -(-steps // args.eval_passes)}
    plain = make_plan(run_dir, max_hours=10, epochs=1, priority="fast", **evaluate)
    start = time.perf_counter()
    cal = calibrate(run_dir, args.calibrate, step_cost=best_step_cost(run_dir),
                    on_progress=lambda line: print(f"  {line}", file=sys.stderr))
    calibrate_s = time.perf_counter() - start
    planned = make_plan(run_dir, max_hours=10, epochs=1, priority="fast", calibration=cal, **evaluate)
    # The same calibration compared with the probe's epoch average, as before its batches were priced.
    averaged = make_plan(run_dir, max_hours=10, epochs=1, priority="fast", calibration=replace(cal, model_step_s=None),
                         **evaluate)
    assert planned.command is not None
    (work / f"{mode}-run").mkdir()
    actual = run_written(planned.command, work / f"{mode}-run")
    import json

    (run_dir / "plan.json").write_text(json.dumps(planned.to_json(), indent=2) + "\n")
    train_wall, result, log = run_trainfit_train(run_dir, work / f"{mode}-train", planned.eta.total_s / 40)
    tenth = at_tenth(log, result)
    row = {"tune_s": tune_s, "calibrate_s": calibrate_s, "trial": planned.trial, "searched": planned.searched,
           "actual_s": actual, "calibration": cal.to_json(),
           "eta_calibrated": planned.eta.to_json(), "eta_probe_only": plain.eta.to_json(),
           "command_eta_s": planned.eta.command_total_s,
           "error_calibrated": (planned.eta.total_s - actual) / actual,
           "error_command": (planned.eta.command_total_s - actual) / actual,  # the command against its own ETA
           "error_probe_only": (plain.eta.total_s - actual) / actual,
           "inside_interval": planned.eta.low_s <= actual <= planned.eta.high_s,
           "trainfit_train_s": train_wall, "error_trainfit_train": (planned.eta.total_s - train_wall) / train_wall,
           "trainfit_train_inside_interval": planned.eta.low_s <= train_wall <= planned.eta.high_s,
           "eta_epoch_average": averaged.eta.to_json(),
           "error_trainfit_train_epoch_average": (averaged.eta.total_s - train_wall) / train_wall,
           "trainfit_train_steps": result["step"], "monitor_at_tenth": tenth,
           "on_track": [{k: e.get(k) for k in ("step", "elapsed_s", "projected_s", "own_pace_projected_s")}
                        for e in log if e["event"] == "on_track"],
           "plan": planned.to_json(), "evaluation": evaluations(log, planned)}
    print(f"{mode}: trial {planned.trial} {planned.searched}: written command {actual:.1f} s launch to exit "
          f"(its ETA {planned.eta.command_total_s:.1f} s); trainfit train {train_wall:.1f} s (its ETA "
          f"{planned.eta.total_s:.1f} s, {planned.eta.low_s:.1f}-{planned.eta.high_s:.1f}); probe only "
          f"{plain.eta.total_s:.1f} s; monitor at 10%: {tenth}", file=sys.stderr, flush=True)
    return row


def model_overrides(args: argparse.Namespace) -> list[str]:
    """``--model-1b``: gpu_sweep.py's 1.1B Llama shape cut to 18 layers (~0.93B), under the 1B
    parameters up to which tune saves the random-init model its command trains (a larger one's
    command has a placeholder no calibration can run)."""
    if not args.model_1b:
        return []
    from gpu_sweep import LLAMA_1B_OVERRIDES

    return [*LLAMA_1B_OVERRIDES, "model.config.num_hidden_layers=18"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--calibrate", type=int, default=20, help="real trainer steps of the calibration")
    ap.add_argument("--modes", default="longest,max_length")
    ap.add_argument("--eval-samples", type=int, default=0, help="evaluate on this many other docstrings")
    ap.add_argument("--eval-passes", type=int, default=4, help="evaluation passes in the epoch")
    ap.add_argument("--cuda", action="store_true", help="probe and train on the GPU, in bf16")
    ap.add_argument("--model-1b", action="store_true", help="a ~0.93B Llama shape (see model_overrides)")
    ap.add_argument("--results", type=Path, help="keep each mode's results here as they come; a second call resumes")
    args = ap.parse_args()
    results = Results.of_setup(args)
    work = Path(tempfile.mkdtemp(prefix="plan-eta-"))
    data = corpus_file(work, args.samples)
    for mode in args.modes.split(","):
        if results.get(mode) is None:
            results.put(mode, one_mode(mode, args, data, work))
    import trl

    dump("plan_eta", {"trl": trl.__version__, "samples": args.samples, "max_length": args.max_length,
                      "eval_samples": args.eval_samples, "eval_passes": args.eval_passes,
                      "model_shape": model_overrides(args) or SHAPE, "device": "cuda" if args.cuda else "cpu",
                      "calibrate_steps": args.calibrate,
                      "modes": {m: results.get(m) for m in args.modes.split(",")}})


if __name__ == "__main__":
    main()
