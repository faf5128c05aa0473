"""What does a training step pay the first time it meets a padded length? (issue 20)

On an H200 (2026-11-26) a ~0.93B Llama padded to the longest ran its second epoch 29% faster than
its first, on the same samples; at one fixed length both epochs ran alike, and the caching
allocator's expandable segments did not remove the speed-up (bench/step_trajectory.py). This
script times it without a trainer: the probe's own model and step (trainfit's TrainStep on the
spec's workload), one step at each of a list of distinct padded lengths, then the same lengths
again. The first pass minus the second, per length, is what a new shape costs.

Each variant runs in a fresh process, so nothing is cached from the one before:
  random      the lengths in a shuffled order (as an epoch's batches meet them)
  descending  the longest first: the allocator's blocks grow once, at the start, and every later
              shape fits in them; a first-seen cost left here is not the allocator's growth
  flash       as random, with SDPA held to its flash kernel (torch.nn.attention.sdpa_kernel): a
              cost gone here belongs to the attention backend's choice per shape
  no-cudnn-benchmark  as random, with torch.backends.cudnn.benchmark off (the probe turns it on;
              the Hugging Face Trainer leaves it off)

    python bench/shape_warmup.py --cuda --model-1b          # on a GPU
    python bench/shape_warmup.py --stride 64                # a CPU rehearsal (the example's tiny model)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from plan_eta import model_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("random", "descending", "flash", "no-cudnn-benchmark")


def one_variant(args: argparse.Namespace) -> dict:
    """Both passes of ``args.variant``, in this process: seconds of each step by length."""
    import contextlib

    import torch

    from trainfit.spec import load_spec
    from trainfit.devices import synchronize
    from trainfit.workloads.step import TrainStep
    from trainfit.workloads import build_workload

    overrides = ["lora_r=16", "lora_target_modules=all-linear", f"batch_size={args.batch_size}",
                 "gradient_accumulation_steps=1", f"max_length={args.max_length}", *model_overrides(args),
                 *(["probe.device=cuda", "precision=bf16"] if args.cuda else [])]
    spec = load_spec(ROOT / "examples" / "tiny-llama.yaml", overrides)
    device = torch.device("cuda" if args.cuda else "cpu")
    workload = build_workload(spec, spec.params, device)
    step = TrainStep(workload, spec.params, device)
    if args.variant == "no-cudnn-benchmark":
        torch.backends.cudnn.benchmark = False
    kernel: contextlib.AbstractContextManager = contextlib.nullcontext()
    if args.variant == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kernel = sdpa_kernel(SDPBackend.FLASH_ATTENTION if args.cuda else SDPBackend.MATH)
    lengths = list(range(args.shortest, args.max_length + 1, args.stride))
    warm = args.shortest - 1  # a length outside the list: the process's own first-step warm-up
    order = (sorted(lengths, reverse=True) if args.variant == "descending"
             else random.Random(0).sample(lengths, len(lengths)))

    def timed(length: int) -> float:
        batch = workload.make_batch([length] * args.batch_size, length)
        synchronize(device)
        start = time.perf_counter()
        step.run([batch])  # its loss is read back: one host sync, as a trainer's logging has
        synchronize(device)
        return time.perf_counter() - start

    with kernel:
        for _ in range(3):
            timed(warm)
        passes = [{length: timed(length) for length in order} for _ in range(2)]
    first, second = passes
    extra = [first[n] - second[n] for n in lengths]
    return {"variant": args.variant, "order": order, "first_s": first, "second_s": second,
            "first_mean_s": statistics.fmean(first.values()), "second_mean_s": statistics.fmean(second.values()),
            "first_seen_cost_s": {"mean": statistics.fmean(extra), "median": statistics.median(extra)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda", action="store_true", help="on the GPU, in bf16")
    ap.add_argument("--model-1b", action="store_true", help="a ~0.93B Llama shape (bench/plan_eta.py)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--shortest", type=int, default=64)
    ap.add_argument("--stride", type=int, default=8, help="between the lengths timed")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in this process
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(one_variant(args)))
        return
    runs = []
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r}: pick from {', '.join(VARIANTS)}")
        argv = [f"--batch-size={args.batch_size}", f"--max-length={args.max_length}", f"--shortest={args.shortest}",
                f"--stride={args.stride}", *(["--cuda"] if args.cuda else []),
                *(["--model-1b"] if args.model_1b else [])]
        done = subprocess.run([sys.executable, __file__, *argv, f"--variant={variant}"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"variant {variant} failed:\n{done.stderr[-3000:]}")
        run = json.loads(done.stdout.splitlines()[-1])
        print(f"{variant}: first pass {run['first_mean_s']:.4f} s a step, second {run['second_mean_s']:.4f}; "
              f"a new length costs {run['first_seen_cost_s']['median']:.4f} s (median)", file=sys.stderr, flush=True)
        runs.append(run)
    setup = {k: v for k, v in vars(args).items() if k != "variant"}
    dump("shape_warmup", {"setup": setup, "runs": runs})


if __name__ == "__main__":
    main()
