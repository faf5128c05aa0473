"""Is the speed tune ranks by the speed of a real epoch on long-tailed data? (issue 19)

A long-tailed corpus of real English text (docstrings of Python's standard library: median far
below the mean, a tail past max_length), a Llama shape of ~18M parameters with LoRA r=16 in fp32
on the CPU, and for each batching (random order padded to the longest, fixed padding to
max_length, length-grouped) a real ``trainfit tune`` of batch sizes 1/2/4/8 with ``--calibrate N``
(the probes' expected speed over the epoch's own batches, then the trainer's own cost timed on the
pick by real steps and added to every config) against the very `trl sft` command that tune writes
for each config, trained for one whole epoch over the same samples (``train_runtime``: TRL's
training loop, tokenization and start-up excluded). Rounds interleave the tunes and the runs, so a
drift of the machine hits both alike.

    python bench/epoch_fidelity.py [--samples 600] [--batches 1,2,4,8] [--modes longest,max_length,grouped]
    python bench/epoch_fidelity.py ... --calibrate 0          # the probes alone, as before tune --calibrate
    python bench/epoch_fidelity.py ... --results epoch.json   # kept as each run ends: run again to go on
    python bench/epoch_fidelity.py --cuda --model-1b ...      # on a GPU: bf16, the ~1.1B shape of gpu_sweep.py
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Results, dump  # noqa: E402
from trl_fidelity import PLACEHOLDER, local_model  # noqa: E402
from trainfit.tune.options import TuneOptions
from trainfit.spec import with_tune

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 8,
         "num_key_value_heads": 8}
MODES = {"longest": ["padding=longest"], "max_length": ["padding=max_length"],
         "grouped": ["padding=longest", "group_by_length=true"]}


def corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` docstrings of the standard library's modules, classes and functions, drawn at random."""
    texts = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= 3:
                    texts.append(doc)
    return random.Random(seed).sample(texts, n)


def corpus_file(folder: Path, n: int) -> Path:
    """:func:`corpus` as ``folder/corpus.jsonl`` (a ``text`` field per line)."""
    path = folder / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(n)))
    return path


def base_overrides(data: Path, max_length: int, *, probe_seconds: float, cuda: bool = False) -> list[str]:
    """The bundled example turned into this benchmark's setup: the corpus, :data:`SHAPE` with LoRA
    r=16 on every linear layer, no accumulation; fp32 on the CPU or bf16 on a GPU."""
    return [f"data.path={data}", f"max_length={max_length}", "lora_r=16", "lora_target_modules=all-linear",
            "gradient_accumulation_steps=1", f"probe.max_seconds={probe_seconds:g}",
            f"budget.memory_gb={60 if cuda else 16}", *(f"model.config.{k}={v}" for k, v in SHAPE.items()),
            *(["probe.device=cuda", "precision=bf16"] if cuda else [])]


def trl_epoch(command: str, spec: Any, work: Path) -> dict[str, float]:
    """One epoch of a written ``trl sft`` command (one line): TRL's ``train_runtime`` and samples/s.
    Its model is the one the tune saved, or where the tune saved none (too large), ``spec``'s saved
    here."""
    if PLACEHOLDER in command and not (work / "model").is_dir():
        local_model(spec, work / "model")
    runnable = command.replace(PLACEHOLDER, str(work / "model")).replace(
        "--output_dir trainfit-run", f"--output_dir {work / 'out'} --report_to none --save_strategy no "
                                     "--logging_steps 100000")
    (work / "run.sh").write_text(runnable + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(work / "run.sh")], capture_output=True, text=True, env=env, timeout=3600)
    text = done.stdout + done.stderr
    runtime = re.search(r"'train_runtime': '?([0-9.]+)", text)
    rate = re.search(r"'train_samples_per_second': '?([0-9.]+)", text)
    if done.returncode != 0 or runtime is None or rate is None:
        raise RuntimeError(f"trl sft failed:\n{text[-3000:]}")
    return {"train_runtime_s": float(runtime.group(1)), "samples_per_second": float(rate.group(1))}


def tuned(spec: Any, stats: Any, folder: Path, calibrate: int) -> dict[str, Any]:
    """A real ``tune`` of every batch size (grid), with ``--calibrate`` when ``calibrate`` > 0: per
    batch size, the probe's speed, the tune's (the trainer's cost added) and the written command."""
    import time

    from trainfit.tune import tune

    started = time.perf_counter()
    options = TuneOptions(output=folder, stats=stats, calibrate_steps=calibrate,
                          on_calibration=lambda line: print(f"  calibration: {line}", file=sys.stderr, flush=True))
    result = tune(with_tune(spec, strategy="grid"), options)
    s = result.summary
    entries = [e for e in (s.best_config, *s.runners_up) if e is not None]
    cost = s.trainer_cost
    return {"wall_s": time.perf_counter() - started, "probe_time_s": s.probe_time_s,
            "trainer_cost": None if cost is None else cost.to_json(),
            "configs": {str(e.searched["batch_size"]): {
                "tune_samples_per_second": e.samples_per_second,
                "probe_samples_per_second": e.probe_speed, "padding_share": e.padding_share,
                "command": e.command} for e in entries}}


def main() -> None:
    from trainfit.data.analyze import analyze_spec
    from trainfit.spec import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--modes", default="longest,max_length,grouped")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--calibrate", type=int, default=30,
                    help="tune --calibrate N: the trainer's cost timed on the pick (0: the probes alone)")
    ap.add_argument("--cuda", action="store_true", help="probe and train on the GPU, in bf16")
    ap.add_argument("--model-1b", action="store_true", help="the ~1.1B Llama shape of gpu_sweep.py")
    ap.add_argument("--results", type=Path, help="keep each run's results here as they come; a second call resumes")
    args = ap.parse_args()
    results = Results.of_setup(args)
    work = Path(tempfile.mkdtemp(prefix="epoch-fidelity-"))
    base = base_overrides(corpus_file(work, args.samples), args.max_length, probe_seconds=30, cuda=args.cuda)
    if args.model_1b:
        from gpu_sweep import LLAMA_1B_OVERRIDES

        base += LLAMA_1B_OVERRIDES
    spec = load_spec(ROOT / "examples" / "tiny-llama.yaml", base)
    stats = analyze_spec(spec, progress=False)
    modes = args.modes.split(",")
    for r in range(args.rounds):
        for mode in modes:
            key = f"{r + 1}/{mode}"
            run_spec = load_spec(ROOT / "examples" / "tiny-llama.yaml",
                                 [*base, *MODES[mode], f"search={{batch_size: [{args.batches}]}}",
                                  "tune.target_effective_batch=null"])  # no accumulation: the batch is the step
            tune_row = results.get(f"{key}/tune") or results.put(
                f"{key}/tune", tuned(run_spec, stats, work / f"tune-{r + 1}-{mode}", args.calibrate))
            for b, config in tune_row["configs"].items():
                if results.get(f"{key}/{b}") is not None:
                    continue
                trl = trl_epoch(config["command"], run_spec, work)
                results.put(f"{key}/{b}", trl)
                print(f"round {r + 1} {mode} batch {b}: probe {config['probe_samples_per_second']:.2f}, tune "
                      f"{config['tune_samples_per_second']:.2f} samples/s (padding {config['padding_share']:.0%}), trl "
                      f"{trl['samples_per_second']:.2f} samples/s (epoch {trl['train_runtime_s']:.0f} s): "
                      f"{config['tune_samples_per_second'] / trl['samples_per_second']:.2f}x", file=sys.stderr,
                      flush=True)
    summarize(results, args, stats, modes, [int(b) for b in args.batches.split(",")])


def summarize(results: Results, args: argparse.Namespace, stats: Any, modes: list[str], batches: list[int]) -> None:
    table: dict[str, dict[str, Any]] = {}
    rounds = range(1, args.rounds + 1)
    for mode in modes:
        rows = {}
        for b in batches:
            tunes = [results.get(f"{r}/{mode}/tune")["configs"][str(b)] for r in rounds]
            trls = [results.get(f"{r}/{mode}/{b}") for r in rounds]

            def med(key: str, of: list[dict[str, Any]]) -> float:
                return statistics.median(x[key] for x in of)

            tune_sps, trl_sps = med("tune_samples_per_second", tunes), med("samples_per_second", trls)
            rows[b] = {"probe_samples_per_second": med("probe_samples_per_second", tunes),
                       "tune_samples_per_second": tune_sps, "trl_samples_per_second": trl_sps,
                       "tune_over_trl": tune_sps / trl_sps,
                       "probe_over_trl": med("probe_samples_per_second", tunes) / trl_sps,
                       "tune_epoch_s": stats.samples / tune_sps, "trl_epoch_s": med("train_runtime_s", trls),
                       "padding_share": tunes[0]["padding_share"]}
        order = {k: sorted(rows, key=lambda b: -rows[b][f"{k}_samples_per_second"]) for k in ("probe", "tune", "trl")}
        costs = [results.get(f"{r}/{mode}/tune") for r in rounds]
        table[mode] = {"batches": rows, "probe_ranking": order["probe"], "tune_ranking": order["tune"],
                       "trl_ranking": order["trl"], "same_ranking": order["tune"] == order["trl"],
                       "trainer_cost_per_micro_batch_s": [c["trainer_cost"] and c["trainer_cost"]["per_micro_batch_s"]
                                                          for c in costs],
                       "tune_wall_s": [c["wall_s"] for c in costs]}
    import trl

    dump("epoch_fidelity", {"trl": trl.__version__, "samples": stats.samples, "lengths": {
        "median": stats.percentiles["p50"], "mean": stats.mean, "p99": stats.percentiles["p99"], "max": stats.max},
        "max_length": args.max_length, "model_shape": "llama-1.1b" if args.model_1b else SHAPE, "lora_r": 16,
        "precision": "bf16" if args.cuda else "fp32", "device": "cuda" if args.cuda else "cpu",
        "rounds": args.rounds, "calibrate": args.calibrate, "modes": table})


if __name__ == "__main__":
    main()
