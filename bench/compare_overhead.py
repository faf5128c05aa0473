"""What `trainfit compare` spends on a config beyond its steps (issue 21): evaluation passes, a
loss logged every step, the curve callback, its own process.

The long-tailed docstring corpus and ~18M-parameter Llama (LoRA r=16, fp32, CPU) of
bench/epoch_fidelity.py. `trainfit compare` trains each config for --steps steps with an eval set
evaluated --passes times; then the same config's `trl sft` command (the very arguments the
comparison ran, less the eval set, logging and callback) trains the same steps, and TRL's
`train_runtime` is the plain figure. Per config: the comparison's steps + passes against the plain
steps, the passes' share, and the process's start-up.

    python bench/compare_overhead.py [--steps 60] [--passes 4] [--samples 300]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from epoch_fidelity import SHAPE, base_overrides, corpus, corpus_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = "low_lr: {learning_rate: 1.0e-4}\nhigh_lr: {learning_rate: 1.0e-3}\n"


def plain_runtime(job: dict, steps: int, work: Path) -> float:
    """TRL's ``train_runtime`` of the job's own arguments with no eval set, logging or callback."""
    argv = list(job["argv"])
    if "--dataset_name" in argv:  # the eval split's folder: train on the same train split, evaluate nothing
        i = argv.index("--eval_strategy")
        argv = [*argv[:i], *argv[i + 8:]]  # --eval_strategy steps --eval_steps N --per_device_eval_batch_size B --dataset_test_split test
    given = job["given"]
    argv += [w for k, v in given.items() for w in (f"--{k}", str(v))]
    argv += ["--max_steps", str(steps), "--logging_steps", "100000", "--save_strategy", "no", "--report_to", "none",
             "--output_dir", str(work / "plain" / job["name"])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(job["threads"] or 1),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["trl", "sft", *argv], capture_output=True, text=True, env=env, timeout=3600)
    text = done.stdout + done.stderr
    found = re.search(r"'train_runtime': '?([0-9.]+)", text)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"the plain run failed:\n{text[-3000:]}")
    return float(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--eval-samples", type=int, default=40)
    ap.add_argument("--max-length", type=int, default=512)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compare-overhead-"))
    data = corpus_file(work, args.samples)
    eval_data = work / "eval.jsonl"
    eval_data.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(args.eval_samples, seed=1)))
    (work / "configs.yaml").write_text(CONFIGS)
    sets = [w for o in [*base_overrides(data, args.max_length, probe_seconds=20), "batch_size=2"] for w in ("--set", o)]
    out = work / "cmp"
    subprocess.run([sys.executable, "-m", "trainfit", "compare", str(ROOT / "examples" / "tiny-llama.yaml"), *sets,
                    "--configs", str(work / "configs.yaml"), "--steps", str(args.steps), "--eval-data", str(eval_data),
                    "--eval-every", str(max(1, args.steps // args.passes)), "--output", str(out)], check=True,
                   stdout=sys.stderr)  # stdout is the JSON result alone
    state = json.loads((out / "compare.json").read_text())
    rows = {}
    for name, run in state["runs"].items():
        job = json.loads((out / name / "job.json").read_text())
        plain = plain_runtime(job, args.steps, work)
        spent = run["train_s"] + run["eval_s"]
        rows[name] = {"train_s": run["train_s"], "eval_s": run["eval_s"], "passes": len(run["evals"]),
                      "wall_s": run["wall_s"], "plain_train_runtime_s": plain,
                      "steps_and_passes_over_plain": spent / plain - 1, "steps_over_plain": run["train_s"] / plain - 1,
                      "eval_share": run["eval_s"] / spent, "startup_s": run["wall_s"] - spent}
        print(f"{name}: steps {run['train_s']:.1f} s + passes {run['eval_s']:.1f} s against plain {plain:.1f} s "
              f"({spent / plain - 1:+.1%}; steps alone {run['train_s'] / plain - 1:+.1%}); process {run['wall_s']:.1f} s",
              file=sys.stderr, flush=True)
    dump("compare_overhead", {"steps": args.steps, "passes": args.passes, "samples": args.samples,
                              "eval_samples": args.eval_samples, "max_length": args.max_length, "model_shape": SHAPE,
                              "configs": rows})


if __name__ == "__main__":
    main()
