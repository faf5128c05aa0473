from __future__ import annotations

import pytest

from trainfit.devices import peak_flops
from trainfit.flops import (
    TransformerShape,
    attention_area,
    experts_active,
    matmul_params,
    step_flops,
    transformer_shape,
    utilization,
)


def test_full_finetune_matches_palm_formula() -> None:
    # N = 1e6, L = 2, H = 4, Q = 16; two samples of 10 and 20 tokens.
    shape = TransformerShape(n_params=1_000_000, n_trainable=1_000_000, hidden=64, n_heads=4, qk_dim=16, v_dim=16,
                             windows=(None, None))
    f = step_flops(shape, [10, 20], recompute=False)
    # 6N per token over 30 tokens + 12*L*H*Q*T per token = 12*128*(10*10 + 20*20)
    assert f.model == 6e6 * 30 + 12 * 128 * 500
    assert f.hardware == f.model


def test_lora_skips_frozen_weight_gradients_and_recompute_is_hardware_only() -> None:
    shape = TransformerShape(n_params=1_010_000, n_trainable=10_000, hidden=64, n_heads=4, qk_dim=16, v_dim=16,
                             windows=(None, None))
    f = step_flops(shape, [100], recompute=True)
    attn = 12 * 128 * 100 * 100
    # 4 * N_all + 2 * N_trainable per token == 4 * N_base + 6 * N_lora.
    assert f.model == (4 * 1_000_000 + 6 * 10_000) * 100 + attn
    # Recomputation adds one forward: 2 N_all per token + a third of the attention term.
    assert f.hardware == f.model + 2 * 1_010_000 * 100 + attn / 3


def test_a_sliding_window_layer_counts_only_the_keys_inside_its_window() -> None:
    # Full attention's T² counts every ordered pair of positions; a window W keeps those closer than W.
    def pairs(length: int, window: int) -> int:
        return sum(1 for q in range(length) for k in range(length) if abs(q - k) < window)

    assert attention_area(100, 16) == pairs(100, 16) == 2 * 100 * 16 - 16 * 16 - (100 - 16)
    assert attention_area(100, None) == pairs(100, 100) == 100 * 100
    assert attention_area(10, 16) == 100
    shape = TransformerShape(n_params=0, n_trainable=0, hidden=16, n_heads=2, qk_dim=8, v_dim=8, windows=(None, 16))
    assert step_flops(shape, [100], recompute=False).model == 6 * 2 * 16 * (100 * 100 + pairs(100, 16))


@pytest.mark.parametrize("model_type, extra, qk, v, windows", [
    ("llama", {}, 8, 8, (None,) * 4),
    ("mistral", {"sliding_window": 64}, 8, 8, (64,) * 4),  # no layer_types: every layer
    ("qwen2", {"use_sliding_window": False, "sliding_window": 64}, 8, 8, (None,) * 4),
    ("gpt_oss", {"sliding_window": 64, "head_dim": 8}, 8, 8, (64, None, 64, None)),
    ("gemma3_text", {"sliding_window": 64, "head_dim": 8, "sliding_window_pattern": 2}, 8, 8, None),
    ("qwen3_next", {"head_dim": 8, "full_attention_interval": 4}, 8, 8, (None,)),  # 3 linear-attention layers
    ("deepseek_v3", {"qk_nope_head_dim": 12, "qk_rope_head_dim": 4, "v_head_dim": 8}, 16, 8, (None,) * 4),
])
def test_the_shape_read_from_a_config_follows_its_attention_layers(model_type: str, extra: dict, qk: int,
                                                                    v: int, windows: tuple | None) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=4, **extra)
    shape = transformer_shape(cfg, 1.0, 1.0)
    assert (shape.hidden, shape.n_heads, shape.qk_dim, shape.v_dim) == (32, 4, qk, v)
    if windows is None:  # gemma3: its own layer pattern, sliding and full layers both present
        windows = tuple(64 if kind == "sliding_attention" else None for kind in cfg.layer_types)
        assert set(windows) == {64, None}
    assert shape.windows == windows


def test_matmul_params_exclude_embedding_lookups_but_count_a_tied_head_once() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("gpt2", n_embd=16, n_layer=1, n_head=2, n_positions=32, vocab_size=50,
                               bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())  # wte counted once (tied), wpe once
    n_all, n_trainable = matmul_params(model)
    assert n_all == total - 32 * 16  # only the position table is left out
    assert n_trainable == n_all


@pytest.mark.parametrize("model_type, shared", [("mixtral", 0), ("qwen2_moe", 3 * 16 * 16 + 16)])
def test_a_mixture_of_experts_counts_the_experts_a_token_passes_through(model_type: str, shared: int) -> None:
    """4 experts, 2 per token: the routed experts' weights count at half; attention, the router
    and a shared expert (qwen2_moe: 3 projections of 16x16 and a 1x16 gate) count in full."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, hidden_size=16, intermediate_size=32, moe_intermediate_size=32,
                               shared_expert_intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=2, vocab_size=50, num_experts_per_tok=2, num_local_experts=4,
                               num_experts=4, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg)
    assert experts_active(cfg) == (2, 4)
    attention = 4 * 16 * 16 + (3 * 16 if model_type == "qwen2_moe" else 0)  # q, k, v, o (+ qkv biases)
    routed = 4 * (16 * 64 + 32 * 16)  # per expert: gate and up (16 -> 2 x 32), down (32 -> 16)
    norms, router, head = 3 * 16, 4 * 16, 50 * 16
    n_all, _ = matmul_params(model, experts_active(cfg))
    assert n_all == attention + routed / 2 + shared + norms + router + head
    assert matmul_params(model)[0] == n_all + routed / 2  # without the routing: every expert
    assert experts_active(AutoConfig.for_model("llama")) is None

def test_peak_table_and_unknown_devices() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16", False)[0] == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16", False)[0] == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp32", True)[0] == 156e12
    assert peak_flops("Some Future GPU", "bf16", False) is None
    # The in-house guides' cards, each its own figure; a variant with other figures is no match.
    assert peak_flops("NVIDIA GeForce RTX 3090", "bf16", False)[0] == 71e12
    assert peak_flops("NVIDIA GeForce RTX 3090 Ti", "bf16", False)[0] == 80e12
    assert peak_flops("NVIDIA GeForce RTX 4090", "fp32", True)[0] == 82.6e12
    assert peak_flops("NVIDIA RTX A6000", "fp16", False)[0] == 154.8e12
    assert peak_flops("NVIDIA GeForce RTX 2080 Ti", "fp32", False)[0] == 13.4e12
    assert peak_flops("Tesla V100-PCIE-32GB", "fp16", False)[0] == 112e12
    assert peak_flops("Tesla V100S-PCIE-32GB", "fp16", False)[0] == 130e12
    assert peak_flops("Tesla T4", "fp16", False)[0] == 65e12 and peak_flops("NVIDIA A10", "bf16", False)[0] == 125e12
    assert peak_flops("NVIDIA A10G", "bf16", False) is None and peak_flops("NVIDIA L40", "bf16", False) is None
    assert peak_flops("NVIDIA L4", "bf16", False)[0] == 121e12
    assert peak_flops("NVIDIA GeForce RTX 3080 Ti", "bf16", False) is None  # not the RTX 3080's figures
    assert peak_flops("NVIDIA GeForce RTX 4090 Laptop GPU", "bf16", False) is None
    assert "whitepaper" in peak_flops("NVIDIA GeForce RTX 3090", "bf16", False)[1]
    assert utilization(1e12, 2.0, None) is None
    assert utilization(1e12, 2.0, 1e12) == pytest.approx(0.5)
