"""Probe figures of issue 2, on the bundled tiny Llama (CPU unless a GPU is visible):

1. overhead: the probe's mean step time vs a bare training loop of the same model and batch in
   one process (fixed padding, so both time the same shapes); ratio should be <= 1.03;
2. latency: process start to JSON for one probe, with the phase breakdown (goal <= 15 s);
3. stability: the same probe 5 times; spread (max/min) of samples/s.

    python bench/probe_overhead.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402

EXAMPLE = ROOT / "examples" / "tiny-llama.yaml"
# No dataset: every sample is max_length long, so the probe and the bare loop run identical
# batches (no padding mask on either side).
STEPS = 100
OVERRIDES = ["padding=max_length", "max_length=512", "batch_size=4", "gradient_accumulation_steps=1",
             "probe.max_seconds=600", f"probe.max_steps={STEPS}", f"probe.min_steps={STEPS}",
             "probe.target_rel_ci=0.0000001", "probe.burn_in_steps=5"]


def _spec_without_data() -> Path:
    import yaml

    doc = yaml.safe_load(EXAMPLE.read_text())
    for key in ("data", "tokenizer", "search", "tune"):
        doc.pop(key, None)
    path = Path(tempfile.mkdtemp()) / "tiny-llama-nodata.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


SPEC = _spec_without_data()


def bare_loop(steps: int) -> float:
    """Mean step time of a plain loop: same model, same batch shape, same optimizer, one process."""
    import torch

    from trainfit.params import Params
    from trainfit.spec import load_spec
    from trainfit.workloads.step import TrainStep
    from trainfit.workloads import build_workload

    spec = load_spec(SPEC, OVERRIDES)
    params: Params = spec.params
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    workload = build_workload(spec, params, device)
    step = TrainStep(workload, params, device)
    batch = workload.make_batch([512] * params.batch_size, 512)
    for _ in range(5 + 2):  # the probe's 2 memory steps + 5 burn-in steps
        step.run([batch])
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step.run([batch])
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.fmean(times)


def probe_once() -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "trainfit", "probe", str(SPEC), "--quiet", "--json", str(out)]
        for o in OVERRIDES:
            cmd += ["--set", o]
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - t
        import json

        m = json.loads(out.read_text())
    return {"cli_wall_s": wall, "samples_per_second": m["samples_per_second"],
            "step_time_mean_s": m["step_time_mean_s"],
            "steps": m["steps_measured"], "stable": m["stable"], "phases_s": m["phases_s"]}


def bare_once() -> float:
    """The bare loop in a fresh process of its own, as the probe has."""
    out = subprocess.run([sys.executable, __file__, "--bare"], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare:
        print(bare_loop(steps=STEPS))
        return
    probes, bares = [], []
    for _ in range(args.repeats):  # pairs run back to back, so machine drift hits both alike
        probes.append(probe_once())
        bares.append(bare_once())
    sps = [p["samples_per_second"] for p in probes]
    ratios = [p["step_time_mean_s"] / b for p, b in zip(probes, bares)]
    dump("probe_overhead", {
        "config": OVERRIDES,
        "timed_steps_each": STEPS,
        "probe_step_time_s": [round(p["step_time_mean_s"], 5) for p in probes],
        "bare_loop_step_time_s": [round(b, 5) for b in bares],
        "paired_ratios": [round(r, 4) for r in ratios],
        "overhead_ratio_median_of_pairs": statistics.median(ratios),
        "probe_cli_wall_s": [round(p["cli_wall_s"], 2) for p in probes],
        "phases_s_first_run": probes[0]["phases_s"],
        "samples_per_second_runs": [round(x, 2) for x in sps],
        "samples_per_second_spread_max_over_min": max(sps) / min(sps),
        "stable_runs": sum(1 for p in probes if p["stable"]),
    })


if __name__ == "__main__":
    main()
