"""Model FLOPs of a training step and MFU.

Per token, a dense transformer step costs (PaLM, Chowdhery et al. 2022, appendix B; nanoGPT's
``estimate_mfu``; torchtitan ``get_num_flop_per_token``)::

    6 * N  +  12 * L * H * Q * T

with N the parameters that take part in matmuls (embedding lookups excluded, an LM head counted
once), L layers, H attention heads, Q head dim and T the sequence length. The 6N splits into
2N forward, 2N backward to the inputs and 2N backward to the weights; a frozen weight (LoRA's
base) skips only the last, so the parameter term is ``4 * N_all + 2 * N_trainable``.
Unlike nanoGPT we use each sample's *real* length for T, sum per sample, and never count padding.

For a mixture of experts, each token passes through k of the E routed experts, so their
parameters count at k/E (``experts_active``); shared experts and the router count in full.

The attention term is ``6 * H * (Q_k + Q_v) * area`` per layer, which is the 12·H·Q·T² above when
keys and values share a head dim (MLA's do not: DeepSeek-V3 scores with 192 dims and reads 128).
``area`` is T² for full attention (PaLM's convention: every ordered pair of positions, causality
not halved) and, in the same convention, the pairs closer than a sliding window W, about 2·T·W
once T passes W (Mistral, Gemma 2/3, gpt-oss): a window layer does not need the keys before its
window, whatever the kernel computes. Layers without softmax attention (Qwen3-Next's linear
attention) add no T² term; their projections are in N.

MFU counts model FLOPs only: activation recomputation is work the hardware does but the model
does not need, so it appears in HFU (hardware FLOPs utilisation), one extra forward:
``2 * N_all + 4 * L * H * Q * T`` per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class TransformerShape:
    """What the FLOPs formula needs to know about a model."""

    n_params: float
    """Parameters in matmuls: all parameters minus embedding tables (an LM head tied to the
    input embedding is counted once, as the head; routed experts at k/E, see the module doc)."""
    n_trainable: float
    """Of those, the ones whose weight gradient is computed (all for full fine-tuning)."""
    hidden: int
    """Width of the residual stream (what an LM head multiplies)."""
    n_heads: int
    qk_dim: int
    """Head dim of queries and keys."""
    v_dim: int
    """Head dim of values."""
    windows: tuple[int | None, ...]
    """One entry per softmax-attention layer: its sliding window, None for full attention."""


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one micro-batch: what the model needs (``model``) and what ran (``hardware``)."""

    model: float
    hardware: float


def step_flops(shape: TransformerShape, seq_lens: Sequence[int], recompute: bool) -> StepFlops:
    """Model and hardware FLOPs of one forward+backward over samples of these real lengths."""
    tokens = sum(seq_lens)
    area = sum(attention_area(n, window) for window in shape.windows for n in seq_lens)
    attention = 6 * shape.n_heads * (shape.qk_dim + shape.v_dim) * area
    model = (4 * shape.n_params + 2 * shape.n_trainable) * tokens + attention
    extra = (2 * shape.n_params * tokens + attention / 3) if recompute else 0
    return StepFlops(model=float(model), hardware=float(model + extra))


def attention_area(length: int, window: int | None) -> int:
    """Position pairs a layer needs for one sample, in PaLM's convention: T² for full attention,
    for a sliding window W the pairs with ``|q - k| < W``."""
    if window is None or length <= window:
        return length * length
    return length * (2 * window - 1) - window * (window - 1)


def transformer_shape(config: Any, n_params: float, n_trainable: float) -> TransformerShape | None:
    """The shape of a transformers config (None when it names no heads or layers)."""
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0))
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0))
    layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0))
    if not heads or not layers:
        return None
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None)
    if kinds is None:  # Mistral: a window on every layer, unless switched off (Qwen2-MoE, Qwen3-MoE)
        kinds = ["sliding_attention" if window and getattr(config, "use_sliding_window", True)
                 else "full_attention"] * layers
    windows = tuple(window if kind == "sliding_attention" and window else None
                    for kind in kinds if kind in ("full_attention", "sliding_attention"))
    return TransformerShape(n_params=n_params, n_trainable=n_trainable, hidden=hidden, n_heads=heads,
                            qk_dim=int(getattr(config, "qk_head_dim", None) or head_dim),
                            v_dim=int(getattr(config, "v_head_dim", None) or head_dim), windows=windows)


def utilization(flops: float, seconds: float, peak_flops_per_s: float | None) -> float | None:
    """Achieved share of peak; None when the peak is unknown or nothing was timed."""
    if not peak_flops_per_s or seconds <= 0:
        return None
    return flops / seconds / peak_flops_per_s


def experts_active(config: Any) -> tuple[int, int] | None:
    """(k, E) of a mixture-of-experts transformers config: experts per token, routed experts."""
    k = getattr(config, "num_experts_per_tok", None)
    e = next((getattr(config, name) for name in ("n_routed_experts", "num_local_experts", "num_experts")
              if getattr(config, name, None)), None)
    return (int(k), int(e)) if k and e and k < e else None


def matmul_params(model: Any, experts: tuple[int, int] | None = None) -> tuple[float, float]:
    """(N, N_trainable) of a torch module by the rule in :class:`TransformerShape`. ``experts``
    (k, E): a parameter of a module named ``experts`` stacking E experts (transformers 5's
    layout, ``mlp.experts.gate_up_proj`` of shape (E, ...)) counts at k/E."""
    import torch

    seen: set[int] = set()
    embedding_ids: set[int] = set()
    routed: set[int] = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding):
            embedding_ids.add(id(module.weight))
        if experts is not None and name.rsplit(".", 1)[-1] == "experts":
            routed.update(id(p) for p in module.parameters(recurse=False) if p.dim() and p.shape[0] == experts[1])
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_id = id(head.weight) if head is not None and getattr(head, "weight", None) is not None else None
    n_all = n_trainable = 0.0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in embedding_ids and id(p) != head_id:
            continue
        n = p.numel() * (experts[0] / experts[1] if experts is not None and id(p) in routed else 1)
        n_all += n
        if p.requires_grad:
            n_trainable += n
    return n_all, n_trainable
