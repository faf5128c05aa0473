"""How far apart do two configs measure when probed back to back, again and again? (issue 4)

The floor under every ranking on a machine: tiny Llama of the search-efficiency run (its short
probes), LoRA r=8 at batch 2 and batch 4, each probe in a fresh worker, ``--rounds`` pairs in a
row. Reported: the spread of each config's samples/s and of the ratio batch 4 / batch 2 within a
pair. Also tried: normalizing each probe by a fixed matmul kernel timed just before and after it
(a machine-speed calibration), to see whether the drift is one a simple kernel sees.

    python bench/paired_noise.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from search_efficiency import load  # noqa: E402


def kernel_rate(seconds: float = 1.0) -> float:
    """256x256 fp32 matmuls per second in this process."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    for _ in range(20):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            a @ b
        n += 50
    return n / (time.perf_counter() - start)


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "max": max(values), "max_over_min": max(values) / min(values),
            "cv": statistics.pstdev(values) / statistics.fmean(values)}


def main() -> None:
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe.runner import run_probe

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    spec = load("llama")
    stats = analyze_spec(spec, progress=False)
    rows = []
    for r in range(args.rounds):
        for b in (2, 4):
            before = kernel_rate()
            m = run_probe(spec, spec.search.params({"batch_size": b, "gradient_checkpointing": False, "lora_r": 8}),
                          stats=stats)
            rows.append({"round": r, "batch_size": b, "samples_per_second": m.samples_per_second,
                         "step_time_ci95_rel": m.step_time_ci95_rel, "kernel_rate": (before + kernel_rate()) / 2})
            print(f"  round {r + 1}/{args.rounds} batch {b}: {m.samples_per_second:.1f} samples/s", file=sys.stderr,
                  flush=True)
    by_b = {b: [x for x in rows if x["batch_size"] == b] for b in (2, 4)}
    raw = [hi["samples_per_second"] / lo["samples_per_second"] for lo, hi in zip(by_b[2], by_b[4], strict=True)]
    norm = [(hi["samples_per_second"] / hi["kernel_rate"]) / (lo["samples_per_second"] / lo["kernel_rate"])
            for lo, hi in zip(by_b[2], by_b[4], strict=True)]
    dump("paired_noise", {
        "rounds": args.rounds, "rows": rows,
        "samples_per_second": {str(b): spread([x["samples_per_second"] for x in v]) for b, v in by_b.items()},
        "median_within_probe_ci95": statistics.median(x["step_time_ci95_rel"] for x in rows),
        "ratio_b4_over_b2": {"raw": spread(raw), "kernel_normalized": spread(norm)}})


if __name__ == "__main__":
    main()
