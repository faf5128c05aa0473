"""What a crash costs `trainfit train` (issue 20): the time from `--resume` to the first new step,
the work lost since the last checkpoint, and whether the resumed run ends where an uninterrupted one does.

The setup of bench/plan_eta.py (stdlib docstrings, the ~18M-parameter Llama shape, LoRA r=16,
fp32, CPU), one config (batch 1, padding to the longest). Then:

1. `trainfit train` uninterrupted for `--steps` steps, a checkpoint every `--every-s` seconds;
2. the same, killed with SIGKILL once its log shows step `--kill-at` (a step logged each step);
3. `trainfit train --resume`, timed from launch to its first new step (the log's `first_step`).

    python bench/train_resume.py [--samples 300] [--steps 120] [--kill-at 75] [--every-s 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from epoch_fidelity import SHAPE, base_overrides, corpus_file  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune

ROOT = Path(__file__).resolve().parents[1]


def launch(run_dir: Path, out: Path, args: argparse.Namespace, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out.parent / "hf")}
    return subprocess.Popen([sys.executable, "-m", "trainfit", "train", str(run_dir), "--output", str(out),
                             "--checkpoint-minutes", f"{args.every_s / 60:g}", "--max-steps", str(args.steps), *extra,
                             "--", "--logging_steps", "1", "--report_to", "none"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)


def events(out: Path) -> list[dict]:
    path = out / "train_log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out / "adapter_model.safetensors")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--kill-at", type=int, default=75)
    ap.add_argument("--every-s", type=float, default=20.0)
    args = ap.parse_args()
    import torch

    from trainfit.spec import load_spec
    from trainfit.tune import tune

    work = Path(tempfile.mkdtemp(prefix="train-resume-"))
    data = corpus_file(work, args.samples)
    spec = load_spec(ROOT / "examples" / "tiny-llama.yaml",
                     [*base_overrides(data, args.max_length, probe_seconds=10), "padding=longest",
                      "search.batch_size=[1]", "search.gradient_checkpointing=[false]", "search.lora_r=[16]",
                      "tune.target_effective_batch=null"])
    run_dir = work / "tune"
    tune(with_tune(spec, strategy="grid"), TuneOptions(output=run_dir, calibrate_steps=0))

    fresh_launched = time.time()
    start = time.perf_counter()
    whole = launch(run_dir, work / "whole", args)
    assert whole.wait() == 0
    whole_s = time.perf_counter() - start
    whole_log = events(work / "whole")
    fresh_first = next(e for e in whole_log if e["event"] == "first_step")

    start = time.perf_counter()
    crashed = launch(run_dir, work / "crashed", args)
    while not any(e["event"] == "log" and e["step"] >= args.kill_at for e in events(work / "crashed")):
        assert crashed.poll() is None, "the run ended before the kill"
        time.sleep(0.05)
    crashed.send_signal(signal.SIGKILL)
    crashed.wait()
    crashed_s = time.perf_counter() - start
    log = events(work / "crashed")
    killed_at = max(e["step"] for e in log if e["event"] == "log")
    saved = max((e["step"] for e in log if e["event"] == "checkpoint"), default=0)
    steps = [e for e in log if e["event"] == "log"]
    step_s = (steps[-1]["elapsed_s"] - steps[0]["elapsed_s"]) / max(1, steps[-1]["step"] - steps[0]["step"])

    launched = time.time()
    start = time.perf_counter()
    resumed = launch(run_dir, work / "crashed", args, "--resume")
    assert resumed.wait() == 0
    resumed_s = time.perf_counter() - start
    first = next(e for e in events(work / "crashed") if e["event"] == "first_step" and e["time"] >= launched)
    a, b = weights(work / "whole"), weights(work / "crashed")
    row = {
        "uninterrupted_s": whole_s, "crashed_run_s": crashed_s, "resumed_run_s": resumed_s,
        "fresh_launch_to_first_step_s": fresh_first["time"] - fresh_launched,
        "resume_launch_to_first_step_s": first["time"] - launched,
        "killed_at_step": killed_at, "last_checkpoint_step": saved, "steps_lost": killed_at - saved,
        "step_s": step_s, "work_lost_s": (killed_at - saved) * step_s, "checkpoint_every_s": args.every_s,
        "overhead_s": crashed_s + resumed_s - whole_s,
        "same_weights_bitwise": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
    }
    print(json.dumps(row, indent=2), file=sys.stderr)
    dump("train_resume", {"samples": args.samples, "max_length": args.max_length, "model_shape": SHAPE,
                          "steps": args.steps, "kill_at": args.kill_at, **row})


if __name__ == "__main__":
    main()
