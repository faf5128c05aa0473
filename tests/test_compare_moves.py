"""The next round's other moves (guide 001: LoRA rank +-25%, the batch, loss weights, regularization),
each only where a clean comparison supports it (issue 48 item 3)."""

from __future__ import annotations

from test_compare import a_run, curve

from trainfit.compare.suggest import suggest


def moves(given: dict, runs: dict) -> dict[str, dict]:
    """The moves suggested, by the config each proposes."""
    return {name: config for s in suggest(given, runs, steps=40, defaults={"lora_r": 8, "batch_size": 4})
            if " tried (" in s.says and "learning rate" not in s.says for name, config in s.configs.items()}


def test_the_best_at_the_highest_rank_clearly_ahead_tries_a_quarter_more() -> None:
    given = {f"r{r}": {"learning_rate": 1e-4, "lora_r": r} for r in (8, 16, 32)}
    runs = {"r8": a_run("r8", curve(3.0, 2.8)), "r16": a_run("r16", curve(3.0, 2.5)), "r32": a_run("r32", curve(3.0, 2.0))}
    said = [s for s in suggest(given, runs, steps=40) if "lora_r" in s.says]
    assert said[0].says == ("r32 was the best at the highest lora_r tried (32), clearly ahead of the configs that differ "
                            "from it in lora_r alone: try 40")
    assert said[0].evidence.startswith("r32 (lora_r=32): final loss 2.0")
    assert moves(given, runs) == {"r32_lora_r_40": {"learning_rate": 1e-4, "lora_r": 40}}


def test_the_smallest_rank_that_matched_the_larger_tries_a_quarter_less() -> None:
    given = {f"r{r}": {"lora_r": r} for r in (8, 16)}
    runs = {"r8": a_run("r8", curve(3.0, 2.01), sps=10.0), "r16": a_run("r16", curve(3.0, 2.0), sps=6.0)}
    assert moves(given, runs) == {"r8_lora_r_6": {"lora_r": 6}}


def test_a_setting_moves_only_where_it_alone_differs() -> None:
    """r16 at 3e-4 against r8 at 1e-4: the rank and the rate changed together, so neither is the
    evidence for a rank move."""
    given = {"a": {"lora_r": 8, "learning_rate": 1e-4}, "b": {"lora_r": 16, "learning_rate": 3e-4}}
    runs = {"a": a_run("a", curve(3.0, 2.8)), "b": a_run("b", curve(3.0, 2.0))}
    assert moves(given, runs) == {}
    # the spec's value stands in for a config that names none: a clean comparison again
    given = {"a": {}, "b": {"lora_r": 16}}
    assert moves(given, runs) == {"b_lora_r_20": {"lora_r": 20}}


def test_a_factory_loss_weight_and_the_batch_move_too_and_a_tie_at_the_top_does_not() -> None:
    given = {"w1": {"mel_weight": 1.0}, "w2": {"mel_weight": 2.0}}
    runs = {"w1": a_run("w1", curve(3.0, 2.6)), "w2": a_run("w2", curve(3.0, 2.0))}
    assert moves(given, runs) == {"w2_mel_weight_2.5": {"mel_weight": 2.5}}
    tie = {"w1": a_run("w1", curve(3.0, 2.01)), "w2": a_run("w2", curve(3.0, 2.0))}  # the same result
    assert "w2_mel_weight_2.5" not in moves(given, tie)
    given = {"b4": {"batch_size": 4}, "b8": {"batch_size": 8}}
    runs = {"b4": a_run("b4", curve(3.0, 2.0)), "b8": a_run("b8", curve(3.0, 2.4))}
    assert moves(given, runs) == {"b4_batch_size_2": {"batch_size": 2}}


def test_the_training_values_and_a_dropout_at_its_edge_do_not_move() -> None:
    """The learning rate has its rule; a warmup has no such edge; a dropout past 1 is none (a review
    found lr x1.25 beside the rule's x2, warmup_ratio 1.12 and lora_dropout 1.12 proposed)."""
    given = {"a": {"learning_rate": 1e-4, "warmup_ratio": 0.5, "lora_dropout": 0.5},
             "b": {"learning_rate": 1e-4, "warmup_ratio": 0.5, "lora_dropout": 0.9}}
    runs = {"a": a_run("a", curve(3.0, 2.6)), "b": a_run("b", curve(3.0, 2.0))}
    assert moves(given, runs) == {}
    given = {"a": {"warmup_ratio": 0.1}, "b": {"warmup_ratio": 0.9}}
    assert moves(given, runs) == {}
