"""A Hugging Face model with its frozen base quantized by bitsandbytes (``quantization: 4bit | 8bit``,
QLoRA), loaded and prepared as ``trl sft`` does it (trl 1.16, the version read here):

* ``trl/scripts/sft.py`` passes ``get_quantization_config(model_args)`` to the trainer, which loads
  the model with it (``create_model_from_path``): ``BitsAndBytesConfig(load_in_4bit=True,
  bnb_4bit_compute_dtype=<--dtype>, bnb_4bit_quant_type=..., bnb_4bit_use_double_quant=...)``, or
  ``load_in_8bit=True``; bitsandbytes quantizes the weights as they reach the GPU;
* the adapters go on with ``get_peft_model``, and for a quantized model the trainer then casts every
  trainable parameter to bf16 (``sft_trainer.py``, after the QLoRA paper's recommendation).

transformers quantizes while it loads a checkpoint, so a random-init ``config:`` model is saved to
a temporary folder first and loaded from there, as the written command loads the saved one (a folder
held while in use: one a killed worker left behind is removed by the next load, :func:`model_folder`).
CUDA only (``check_support`` refuses it elsewhere, so these imports run only there).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.files import FolderBusy, lock_folder
from trainfit.params import Params

MODEL_FOLDER_PREFIX = "trainfit-qlora-"
UNHELD_GRACE_S = 60.0
"""How old a model folder no process holds must be before a load removes it: a folder just made is
held a moment later (:func:`model_folder`)."""


def bnb_config(params: Params, dtype: Any) -> Any:
    """The ``BitsAndBytesConfig`` trl sft builds from the command's quantization flags."""
    from transformers import BitsAndBytesConfig

    if params.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_quant_type=params.bnb_4bit_quant_type,
                              bnb_4bit_use_double_quant=params.bnb_double_quant)


def load_quantized(model_spec: Any, config: Any, params: Params, dtype: Any, device: Any) -> Any:
    """The model of ``model_spec`` loaded onto ``device`` with its linear layers quantized."""
    from transformers import AutoModelForCausalLM

    if params.lora_r is None:
        raise TrainfitError(f"quantization: {params.quantization} holds the base in {params.quantization}, which only "
                            "LoRA adapters can train on, and this config has lora_r: null",
                            "give every quantized config a rank (tune.constraints), or drop quantization")
    kwargs = {"attn_implementation": params.attention, "dtype": dtype, "device_map": {"": device},
              "quantization_config": bnb_config(params, dtype), "local_files_only": True}
    if model_spec.path is not None:
        return AutoModelForCausalLM.from_pretrained(model_spec.path, config=config, **kwargs)
    with model_folder() as folder:
        AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
        return AutoModelForCausalLM.from_pretrained(folder, **kwargs)


@contextlib.contextmanager
def model_folder(root: Path | None = None) -> Iterator[Path]:
    """A temporary folder in ``root`` (the system's) for a random-init model to load quantized, held
    (:func:`trainfit.files.lock_folder`) until it is removed. A probe's worker killed at its timeout
    skips every cleanup, and a model's weights may take gigabytes: the folders of earlier loads that
    no live process holds go first (:func:`remove_abandoned`)."""
    root = Path(tempfile.gettempdir()) if root is None else root
    remove_abandoned(root)
    with tempfile.TemporaryDirectory(prefix=MODEL_FOLDER_PREFIX, dir=root) as folder:
        try:
            lock: contextlib.AbstractContextManager[Any] = lock_folder(Path(folder))
        except TrainfitError:  # a file system without locks: the folder is only removed as it ends
            lock = contextlib.nullcontext()
        with lock:
            yield Path(folder)


def remove_abandoned(root: Path) -> list[Path]:
    """Remove the model folders in ``root`` that no live process holds (their lock goes with the
    process, however it ended), older than :data:`UNHELD_GRACE_S`; the removed ones."""
    removed = []
    for folder in root.glob(f"{MODEL_FOLDER_PREFIX}*"):
        try:
            old = time.time() - folder.stat().st_mtime > UNHELD_GRACE_S
        except OSError:
            continue  # removed meanwhile
        if not old or not folder.is_dir():
            continue
        try:
            lock = lock_folder(folder)
        except (FolderBusy, TrainfitError, OSError):
            continue  # a live process holds it, or its file system keeps no locks to tell
        with lock:
            shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def adapters_in_bf16(model: Any) -> Any:
    """Every trainable parameter in bf16, as trl's SFT trainer leaves a quantized model's adapters."""
    import torch

    for name, param in model.named_parameters():
        if param.requires_grad and "lora_magnitude_vector" not in name:
            param.data = param.data.to(torch.bfloat16)
    return model
