"""Hugging Face causal language models (random-init from a config, or a local checkpoint), with
LoRA through peft. Every knob that shapes the model is applied here, in this order: attention
kernel and weight dtype at construction, then gradient checkpointing, then LoRA, then the loss
(the model's own over the full logits, TRL's fused LM head as ``trl sft`` computes it, or Liger-Kernel's
fused linear cross-entropy with its layer kernels, as the transformers Trainer's ``use_liger_kernel`` applies them)."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError, Unsupported
from trainfit.flops import StepFlops, experts_active, matmul_params, step_flops, transformer_shape
from trainfit.params import Params
from trainfit.spec import ModelSpec
from trainfit.spec.model_config import load_config, max_positions_of
from trainfit.workloads.base import Batch, Workload
from trainfit.workloads.knobs import apply_knobs
from trainfit.workloads.quantized import adapters_in_bf16, load_quantized

SAVED_MODEL_MAX_PARAMS = 1_000_000_000
"""The largest random-init model ``tune`` saves for its ``trl sft`` command: it is built in the
tuning process's own memory and written in fp32 (4 GB here)."""


def save_initial_model(model: ModelSpec, tokenizer: str | None, folder: Path, seed: int) -> bool:
    """Save the random-init model a ``config:`` spec probes (the probe's seed: the same weights as a
    probe on the CPU; a GPU probe draws its own, at the same cost)
    and its tokenizer as a Hugging Face folder, so ``trl sft --model_name_or_path`` trains it.
    Once: a folder already there is kept (``tune`` writes its outputs after every trial). Whole or
    not at all: written as ``FOLDER.partial`` and renamed. Returns whether ``folder`` holds the
    model (False: larger than :data:`SAVED_MODEL_MAX_PARAMS`). ``tokenizer``: the spec's (a
    tokenizer.json or a folder); None saves none, and the command's script says so."""
    if (folder / "config.json").exists():
        return True
    import torch
    from transformers import AutoModelForCausalLM

    config = load_config(model)
    with torch.device("meta"):  # counted without memory: a large config is not built to learn it is large
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if size > SAVED_MODEL_MAX_PARAMS:
        return False
    from transformers.utils import logging as hf_logging

    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    torch.manual_seed(seed)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Writing model shards" bar amid tune's own progress lines
    try:
        AutoModelForCausalLM.from_config(config).save_pretrained(partial)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if tokenizer is not None:
        _load_tokenizer(tokenizer, config).save_pretrained(partial)
    partial.replace(folder)
    return True


_SPECIAL_NAMES = {"bos": ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>"),
                  "eos": ("</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>"),
                  "pad": ("<pad>", "[PAD]", "<|pad|>"), "unk": ("<unk>", "[UNK]")}
"""Conventional spellings of the special tokens, for a bare tokenizer.json that does not say which is which."""


def _load_tokenizer(path: str, config: Any) -> Any:
    """The spec's tokenizer as transformers saves it: a folder as it is; a bare tokenizer.json
    with its special tokens named (TRL appends the eos token and pads with the pad token): the
    model config's ``*_token_id`` first, else the conventional spelling among its special tokens."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if Path(path).is_dir():
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    bare = PreTrainedTokenizerFast(tokenizer_file=path)
    specials = {t.content for t in bare.backend_tokenizer.get_added_tokens_decoder().values() if t.special}
    named = {}
    for role, spellings in _SPECIAL_NAMES.items():
        token_id = getattr(config, f"{role}_token_id", None)
        by_id = bare.convert_ids_to_tokens(token_id) if isinstance(token_id, int) and token_id < len(bare) else None
        token = by_id or next((s for s in spellings if s in specials), None)
        if token is not None:
            named[f"{role}_token"] = token
    return PreTrainedTokenizerFast(tokenizer_file=path, **named)


def fused_lm_head() -> tuple[Any, str | None]:
    """TRL's ``add_fused_lm_head`` and None, or None and why it cannot be had.

    TRL's SFT trainer (1.16) never builds the ``(batch, seq, vocab)`` logits: it projects the hidden
    states through the LM head in tiles and folds each into the per-token log-probabilities (plus
    the entropy and top-1 flags it logs); the backward recomputes each tile. Against the model's
    own loss over the full logits that changes peak memory and step time (docs/benchmarks.md: on
    the bundled tiny Llama on CPU, TRL's process peaked 1.33-1.40x the full-logits probe), so a
    config ``trl sft`` will train is probed with TRL's own head."""
    try:
        from trl.trainer.utils import add_fused_lm_head
    except ImportError:
        return None, "trl is not installed, or its version has no fused LM head"
    except Exception as err:  # a trl that does not import with these transformers/torch versions
        return None, f"trl does not import here ({type(err).__name__}: {str(err)[:200]})"
    return add_fused_lm_head, None


SFT_OUTPUTS = ("log_probs", "entropy", "is_top1")
"""What TRL's SFT trainer asks the fused head for on every step (entropy and accuracy feed its logs)."""


def resolve_liger(model_type: str, device: Any) -> tuple[Any, str]:
    """``loss: liger``: Liger-Kernel's ``_apply_liger_kernel_to_instance`` (what the transformers
    Trainer calls for ``use_liger_kernel=True``: its fused linear cross-entropy, which never builds the
    full logits, and its RMSNorm, RoPE and SwiGLU kernels) and the measurement's note. ``Unsupported``,
    with the way on, where it cannot run: no CUDA (Liger's kernels are Triton's), no liger-kernel, or a
    ``model_type`` it has no kernels for (Liger would skip it silently: refused here)."""
    import torch

    def refuse(why: str, hint: str = "pip install liger-kernel, or use loss: model") -> Unsupported:
        return Unsupported(f"loss=liger {why}", hint, knob="loss", value="liger")

    if torch.device(device).type != "cuda":
        raise refuse("runs Liger-Kernel's Triton kernels, which need a CUDA GPU",
                     "use loss: model (or auto) on this device")
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        raise refuse("needs liger-kernel, which is not installed") from None
    except Exception as err:  # a liger-kernel that does not import with these torch/triton versions
        raise refuse(f"needs liger-kernel, which does not import here ({type(err).__name__}: "
                     f"{str(err)[:200]})") from None
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise refuse(f"has no kernels for model type {model_type!r} (the Trainer would apply none)", "use loss: model")
    return _apply_liger_kernel_to_instance, ("loss: Liger-Kernel's fused linear cross-entropy (no full logits) and "
                                             "its layer kernels, as the Trainer's use_liger_kernel applies them")


def resolve_loss(loss: str, trl_command: bool) -> tuple[Any, str | None]:
    """``auto`` -> how the training command computes the loss: TRL's fused head for a ``trl sft``
    command (where trl has it), else the model's own. Returns ``add_fused_lm_head`` (None for the
    model's own loss) and a note for the measurement."""
    if loss == "model" or (loss == "auto" and not trl_command):
        return None, None
    head, missing = fused_lm_head()
    if loss == "fused":
        if head is None:
            raise Unsupported(f"loss=fused needs TRL's fused LM head: {missing}",
                              "pip install -U trl, or use loss: model", knob="loss", value="fused")
        return head, "loss: TRL's fused LM head (log-probs in tiles, no full logits)"
    if head is not None:
        return head, "loss: TRL's fused LM head, as the `trl sft` command computes it (loss=auto)"
    return None, (f"loss: the model's own, over the full logits ({missing}): a `trl sft` run computes it with "
                  "TRL's fused LM head and may use other memory than measured (pip install -U trl)")


def fused_tile_note(vocab_size: int) -> str | None:
    """TRL (1.16) allocates each fused-head tile buffer as ``min(tokens, 4096) x 32768`` columns,
    whatever the vocabulary: a vocabulary narrower than that pays for columns it never uses (on
    GPU the allocator holds them all; on CPU they count against the cap, not the RSS)."""
    try:
        from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE as tokens
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as width
    except Exception:  # another trl layout: nothing known to say
        return None
    if vocab_size >= width:
        return None
    return (f"TRL's fused LM head allocates its tiles {width:,} vocabulary columns wide whatever the "
            f"vocabulary ({vocab_size:,} here): {width * 4 // 1024} KiB per token of a micro-batch in fp32 (half in "
            f"bf16), {tokens * width * 4 / 2**20:,.0f} MiB from {tokens:,} tokens on, held by a `trl sft` run too, "
            f"where this model's full logits take {vocab_size * 4:,} bytes per token")


def frozen_experts_note(model: Any, experts: tuple[int, int] | None) -> list[str]:
    """A note when LoRA left a mixture of experts' routed experts without adapters: their weights
    are stacked parameters, not Linear modules, so 'all-linear' reaches them only where peft knows
    the architecture (Mixtral, Qwen-MoE), not, for example, on gpt-oss."""
    if experts is None:
        return []
    stacked = sorted({".".join(name.split(".")[-3:]) for name, p in model.named_parameters()
                      if name.split(".")[-2:-1] == ["experts"] and p.dim() == 3})
    if not stacked or any(".experts." in name and "lora_" in name for name, _ in model.named_parameters()):
        return []
    return [f"LoRA leaves the {experts[1]} routed experts frozen (their weights are parameters, not Linear layers): "
            f"to adapt them, set params.lora_target_parameters: [{', '.join(stacked)}]"]


def weight_dtype(params: Params) -> tuple[Any, str | None]:
    """The dtype the model's weights are built in, and a note when it is not fp32."""
    import torch

    # LoRA trains adapters only: the frozen base lives in the compute dtype (as QLoRA-style
    # recipes load it), while full fine-tuning keeps fp32 master weights under autocast.
    if params.lora_r is not None and params.precision in ("bf16", "fp16"):
        return (torch.bfloat16 if params.precision == "bf16" else torch.float16,
                f"LoRA: frozen base weights held in {params.precision}, adapters in fp32")
    return torch.float32, None


def build_model(model_spec: ModelSpec, config: Any, params: Params, dtype: Any) -> Any:
    """The transformers model of ``config`` (random-init, or loaded from ``model_spec.path``) with
    the attention kernel and weight dtype; ``Unsupported`` for an attention kernel it cannot use, a
    clear error for anything else it cannot be built from."""
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": params.attention, "dtype": dtype}
    try:
        if model_spec.path is not None:
            return AutoModelForCausalLM.from_pretrained(model_spec.path, config=config, local_files_only=True,
                                                        **kwargs)
        return AutoModelForCausalLM.from_config(config, **kwargs)
    except (ValueError, ImportError) as err:
        raise _unbuildable(err, config, params) from None
    except (AssertionError, TypeError, KeyError, IndexError) as err:  # values the architecture rejects
        raise _rejected_values(err, config) from None


def _unbuildable(err: ValueError | ImportError, config: Any, params: Params) -> TrainfitError:
    """The error for a model transformers would not build: its attention kernel, a model type that
    is not a causal LM, or another reason."""
    if "attention" in str(err).lower() or "attn" in str(err).lower():
        others = " or ".join(a for a in ("sdpa", "eager") if a != params.attention)
        return Unsupported(f"cannot build the model with attention={params.attention}: {err}",
                           f"try attention: {others}", knob="attention", value=params.attention)
    if "Unrecognized configuration class" in str(err):  # its message lists every causal LM there is
        return TrainfitError(f"model_type {config.model_type!r} is not a causal language model (transformers "
                             "has no AutoModelForCausalLM for it), the kind the built-in workload trains",
                             "train it through a factory: model.factory: my_module:make_workload "
                             "(see examples/tiny_tts.py)")
    return TrainfitError(f"cannot build the model: {err}", "check model.path / model.config")


def _rejected_values(err: Exception, config: Any) -> TrainfitError:
    """The error for config values the architecture rejects, naming token ids outside the vocabulary."""
    vocab = getattr(config, "vocab_size", None)
    outside = [f"{k}={v}" for k in ("pad_token_id", "bos_token_id", "eos_token_id")
               if isinstance(v := getattr(config, k, None), int) and isinstance(vocab, int) and v >= vocab]
    hint = (f"{', '.join(outside)} outside vocab_size={vocab}: set them under model.config" if outside else
            "check the config's values (token ids below vocab_size, heads dividing hidden_size)")
    return TrainfitError(f"cannot build the model: {type(err).__name__}: {err}", hint)


class HFCausalLM(Workload):
    """A transformers ``AutoModelForCausalLM`` trained on random token ids of the real lengths.

    Token content does not change a step's cost; lengths, padding and shapes do, and they come
    from the dataset.
    """

    name = "hf-causal-lm"

    def __init__(self, model_spec: ModelSpec, params: Params, device: Any, seed: int, *,
                 trl_command: bool = False) -> None:
        import torch

        config = load_config(model_spec)
        head, note = (resolve_liger(str(getattr(config, "model_type", "")), device) if params.loss == "liger"
                      else resolve_loss(params.loss, trl_command))
        self.loss_kind = "liger" if params.loss == "liger" else "model" if head is None else "fused"
        self.notes = [note] if note else []
        self.device = device
        self.attention = params.attention
        self.config = config
        self.max_positions = max_positions_of(config)
        self.vocab_size = int(config.vocab_size)
        if self.loss_kind == "fused" and (tile := fused_tile_note(self.vocab_size)):
            self.notes.append(tile)
        dtype, dtype_note = weight_dtype(params)
        self.notes += [dtype_note] if dtype_note else []
        torch.manual_seed(seed)
        # A random-init model is initialized where it trains: a 1.1B model's init took ~70 s on the
        # CPU of an H100 machine (docs/benchmarks.md) and a blink on the GPU. Its weights then come
        # from the GPU's generator, not the CPU's: the same cost and memory, other values.
        quantized = params.quantization != "none"  # loaded onto the device by its device_map (QLoRA)
        on_accelerator = model_spec.path is None and torch.device(device).type != "cpu" and not quantized
        with torch.device(device) if on_accelerator else contextlib.nullcontext():
            built = (load_quantized(model_spec, config, params, dtype, device) if quantized
                     else build_model(model_spec, config, params, dtype))
            model = self._apply_knobs(built, config, params, head)
        self.model = adapters_in_bf16(model) if quantized else model.to(device)
        self.model.train()
        self.shape = transformer_shape(config, *matmul_params(self.model, experts_active(config)))
        self._generator = torch.Generator().manual_seed(seed)

    def _apply_knobs(self, model: Any, config: Any, params: Params, head: Any) -> Any:
        """Checkpointing and LoRA on the built model, then TRL's fused LM head or Liger's kernels
        (``head``, None for the model's own loss). With LoRA, the result is peft's wrapper around the model."""
        model.config.use_cache = False
        model = apply_knobs(model, params, task_type="CAUSAL_LM")
        if params.lora_r is not None:
            self.notes += frozen_experts_note(model, experts_active(config))
        base = model.get_base_model() if params.lora_r is not None else model
        if self.loss_kind == "liger":  # where the Trainer applies them: the base model, under the LoRA wrapper
            head(model=base)
        elif head is not None:  # where TRL's SFT trainer puts its head, likewise
            head(base, outputs=SFT_OUTPUTS)
        return model

    def make_batch(self, lengths: Sequence[int], pad_to: int) -> Batch:
        import torch

        ids = torch.randint(0, self.vocab_size, (len(lengths), pad_to), generator=self._generator)
        return self.batch_of(self._rows_inputs(ids, lengths), lengths, pad_to)

    def make_packed_batch(self, lengths: Sequence[int], pad_to: int) -> Batch:
        import torch

        ids = torch.randint(0, self.vocab_size, (1, pad_to), generator=self._generator)
        return self.batch_of(self._packed_inputs(ids, lengths), lengths, pad_to, packed=True)

    @property
    def collates_rows(self) -> bool:
        return True

    def collate_rows(self, rows: Sequence[Any], pad_to: int, packed: bool) -> Any:
        """Tokenized rows (``{"input_ids": [...]}``, see probe/real_rows.py) padded into a batch on
        the CPU, as TRL's collator pads them (:meth:`make_batch` and :meth:`make_packed_batch` with
        the rows' own ids)."""
        import torch

        longest = pad_to if not packed else self.max_positions  # as the probe caps max_length
        rows_ids = [row["input_ids"][:longest or None] for row in rows]
        if max(max(ids, default=0) for ids in rows_ids) >= self.vocab_size:
            raise TrainfitError(f"the tokenizer's ids reach past the model's vocabulary of {self.vocab_size}",
                                "give the model's own tokenizer (`tokenizer:`), or probe.data: synthetic")
        lengths = [len(row_ids) for row_ids in rows_ids]
        ids = torch.zeros(1 if packed else len(rows), pad_to, dtype=torch.long)
        if packed:
            ids[0, :sum(lengths)] = torch.tensor([t for row_ids in rows_ids for t in row_ids], dtype=torch.long)
            return self._packed_inputs(ids, lengths)
        for i, row_ids in enumerate(rows_ids):
            ids[i, :lengths[i]] = torch.tensor(row_ids, dtype=torch.long)
        return self._rows_inputs(ids, lengths)

    @staticmethod
    def _rows_inputs(ids: Any, lengths: Sequence[int]) -> dict[str, Any]:
        """Inputs of rows of ``ids`` (one per sample, ``lengths`` real positions each), on the CPU."""
        import torch

        mask = torch.arange(ids.shape[1]).unsqueeze(0) < torch.tensor(list(lengths)).unsqueeze(1)
        return {"input_ids": ids, "attention_mask": mask.long(), "labels": ids.masked_fill(~mask, -100)}

    def _packed_inputs(self, ids: Any, lengths: Sequence[int]) -> dict[str, Any]:
        """As TRL's padding-free collator makes one row of samples this long (``DataCollatorForLanguageModeling``,
        ``padding_free``): ``position_ids`` restarting at each sample (the padding's at 0),
        no attention mask (transformers' masking then attends within each sample: block-diagonal
        for sdpa and eager, per sample for flash_attention_2, given the sequence boundaries as TRL
        passes them), and no loss on a sample's first position or the padding. On the CPU."""
        import torch

        pad_to = ids.shape[1]
        positions = torch.zeros(1, pad_to, dtype=torch.long)
        positions[0, :sum(lengths)] = torch.cat([torch.arange(n) for n in lengths])
        inputs: dict[str, Any] = {"input_ids": ids, "position_ids": positions,
                                  "labels": ids.masked_fill(positions == 0, -100)}
        if self.attention == "flash_attention_2":  # the varlen kernels' boundaries, computed here as TRL does
            bounds = torch.cat([(positions[0] == 0).nonzero().flatten(), torch.tensor([pad_to])]).to(torch.int32)
            longest = int(bounds.diff().max())
            inputs.update(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=longest, max_length_k=longest)
        return inputs

    def loss(self, inputs: Any) -> Any:
        if self.loss_kind == "fused":
            return self.model(**inputs, fused_lm_head=True).loss
        return self.model(**inputs).loss

    def logits_bytes(self, batch: Batch) -> int | None:
        # transformers' causal-LM loss upcasts the logits to fp32; TRL's fused head and Liger's never build them.
        return None if self.loss_kind != "model" else batch.padded_tokens * self.vocab_size * 4

    def flops(self, seq_lens: Sequence[int], recompute: bool) -> StepFlops | None:
        if self.shape is None:
            return None
        flops = step_flops(self.shape, seq_lens, recompute)
        if self.loss_kind != "fused":
            return flops
        # The fused head's backward recomputes each logits tile: one more LM-head forward per token.
        head = 2 * self.vocab_size * self.shape.hidden * sum(seq_lens)
        return dataclasses.replace(flops, hardware=flops.hardware + head)
