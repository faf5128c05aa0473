"""Does the probe's samples/s hold in a real trainer? (issues 2 and 4)

The bundled tiny Llama on the bundled data: for a few configs, trainfit's probe, a plain loop
(trainfit's own training step fed by a DataLoader over the real tokenized text, padding collator:
what the probe's pre-built batches leave out of a bare loop), and the very `trl sft` command
`tune` writes for that config (TRL's own dataloader, collator and trainer loop).
TRL's steady rate comes from two runs that differ only in `--max_steps` (short and long): the
extra samples over the extra `train_runtime`, so start-up and the first steps cancel out. Rounds
interleave probe and TRL runs, so a drift of the machine hits both alike.

    python bench/trl_fidelity.py [--rounds 2] [--steps 10,40]
    python bench/trl_fidelity.py --cuda [--model-1b]    # on a GPU: bf16, optionally the ~1.1B shape
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

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import dump  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = "'<a local model folder: this spec builds a random-init model from a config>'"
CONFIGS = {
    "full, batch 2": {"batch_size": 2, "gradient_checkpointing": False, "lora_r": None},
    "LoRA r=8, batch 2": {"batch_size": 2, "gradient_checkpointing": False, "lora_r": 8},
    "LoRA r=8, batch 4, checkpointing": {"batch_size": 4, "gradient_checkpointing": True, "lora_r": 8},
}


def local_model(spec, folder: Path) -> Path:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from trainfit.workloads.hf import load_config

    AutoModelForCausalLM.from_config(load_config(spec.model)).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_file=str(spec.tokenizer), unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="<pad>").save_pretrained(folder)
    return folder


def trl_runtime(command: str, model: Path, steps: int, work: Path, cpu: bool) -> float:
    """``train_runtime`` of the written command run for ``steps`` optimizer steps."""
    runnable = command.replace(PLACEHOLDER, str(model)).replace(
        "--output_dir trainfit-run", f"--output_dir {work / 'out'} --max_steps {steps} --report_to none "
                                     f"--save_strategy no --logging_steps 100000{' --use_cpu true' * cpu}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", runnable], capture_output=True, text=True, env=env, timeout=900)
    found = re.search(r"'train_runtime': '?([0-9.]+)", done.stdout + done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"trl sft failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return float(found.group(1))


def plain_loop(spec, params, token_ids: list[list[int]], pad_id: int, steps: int) -> float:
    """samples/s of trainfit's TrainStep over a shuffled DataLoader of the real token ids."""
    import torch

    from trainfit.probe.runner import resolve_device_name
    from trainfit.step import TrainStep, synchronize
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
    from trainfit.command import build_command, trl_data_config
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe import run_probe
    from trainfit.spec import load_spec

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", default="10,40", help="the short and the long TRL run, in optimizer steps")
    ap.add_argument("--cuda", action="store_true", help="probe and train on the GPU, in bf16")
    ap.add_argument("--model-1b", action="store_true", help="the ~1.1B Llama shape of gpu_sweep.py")
    args = ap.parse_args()
    short, long = map(int, args.steps.split(","))
    overrides = ["probe.device=cuda", "precision=bf16"] if args.cuda else []
    if args.model_1b:
        from gpu_sweep import LLAMA_1B

        overrides += [f"model.config.{k}={v}" for k, v in LLAMA_1B.items() if k != "model_type"]
    spec = load_spec(ROOT / "examples" / "tiny-llama.yaml", overrides)  # target effective batch 32
    stats = analyze_spec(spec, progress=False)
    work = Path(tempfile.mkdtemp(prefix="trl-fidelity-"))
    model = local_model(spec, work / "model")
    data_config = work / "trl_data.yaml"
    data_config.write_text(yaml.safe_dump(trl_data_config(spec)))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [json.loads(line)[spec.data.text_field] for line in Path(spec.data.path).open()]
    token_ids = [tokenizer(t)["input_ids"] for t in texts]
    rows: dict[str, dict[str, list[float]]] = {name: {"probe": [], "plain": [], "trl": []} for name in CONFIGS}
    for r in range(args.rounds):
        for name, values in CONFIGS.items():
            params = spec.search.params(values)
            m = run_probe(spec, params, stats=stats)
            assert m.status == "ok", m.message
            command = build_command(spec, params, longest=stats.max, data_config=data_config)
            t_short, t_long = (trl_runtime(command, model, n, work, cpu=not args.cuda) for n in (short, long))
            trl = (long - short) * params.effective_batch_size / (t_long - t_short)
            plain = plain_loop(spec, params, token_ids, tokenizer.pad_token_id, steps=long - short)
            rows[name]["probe"].append(m.samples_per_second)
            rows[name]["plain"].append(plain)
            rows[name]["trl"].append(trl)
            print(f"round {r + 1} {name}: probe {m.samples_per_second:.1f}, plain loop {plain:.1f}, "
                  f"trl {trl:.1f} samples/s", file=sys.stderr, flush=True)
    kinds = ("probe", "plain", "trl")
    table = {name: {**{f"{k}_samples_per_s": statistics.median(v[k]) for k in kinds},
                    "plain_over_probe": statistics.median(v["plain"]) / statistics.median(v["probe"]),
                    "trl_over_probe": statistics.median(v["trl"]) / statistics.median(v["probe"]),
                    "raw": v} for name, v in rows.items()}
    order = {kind: sorted(table, key=lambda n: -table[n][f"{kind}_samples_per_s"]) for kind in kinds}
    import trl

    dump("trl_fidelity", {"trl": trl.__version__, "rounds": args.rounds, "trl_steps": [short, long], "configs": table,
                          "rankings": order, "same_ranking": order["probe"] == order["plain"] == order["trl"]})


if __name__ == "__main__":
    main()
