"""A Hugging Face model with its frozen base quantized by bitsandbytes (``quantization: 4bit | 8bit``,
QLoRA), loaded and prepared as ``trl sft`` does it (trl 1.16, the version read here):

* ``trl/scripts/sft.py`` passes ``get_quantization_config(model_args)`` to the trainer, which loads
  the model with it (``create_model_from_path``): ``BitsAndBytesConfig(load_in_4bit=True,
  bnb_4bit_compute_dtype=<--dtype>, bnb_4bit_quant_type=..., bnb_4bit_use_double_quant=...)``, or
  ``load_in_8bit=True``; bitsandbytes quantizes the weights as they reach the GPU;
* the adapters go on with ``get_peft_model``, and for a quantized model the trainer then casts every
  trainable parameter to bf16 (``sft_trainer.py``, after the QLoRA paper's recommendation).

transformers quantizes while it loads a checkpoint, so a random-init ``config:`` model is saved to
a temporary folder first and loaded from there, as the written command loads the saved one.
CUDA only (``check_support`` refuses it elsewhere, so these imports run only there).
"""

from __future__ import annotations

import tempfile
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.params import Params


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
    with tempfile.TemporaryDirectory(prefix="trainfit-qlora-") as folder:
        AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder)
        return AutoModelForCausalLM.from_pretrained(folder, **kwargs)


def adapters_in_bf16(model: Any) -> Any:
    """Every trainable parameter in bf16, as trl's SFT trainer leaves a quantized model's adapters."""
    import torch

    for name, param in model.named_parameters():
        if param.requires_grad and "lora_magnitude_vector" not in name:
            param.data = param.data.to(torch.bfloat16)
    return model
