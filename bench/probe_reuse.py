"""Model reuse (issue 4): probes of one model family in one worker vs a fresh worker per probe.

On the bundled tiny Llama and its dataset (CPU unless a GPU is visible), each round probes the
batch sizes in ascending order twice: in one ProbeSession (the model is built once) and with a
fresh worker each; the two orders alternate between rounds so drift of a noisy machine cancels.
Reported per batch size: the median over rounds of reused/fresh samples/s and peak memory, and
the total probe wall time of each mode.

    python bench/probe_reuse.py [--rounds 5] [--batches 2,4,8,16] [--seconds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402

EXAMPLE = ROOT / "examples" / "tiny-llama.yaml"


def main() -> None:
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe.runner import ProbeSession, run_probe
    from trainfit.spec import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", default="2,4,8,16")
    ap.add_argument("--seconds", type=float, default=3.0, help="probe.max_seconds of each probe")
    ap.add_argument("--set", action="append", default=[], help="extra spec overrides, e.g. precision=bf16")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    spec = load_spec(EXAMPLE, [f"probe.max_seconds={args.seconds}", "gradient_accumulation_steps=1", *args.set])
    stats = analyze_spec(spec, progress=False)

    def sweep(reuse: bool) -> list:
        with ProbeSession() as session:
            return [run_probe(spec, dataclasses.replace(spec.params, batch_size=b), stats=stats,
                              session=session if reuse else None) for b in batches]

    runs: dict[str, list[list]] = {"reused": [], "fresh": []}
    for r in range(args.rounds):
        for mode in (("reused", "fresh") if r % 2 == 0 else ("fresh", "reused")):
            runs[mode].append(sweep(mode == "reused"))
            print(f"  round {r + 1}/{args.rounds} {mode} done", file=sys.stderr, flush=True)
    for sweeps in runs.values():
        for ms in sweeps:
            bad = [m for m in ms if m.status != "ok"]
            assert not bad, bad[0].message

    rows = {}
    for i, b in enumerate(batches):
        pairs = list(zip(runs["reused"], runs["fresh"], strict=True))
        rows[b] = {
            "samples_per_s_reused_over_fresh": statistics.median(
                r[i].samples_per_second / f[i].samples_per_second for r, f in pairs),
            "peak_memory_reused_over_fresh": statistics.median(
                r[i].peak_memory_bytes / f[i].peak_memory_bytes for r, f in pairs),
            "fresh_peak_memory_spread": max(f[i].peak_memory_bytes for _, f in pairs)
            / min(f[i].peak_memory_bytes for _, f in pairs),
            "median_wall_s": {mode: statistics.median(s[i].wall_time_s for s in runs[mode]) for mode in runs},
        }
    total = {mode: statistics.median(sum(m.wall_time_s for m in s) for s in runs[mode]) for mode in runs}
    dump("probe_reuse", {
        "spec": str(EXAMPLE.relative_to(ROOT)), "overrides": args.set, "batches": batches, "rounds": args.rounds,
        "probe_max_seconds": args.seconds, "per_batch": rows,
        "median_sweep_wall_s": total, "sweep_wall_reused_over_fresh": total["reused"] / total["fresh"],
        "build_phases_s_fresh": statistics.median(
            m.phases_s["start"] + m.phases_s["build"] for s in runs["fresh"] for m in s),
    })


if __name__ == "__main__":
    main()
