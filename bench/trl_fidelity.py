"""Do the probe's samples/s and peak memory hold in a real trainer? (issues 2 and 4)

The bundled tiny Llama on the bundled data, every batch padded to one length (so the worst-case
batch the probe measures memory on is every batch TRL trains on): for a few configs, trainfit's
probe (``loss: auto``: TRL's fused LM head, as `trl sft` computes the loss), the same probe with
the model's own loss over the full logits (``loss: model``, what the probe measured before it
followed TRL), a plain loop (trainfit's own training step fed by a DataLoader over the real
tokenized text, padding collator: what the probe's pre-built batches leave out of a bare loop),
and the very `trl sft` script `tune` writes for that config (TRL's own dataloader, collator and
trainer loop, started by `accelerate launch` as `trl` does), its training process's peak memory
reported through ``peak_site/sitecustomize.py``.
TRL's steady rate comes from two runs that differ only in `--max_steps` (short and long): the
extra samples over the extra `train_runtime`, so start-up and the first steps cancel out. Rounds
interleave probe and TRL runs, so a drift of the machine hits both alike.

    python bench/trl_fidelity.py [--rounds 2] [--steps 10,40] [--max-length 512]
    python bench/trl_fidelity.py --cuda [--model-1b]    # on a GPU: bf16, optionally the ~1.1B shape
    python bench/trl_fidelity.py ... --results fidelity.json   # each config's round kept as it ends:
                                              # the same command again (after a time limit) goes on
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Results, dump  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = "'<a local model folder: this spec builds a random-init model from a config>'"
CONFIGS = {
    "full, batch 2": {"batch_size": 2, "gradient_checkpointing": False, "lora_r": None},
    "LoRA r=8, batch 2": {"batch_size": 2, "gradient_checkpointing": False, "lora_r": 8},
    "LoRA r=8, batch 4, checkpointing": {"batch_size": 4, "gradient_checkpointing": True, "lora_r": 8},
}
PEAK = re.compile(r"^TRAINFIT_PEAK (.*)$", re.M)


def local_model(spec, folder: Path) -> Path:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from trainfit.workloads.hf import load_config

    AutoModelForCausalLM.from_config(load_config(spec.model)).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_file=str(spec.tokenizer), unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="<pad>").save_pretrained(folder)
    return folder


def trl_run(script: str, model: Path, steps: int, work: Path, cpu: bool) -> tuple[float, dict[str, Any]]:
    """``train_runtime`` and peak memory of the written command script, run for ``steps`` optimizer
    steps. ``peak_site`` on PYTHONPATH makes the training process (``accelerate launch``'s child,
    running trl's ``sft.py``) print its peak as it exits."""
    runnable = script.replace(PLACEHOLDER, str(model)).replace(
        "--output_dir trainfit-run", f"--output_dir {work / 'out'} --max_steps {steps} --report_to none "
                                     f"--save_strategy no --logging_steps 100000{' --use_cpu true' * cpu}")
    (work / "run.sh").write_text(runnable)
    site = str(Path(__file__).parent / "peak_site")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf"),
           "PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")])),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(work / "run.sh")], capture_output=True, text=True, env=env, timeout=900)
    found = re.search(r"'train_runtime': '?([0-9.]+)", done.stdout + done.stderr)
    peaks = [json.loads(p) for p in PEAK.findall(done.stdout)]
    trainer = [p for p in peaks if p["argv"] and p["argv"][0].endswith("sft.py")]
    if done.returncode != 0 or found is None or not trainer:
        raise RuntimeError(f"trl sft failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return float(found.group(1)), trainer[0]


def plain_loop(spec, params, token_ids: list[list[int]], pad_id: int, steps: int) -> float:
    """samples/s of trainfit's TrainStep over a shuffled DataLoader of the real token ids."""
    import torch

    from trainfit.devices import resolve_device_name
    from trainfit.devices import synchronize
    from trainfit.workloads.step import TrainStep
    from trainfit.workloads import build_workload
    from trainfit.workloads.base import Batch

    device = torch.device(resolve_device_name(spec.probe.device))
    workload = build_workload(spec, params, device)
    step = TrainStep(workload, params, device)
    max_len = params.max_length

    def collate(rows: list[list[int]]) -> Batch:
        rows = [r[:max_len] for r in rows]
        n = max_len if params.padding == "max_length" else max(len(r) for r in rows)
        ids = torch.full((len(rows), n), pad_id)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device),
                  "labels": ids.masked_fill(mask == 0, -100).to(device)}
        return Batch(inputs=inputs, seq_lens=tuple(len(r) for r in rows), padded_len=n)

    loader = torch.utils.data.DataLoader(token_ids, batch_size=params.batch_size, shuffle=True, collate_fn=collate)
    batches = iter(())

    def micro() -> Batch:
        nonlocal batches
        try:
            return next(batches)
        except StopIteration:
            batches = iter(loader)
            return next(batches)

    for _ in range(3):  # warm-up, as the probe's burn-in
        step.run([micro() for _ in range(params.gradient_accumulation_steps)])
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step.run([micro() for _ in range(params.gradient_accumulation_steps)])
    synchronize(device)
    return steps * params.effective_batch_size / (time.perf_counter() - start)


def main() -> None:
    from trainfit.trainer.command import command_script, trl_data_config
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe import run_probe
    from trainfit.trainer.command import command_inputs
    from trainfit.spec import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", default="10,40", help="the short and the long TRL run, in optimizer steps")
    ap.add_argument("--cuda", action="store_true", help="probe and train on the GPU, in bf16")
    ap.add_argument("--model-1b", action="store_true", help="the ~1.1B Llama shape of gpu_sweep.py")
    ap.add_argument("--max-length", type=int, default=512, help="every batch is padded (and truncated) to this")
    ap.add_argument("--results", type=Path, help="keep each round's results here as they come; a second call resumes")
    args = ap.parse_args()
    results = Results.of_setup(args)
    short, long = map(int, args.steps.split(","))
    overrides = [f"max_length={args.max_length}", "padding=max_length"]
    overrides += ["probe.device=cuda", "precision=bf16"] if args.cuda else []
    if args.model_1b:
        from gpu_sweep import LLAMA_1B_OVERRIDES

        overrides += LLAMA_1B_OVERRIDES
    spec = load_spec(ROOT / "examples" / "tiny-llama.yaml", overrides)  # target effective batch 32
    # The same probe with the model's own loss over the full logits: a template lifts the trl-only rule.
    full_logits = load_spec(ROOT / "examples" / "tiny-llama.yaml",
                            [*overrides, "loss=model", "tune.command_template=python train.py"])
    kinds = ("probe", "probe_full_logits", "plain", "trl")
    todo = [(r, name) for r in range(args.rounds) for name in CONFIGS if results.get(f"{r + 1}/{name}") is None]
    if todo:
        stats = analyze_spec(spec, progress=False)
        work = Path(tempfile.mkdtemp(prefix="trl-fidelity-"))
        model = local_model(spec, work / "model")
        data_config = work / "trl_data.yaml"
        data_config.write_text(yaml.safe_dump(trl_data_config(spec)))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        texts = [json.loads(line)[spec.data.text_field] for line in Path(spec.data.path).open()]
        token_ids = [tokenizer(t)["input_ids"] for t in texts]
    for r, name in todo:
        values = CONFIGS[name]
        params = spec.search.params(values)
        m = run_probe(spec, params, stats=stats)
        m_full = run_probe(full_logits, full_logits.search.params(values), stats=stats)
        assert m.status == m_full.status == "ok", (m.message, m_full.message)
        script = command_script(spec, params, "# trl_fidelity",
                                **command_inputs(params, m, stats, data_config))  # as `tune` writes it
        (t_short, _), (t_long, trl_peak) = (trl_run(script, model, n, work, cpu=not args.cuda)
                                            for n in (short, long))
        trl = (long - short) * params.effective_batch_size / (t_long - t_short)
        plain = plain_loop(spec, params, token_ids, tokenizer.pad_token_id, steps=long - short)
        results.put(f"{r + 1}/{name}", {
            **dict(zip(kinds, (m.samples_per_second, m_full.samples_per_second, plain, trl))),
            "peaks": {"probe": m.peak_memory_bytes, "probe_full_logits": m_full.peak_memory_bytes,
                      "probe_parts": m.memory_parts_bytes, "probe_full_logits_parts": m_full.memory_parts_bytes,
                      "trl": trl_peak}})
        print(f"round {r + 1} {name}: probe {m.samples_per_second:.1f} (full logits "
              f"{m_full.samples_per_second:.1f}), plain loop {plain:.1f}, trl {trl:.1f} samples/s; peak GiB "
              f"probe {m.peak_memory_bytes / 2**30:.2f} (full logits {m_full.peak_memory_bytes / 2**30:.2f}), "
              f"trl {trl_peak_bytes(trl_peak) / 2**30:.2f}", file=sys.stderr, flush=True)
    rows: dict[str, dict[str, list[Any]]] = {name: {k: [] for k in (*kinds, "peaks")} for name in CONFIGS}
    for r in range(args.rounds):
        for name in CONFIGS:
            row = results.get(f"{r + 1}/{name}")
            for kind in (*kinds, "peaks"):
                rows[name][kind].append(row[kind])
    table = {}
    for name, v in rows.items():
        rate = {k: statistics.median(v[k]) for k in kinds}
        peak = {k: statistics.median(p[k] for p in v["peaks"]) for k in ("probe", "probe_full_logits")}
        peak["trl"] = statistics.median(trl_peak_bytes(p["trl"]) for p in v["peaks"])
        table[name] = {**{f"{k}_samples_per_s": rate[k] for k in kinds},
                       **{f"{k}_over_probe": rate[k] / rate["probe"] for k in kinds if k != "probe"},
                       **{f"{k}_peak_gib": peak[k] / 2**30 for k in peak},
                       "trl_peak_over_probe": peak["trl"] / peak["probe"],
                       "trl_peak_over_probe_full_logits": peak["trl"] / peak["probe_full_logits"], "raw": v}
    order = {kind: sorted(table, key=lambda n: -table[n][f"{kind}_samples_per_s"]) for kind in kinds}
    import trl

    dump("trl_fidelity", {"trl": trl.__version__, "rounds": args.rounds, "trl_steps": [short, long],
                          "max_length": args.max_length, "padding": "max_length",
                          "peak_memory": "CUDA: max reserved bytes; CPU: the process's peak RSS (VmHWM)",
                          "configs": table, "rankings": order,
                          "same_ranking": order["probe"] == order["plain"] == order["trl"]})


def trl_peak_bytes(peak: dict[str, int]) -> int:
    """The TRL run's figure comparable to the probe's peak: CUDA max reserved, else peak RSS."""
    return peak.get("cuda_reserved_bytes", peak["rss_bytes"])


if __name__ == "__main__":
    main()
