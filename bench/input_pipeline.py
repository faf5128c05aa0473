"""The probe's input pipeline (``probe.data``), two figures of issue #32:

1. A loader-bound workload: a tiny TTS model whose collate decodes WAV files into features
   (bench/audio_factory.py). The probe at ``num_workers: 0`` (the loader in the training process)
   against the tune's pick of ``search: {num_workers: auto}``: samples/s and the input-bound share.
2. The probe's overhead of ``probe.data: real`` against ``synthetic`` on a model-bound workload
   (examples/tiny-llama.yaml, the README's): probe wall seconds, paired rounds.

    python bench/input_pipeline.py --files 240 --rounds 3

Prints one JSON object."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import dump, write_wav  # noqa: E402

from trainfit.cli import main as cli  # noqa: E402
from trainfit.probe import run_probe  # noqa: E402
from trainfit.spec import load_spec  # noqa: E402


def write_audio(folder: Path, files: int, rate: int = 16_000) -> Path:
    """FILES WAV files of noise, 1-6 s each (16 kHz mono 16-bit), and their manifest."""
    rng = random.Random(0)
    rows = []
    for i in range(files):
        samples = np.random.default_rng(i).integers(-3000, 3000, int(rng.uniform(1, 6) * rate), dtype=np.int16)
        write_wav(folder / f"{i}.wav", samples.tobytes(), rate)
        rows.append(json.dumps({"path": f"{i}.wav"}))
    manifest = folder / "manifest.jsonl"
    manifest.write_text("\n".join(rows) + "\n")
    return manifest


def audio_spec(folder: Path, manifest: Path, repeats: int, device: str) -> Path:
    spec = {"model": {"factory": f"{HERE / 'audio_factory.py'}:make_workload"},
            "data": {"path": str(manifest), "audio_field": "path", "length_scale": 100},
            "params": {"batch_size": 8, "max_length": 600, "audio_root": str(folder), "decode_repeats": repeats},
            "probe": {"device": device, "max_seconds": 15, "max_steps": 40},
            "search": {"num_workers": "auto"}}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def loader_bound(files: int, repeats: int, device: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = audio_spec(folder, write_audio(folder, files), repeats, device)
        rows = {}
        for label, overrides in (("synthetic", ["probe.data=synthetic"]), ("workers_0", [])):
            m = run_probe(load_spec(spec, overrides))
            rows[label] = {"samples_per_second": m.samples_per_second, "data_wait_s": m.data_wait_s,
                           "input_bound_share": m.input_bound_share, "stable": m.stable}
        out = folder / "tune"
        with contextlib.redirect_stdout(sys.stderr):  # the tune's report; stdout is the JSON
            assert cli(["tune", str(spec), "--output", str(out), "--strategy", "grid"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        best = summary["best_config"]
        rows["tuned"] = {"num_workers": best["config"]["num_workers"], "samples_per_second": best["samples_per_second"]}
        rows["tuned_over_workers_0"] = best["samples_per_second"] / rows["workers_0"]["samples_per_second"]
        return rows


def overhead(rounds: int, device: str) -> dict[str, object]:
    spec = HERE.parent / "examples" / "tiny-llama.yaml"
    walls: dict[str, list[float]] = {"real": [], "synthetic": []}
    for _ in range(rounds):
        for mode in ("real", "synthetic"):
            m = run_probe(load_spec(spec, [f"probe.data={mode}", f"probe.device={device}"]))
            assert m.status == "ok" and m.data == mode, m.message
            walls[mode].append(m.wall_time_s or 0.0)
    ratio = statistics.median(walls["real"]) / statistics.median(walls["synthetic"])
    return {"wall_s": walls, "median_ratio_real_over_synthetic": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=240)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-repeats", type=int, default=8,
                    help="spectrograms computed per clip: a heavier input pipeline at the same model cost")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--device", default="cpu", help="the probes' device (cuda: the model on the GPU, the loader on "
                                                     "the host's cores)")
    args = ap.parse_args()
    result = {"decode_repeats": args.decode_repeats, "device": args.device,
              "loader_bound": loader_bound(args.files, args.decode_repeats, args.device)}
    if not args.skip_overhead:
        result["overhead"] = overhead(args.rounds, args.device)
    dump("input_pipeline", result)


if __name__ == "__main__":
    main()
