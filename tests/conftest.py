"""Shared fixtures: tiny models built from configs, data generated in code, fast probe settings.

Nothing here downloads anything; every model is random-init from a config dict.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import psutil  # the real one, imported before any test changes the working directory
import pytest
import yaml

TESTS = Path(__file__).resolve().parent
EXAMPLES = TESTS.parent / "examples"

TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
              "max_position_embeddings": 512}
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 512,
             "vocab_size": 256, "bos_token_id": 1, "eos_token_id": 2}
FAST_PROBE = {"memory_steps": 2, "burn_in_steps": 1, "min_steps": 2, "max_steps": 4, "max_seconds": 3,
              "timeout_s": 120, "device": "cpu"}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Length counts are cached per test session in a temp folder, never in the user's home."""
    monkeypatch.setenv("TRAINFIT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def write_texts(path: Path, n: int = 200, seed: int = 0) -> list[int]:
    """A JSONL file whose sample i has a known number of words; returns the word counts."""
    rng = random.Random(seed)
    counts = [max(1, int(rng.lognormvariate(3.0, 0.7))) for _ in range(n)]
    with path.open("w") as f:
        for i, c in enumerate(counts):
            f.write(json.dumps({"id": i, "text": " ".join(f"w{j % 50}" for j in range(c))}) + "\n")
    return counts


@pytest.fixture
def texts_file(tmp_path: Path) -> tuple[Path, list[int]]:
    path = tmp_path / "train.jsonl"
    return path, write_texts(path)


def write_frames(path: Path, n: int, seed: int = 0) -> Path:
    """A JSONL file of ``n`` rows of real numbers (``frames``: 2-9 rows of 8, ``n`` their count),
    what ``factories.learnable`` trains on."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            count = rng.randint(2, 9)
            f.write(json.dumps({"id": i, "n": count, "frames": [[rng.uniform(-1, 1) for _ in range(8)]
                                                                for _ in range(count)]}) + "\n")
    return path


def learnable_spec(root: Path, rows: int, params: dict[str, Any], more: str = "") -> Path:
    """A spec of ``factories.learnable`` over ``rows`` rows of ``write_frames``, with ``params`` and
    the YAML ``more`` (sections such as ``search:``) after them."""
    data = write_frames(root / "frames.jsonl", rows)
    spec = make_spec_file(root, model={"factory": f"{TESTS / 'factories.py'}:learnable"},
                          data={"path": str(data), "length_field": "n"}, params=params)
    spec.write_text(spec.read_text() + more)
    return spec


def make_spec_file(tmp_path: Path, *, model: dict[str, Any], data: dict[str, Any] | None = None,
                   params: dict[str, Any] | None = None, budget: dict[str, Any] | None = None,
                   probe: dict[str, Any] | None = None, name: str = "spec.yaml") -> Path:
    doc: dict[str, Any] = {"model": model, "params": params or {}, "probe": {**FAST_PROBE, **(probe or {})}}
    if data is not None:
        doc["data"] = data
    if budget is not None:
        doc["budget"] = budget
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def llama_spec(tmp_path: Path, texts_file: tuple[Path, list[int]]):
    """A factory of spec files for the tiny Llama on the generated texts."""

    def make(params: dict[str, Any] | None = None, **kw: Any) -> Path:
        return make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                              data={"path": str(texts_file[0]), "text_field": "text"},
                              params={"batch_size": 2, "max_length": 128, **(params or {})}, **kw)

    return make


def tune_one_lora_config(root: Path, samples: int, lora_r: int | None = 4) -> Path:
    """A real tune of one LoRA config of a tiny Llama (its model saved, with the bundled tokenizer,
    so the written `trl sft` command trains it) on ``samples`` texts at 2 x 2 samples a step; its
    output folder. ``lora_r=None``: full fine-tuning."""
    from trainfit.cli import main

    data = root / "train.jsonl"
    write_texts(data, n=samples)
    spec = make_spec_file(root, model={"config": {**TINY_LLAMA, "vocab_size": 2000}},
                          data={"path": str(data), "text_field": "text"},
                          params={"max_length": 64, "batch_size": 2, "gradient_accumulation_steps": 2})
    spec.write_text(spec.read_text() + f"tokenizer: {EXAMPLES / 'data' / 'tokenizer.json'}\n"
                    f"search:\n  lora_r: [{'null' if lora_r is None else lora_r}]\n")
    out = root / "tune"
    assert main(["tune", str(spec), "--output", str(out), "--strategy", "grid"]) == 0
    return out


def kill_left_running(folder: Path) -> None:
    """Kill every process a test's factories recorded in ``folder/*.pid`` that still runs."""
    for pid_file in folder.glob("*.pid"):
        pid = int(pid_file.read_text())
        if alive(pid):
            psutil.Process(pid).kill()


def alive(pid: int) -> bool:
    """Running (a killed process whose new parent has not reaped it yet is a zombie: gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pid: int, bound_s: float) -> bool:
    """Whether ``pid`` is gone within ``bound_s`` seconds: a signal is delivered at once, but a
    process it kills (one that is not our child) dies when the kernel next runs it."""
    deadline = time.monotonic() + bound_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
