"""What `OnTrackCallback` costs a training run (issue 20: step-time ratio <= 1.01).

A Hugging Face Trainer trains the ~18M-parameter Llama shape of bench/epoch_fidelity.py on random
tokens (batch 4, 128 tokens, CPU), alternating runs without the callback, with it at its default
(a check every 60 s) and with a check at every step (its worst case: a projection, a line and an
`on_track.json` written atomically per step). The figure is each run's `train_runtime` over the
same number of steps, medians over the rounds; and, as this VM's noise (+-10%) hides a 1% effect,
the callback's own time per check measured alone, against the step.

    python bench/monitor_overhead.py [--steps 60] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from epoch_fidelity import SHAPE  # noqa: E402


def plan_file(folder: Path) -> Path:
    """A plan whose window no run of this size misses (the check's figures do not matter here)."""
    from trainfit.plan import Plan
    from trainfit.plan.eta import Eta

    eta = Eta(samples=1, steps=1, train_s=3600.0, step_time_s=1.0, trainer_overhead_s=None, startup_s=None,
              checkpoints=1, checkpoint_s=0.0, total_s=3600.0, low_s=3000.0, high_s=4000.0, spread_rel=0.1)
    plan = Plan(created_at="", run_dir=str(folder), max_hours=2.0, margin_minutes=0.0, window_s=7200.0, epochs=1.0,
                dataset_samples=1, priority="fast", rule="", trial=0, searched={}, config={}, samples_per_second=1.0,
                peak_gb=0.0, command=None, save_steps=1, eta=eta, fits=True, checkpoint_every_s=1800.0,
                checkpoint_bytes=0, write_bytes_per_s=1.0, calibration=None, rests_on=[], priorities=[])
    path = folder / "plan.json"
    path.write_text(json.dumps(plan.to_json()))
    return path


def main() -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    import trainfit

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="monitor-overhead-"))
    plan = plan_file(work)
    config = AutoConfig.for_model("llama", vocab_size=2000, **SHAPE)
    ids = torch.randint(0, 2000, (4 * args.steps, 128), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row} for row in ids]
    kinds = {"without": None, "default": 60.0, "every_step": 0.0}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind, every in kinds.items():
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
            targs = TrainingArguments(output_dir=str(work / "out"), per_device_train_batch_size=4, max_steps=args.steps,
                                      report_to="none", save_strategy="no", use_cpu=True, logging_strategy="no",
                                      disable_tqdm=True)
            callbacks = [] if every is None else [trainfit.OnTrackCallback(plan=plan, every_s=every)]
            out = Trainer(model=model, args=targs, train_dataset=data, callbacks=callbacks).train()
            times[kind].append(out.metrics["train_runtime"])
            print(f"round {r + 1} {kind}: {out.metrics['train_runtime']:.2f} s", file=sys.stderr, flush=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    check_s = per_check_seconds(plan)
    dump("monitor_overhead", {"steps": args.steps, "rounds": args.rounds, "model_shape": SHAPE, "batch": 4,
                              "seq": 128, "train_runtime_s": times, "median_s": median,
                              "ratio_default": median["default"] / median["without"],
                              "ratio_every_step": median["every_step"] / median["without"],
                              "per_check_s": check_s,
                              "check_over_step_every_step": check_s / (median["without"] / args.steps)})


def per_check_seconds(plan: Path, n: int = 2000) -> float:
    """One check at its worst (every step): the callback's own time per ``on_step_end``, the
    projection, the line and the atomic ``on_track.json`` included (its output sent to a null file)."""
    import contextlib
    import os
    import time
    from types import SimpleNamespace

    import trainfit

    callback = trainfit.OnTrackCallback(plan=plan, every_s=0.0)
    callback.on_train_begin(None, None, None)
    state = SimpleNamespace(global_step=1, max_steps=n)
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        start = time.perf_counter()
        for step in range(1, n + 1):
            state.global_step = step
            callback.on_step_end(None, state, None)
        return (time.perf_counter() - start) / n


if __name__ == "__main__":
    main()
