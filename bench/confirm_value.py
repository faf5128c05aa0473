"""Does ``tune --confirm N`` pick a faster config on a noisy machine? (issue 4)

For each workload of ``bench/search_efficiency.py`` (same spaces, budgets and short probes):
``--runs`` live ``auto`` tunes without confirmation and as many with ``--confirm ROUNDS``,
alternating (a drift of the machine hits both arms alike). Then every config that any run picked
or named as a near-tie is measured ``--reference-rounds`` more times, round-robin, each probe in a
fresh worker; the median of those is the config's reference speed. Reported per arm: each pick's
reference speed over the best reference speed (1.0 = the fastest candidate), and the probe time.

    python bench/confirm_value.py [--workloads llama,gpt2,tts] [--runs 4] [--rounds 2] [--reference-rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402
from search_efficiency import load, progress  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune


def live(spec, rounds: int, label: str) -> dict[str, Any]:
    from trainfit.tune import tune

    spec = dataclasses.replace(spec, tune=dataclasses.replace(spec.tune, confirm_rounds=rounds))
    with tempfile.TemporaryDirectory() as tmp:
        res = tune(with_tune(spec, strategy="auto", max_trials=10**6), TuneOptions(output=tmp, calibrate_steps=0,
                                                                                   on_event=progress(label)))
    summary = res.summary.to_json()
    confirmed = summary["confirmation"]  # with repeats, the near-ties are the confirmed configs
    return {"confirm_rounds": rounds, "pick": res.best.values if res.best else None,
            "near_ties": [e["searched"] for e in summary["within_noise_of_best"] + confirmed],
            "probes": len(res.trials), "confirmation_probes": sum(len(e["measurements"]) - 1 for e in confirmed),
            "probe_time_s": summary.get("probe_time_s")}


def reference(spec, configs: list[dict[str, Any]], rounds: int) -> dict[str, float]:
    """Median samples/s of each config over ``rounds`` fresh-worker probes, round-robin."""
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe.runner import run_probe
    from trainfit.search.trials import config_key

    stats = analyze_spec(spec, progress=False)
    runs: dict[str, list[float]] = {config_key(c): [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for i, c in enumerate(configs):
                m = run_probe(spec, spec.search.params(c), stats=stats, workdir=Path(tmp) / f"{r}-{i}")
                runs[config_key(c)].append(m.samples_per_second if m.fits else 0.0)
                print(f"  reference round {r + 1}/{rounds} config {i + 1}/{len(configs)}", file=sys.stderr, flush=True)
    return {k: statistics.median(v) for k, v in runs.items()}


def main() -> None:
    from trainfit.search.trials import config_key

    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="llama,gpt2,tts")
    ap.add_argument("--runs", type=int, default=4, help="live tunes per arm and workload")
    ap.add_argument("--rounds", type=int, default=2, help="--confirm N of the confirming arm")
    ap.add_argument("--reference-rounds", type=int, default=5)
    args = ap.parse_args()
    results = {}
    for name in args.workloads.split(","):
        spec = load(name)
        runs = []
        for i in range(args.runs):
            arms = (0, args.rounds) if i % 2 == 0 else (args.rounds, 0)
            runs += [live(spec, rounds, f"{name} run {i + 1} confirm {rounds}") for rounds in arms]
        candidates = {config_key(c): c for r in runs for c in [r["pick"], *r["near_ties"]] if c is not None}
        ref = reference(spec, list(candidates.values()), args.reference_rounds)
        top = max(ref.values())
        for r in runs:
            r["pick_reference_over_best"] = ref[config_key(r["pick"])] / top if r["pick"] else 0.0
        arms = {}
        for rounds in (0, args.rounds):
            mine = [r for r in runs if r["confirm_rounds"] == rounds]
            scores = [r["pick_reference_over_best"] for r in mine]
            arms[f"confirm_{rounds}"] = {"median_pick_over_best": statistics.median(scores),
                                         "worst_pick_over_best": min(scores),
                                         "median_probe_time_s": statistics.median(r["probe_time_s"] for r in mine)}
        results[name] = {"arms": arms, "reference_samples_per_s": ref, "runs": runs}
    dump("confirm_value", {"runs_per_arm": args.runs, "rounds": args.rounds,
                           "reference_rounds": args.reference_rounds, "workloads": results})


if __name__ == "__main__":
    main()
