"""The search: every strategy against a deterministic synthetic surface (a fake probe used only
to test search logic), persistence and resume on a real journal file, and one real end-to-end
tune of a tiny model under a real memory cap."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import TINY_LLAMA, make_spec_file
from trainfit.cli import main
from trainfit.command import build_command, render_template
from trainfit.errors import SpecError, TrainfitError
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.search.tune import tune
from trainfit.spec import load_spec

GiB = 1024**3
BUDGET, HEADROOM = 40.0, 2.0


class Surface:
    """Memory = 10 GiB + bs x per-sample cost; throughput saturates in bs. Checkpointing halves
    activation memory and costs 30% speed; LoRA rank 16 is 5% slower than 8."""

    def __init__(self, budget_gb: float = BUDGET) -> None:
        self.calls: list[dict[str, Any]] = []
        self.budget_gb = budget_gb

    def memory_gb(self, p: Params) -> float:
        return 10.0 + p.batch_size * (0.9 if p.gradient_checkpointing else 1.8) * (1 + (p.lora_r or 0) / 200)

    def throughput(self, p: Params) -> float:
        step = (1.3 if p.gradient_checkpointing else 1.0) * (1.05 if p.lora_r == 16 else 1.0)
        return p.batch_size / (0.5 + 0.1 * step * (p.batch_size + 1.5))

    def __call__(self, p: Params, number: int) -> Measurement:
        self.calls.append(p.to_dict())
        common = {"config": p.to_dict(), "budget_memory_gb": self.budget_gb, "budget_headroom_gb": HEADROOM,
                  "device": "cpu", "device_name": "synthetic", "wall_time_s": 1.0 + p.batch_size / 16}
        mem = self.memory_gb(p)
        if mem > self.budget_gb:  # the allocator fails before the step completes
            return Measurement(status="oom", message="synthetic OOM", peak_memory_bytes=int(self.budget_gb * GiB),
                               **common)
        sps = self.throughput(p)
        return Measurement(status="ok", samples_per_second=sps, tokens_per_second=sps * 100,
                           peak_memory_bytes=int(mem * GiB), steps_measured=5, stable=True, **common)

    def best_feasible(self, configs: list[dict[str, Any]]) -> float:
        ok = [self.throughput(Params(**c)) for c in configs
              if self.memory_gb(Params(**c)) + HEADROOM <= BUDGET]
        return max(ok)


def synthetic_spec(tmp_path: Path, strategy: str, *, no_budget: bool = False, **tune_extra: Any):
    budget = {"headroom_gb": HEADROOM} if no_budget else {"memory_gb": BUDGET, "headroom_gb": HEADROOM}
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64}, budget=budget)
    text = path.read_text() + (
        "search:\n  batch_size: [1, 2, 4, 8, 12, 16, 24, 32]\n  gradient_checkpointing: [false, true]\n"
        "  lora_r: [8, 16]\n"
        f"tune:\n  strategy: {strategy}\n  target_effective_batch: 32\n"
        + "".join(f"  {k}: {v}\n" for k, v in tune_extra.items()))
    path.write_text(text)
    return load_spec(path)


GRID = [{"batch_size": b, "gradient_checkpointing": g, "lora_r": r}
        for b in (1, 2, 4, 8, 12, 16, 24, 32) for g in (False, True) for r in (8, 16)]


@pytest.mark.parametrize("strategy", ["grid", "random", "bayes", "auto"])
def test_every_strategy_recommends_only_measured_configs_within_budget(tmp_path: Path, strategy: str) -> None:
    surface = Surface()
    spec = synthetic_spec(tmp_path, strategy, max_trials=12 if strategy != "grid" else 64)
    result = tune(spec, output=tmp_path / "out", probe_fn=surface)
    best = result.summary["best_config"]
    assert best is not None
    assert best["memory_peak_gb"] + HEADROOM <= BUDGET
    assert best["config"] in surface.calls  # recommended == measured
    assert best["effective_batch_size"] == pytest.approx(32, rel=0.5)
    assert result.summary["total_tested"] == len(surface.calls) == len(result.trials)
    assert result.summary["failed_oom"] == sum(1 for c in surface.calls if surface.memory_gb(Params(**c)) > BUDGET)
    assert set(result.summary["fastest_per_value"]["lora_r"]) == {"8", "16"} or strategy != "grid"
    assert (tmp_path / "out" / "trials.csv").read_text().count("\n") == len(surface.calls) + 1


def test_grid_finds_the_true_optimum_and_auto_gets_there_cheaper(tmp_path: Path) -> None:
    grid_surface, auto_surface = Surface(), Surface()
    grid = tune(synthetic_spec(tmp_path / "g", "grid"), output=tmp_path / "g" / "out", probe_fn=grid_surface)
    auto = tune(synthetic_spec(tmp_path / "a", "auto"), output=tmp_path / "a" / "out", probe_fn=auto_surface)
    truth = grid_surface.best_feasible(GRID)
    assert grid.summary["best_config"]["samples_per_second"] == pytest.approx(truth)
    assert auto.summary["best_config"]["samples_per_second"] >= 0.97 * truth
    assert len(auto_surface.calls) <= len(GRID) / 2
    # Memory is extrapolated from fitting probes: auto spends at most one probe per family on an OOM.
    assert auto.summary["failed_oom"] <= 4
    # The fastest config per LoRA rank is reported (rank changes what is learned).
    per_rank = auto.summary["fastest_per_value"]["lora_r"]
    assert set(per_rank) == {"8", "16"}


def test_without_a_target_effective_batch_the_summary_gives_the_fastest_per_effective_batch(tmp_path: Path) -> None:
    """A larger effective batch trains differently (fewer optimizer steps, another learning-rate
    trade-off) and measures faster, so it must not win silently over the spec's own."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": BUDGET, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4]\n  gradient_accumulation_steps: [1, 2]\n"
                    "tune:\n  strategy: grid\n")
    result = tune(load_spec(path), output=tmp_path / "out", probe_fn=Surface())
    per_batch = result.summary["fastest_per_value"]["effective_batch_size"]
    assert set(per_batch) == {"1", "2", "4", "8"}
    assert all(e["effective_batch_size"] == int(k) for k, e in per_batch.items())
    assert per_batch["2"]["searched"] == {"batch_size": 2, "gradient_accumulation_steps": 1}  # faster than 1 x 2
    # With a target, every config trains at one effective batch: nothing to choose between.
    fixed = tune(synthetic_spec(tmp_path / "t", "grid", max_trials=4), output=tmp_path / "t" / "out",
                 probe_fn=Surface())
    assert "effective_batch_size" not in fixed.summary["fastest_per_value"]

def test_without_a_spec_budget_auto_predicts_against_the_devices_memory(tmp_path: Path) -> None:
    """No budget.memory_gb: the probes record the device's memory as their budget, and auto
    predicts OOMs against it exactly as against a budget the spec gives (same probes)."""
    calls = {}
    budgets = {"spec": {"memory_gb": BUDGET, "headroom_gb": HEADROOM}, "device": {"headroom_gb": HEADROOM}}
    for name, budget in budgets.items():
        path = make_spec_file(tmp_path / name, model={"config": TINY_LLAMA}, params={"max_length": 64}, budget=budget)
        path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4, 8, 12, 16, 24, 32]\n"
                        "  gradient_checkpointing: [false, true]\n  lora_r: [8, 16]\n"
                        "tune:\n  strategy: auto\n  target_effective_batch: 32\n")
        surface = Surface()  # its measurements carry budget_memory_gb=40, as the worker records the device's
        result = tune(load_spec(path), output=tmp_path / name / "out", probe_fn=surface)
        calls[name] = surface.calls
        assert result.summary["budget"]["memory_gb"] == BUDGET
    assert calls["device"] == calls["spec"]

def test_resume_continues_without_reprobing(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    first = Surface()
    tune(spec, output=tmp_path / "out", probe_fn=first, max_trials=3)
    with pytest.raises(TrainfitError, match="--resume"):
        tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=6)
    second = Surface()
    result = tune(spec, output=tmp_path / "out", probe_fn=second, max_trials=6, resume=True)
    assert len(first.calls) == 3 and len(second.calls) == 3
    assert not any(c in first.calls for c in second.calls)
    assert result.summary["total_tested"] == 6


def test_a_trial_cut_off_by_a_crash_is_retried(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    crashing = Surface()

    def probe(p: Params, number: int) -> Measurement:
        if len(crashing.calls) == 2:
            crashing.calls.append(p.to_dict())
            raise KeyboardInterrupt  # the tuner dies mid-probe
        return crashing(p, number)

    with pytest.raises(KeyboardInterrupt):
        tune(spec, output=tmp_path / "out", probe_fn=probe, max_trials=5)
    interrupted = crashing.calls[2]
    again = Surface()
    result = tune(spec, output=tmp_path / "out", probe_fn=again, max_trials=5, resume=True)
    assert again.calls[0] == interrupted  # retried first
    assert result.summary["total_tested"] == 5


def test_a_studys_identity_leaves_defaults_out_so_it_survives_new_settings(tmp_path: Path) -> None:
    """The study name is pinned: a setting or knob a later trainfit adds at its default must not
    change it (a study started before could no longer --resume). Change this literal only with a
    change that really makes old trials inapplicable."""
    from trainfit.search.study import study_name

    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "batch_size": 2},
                          budget={"memory_gb": 4})
    spec = load_spec(path, ["search.batch_size=[1,2]"])
    assert study_name(spec) == "trainfit-37e1a45c1ac3"
    # a default written out is the same study; a value that differs from the default is another
    assert study_name(load_spec(path, ["search.batch_size=[1,2]", "lora_dropout=0.0", "probe.seed=0"])) == \
        study_name(spec)
    assert study_name(load_spec(path, ["search.batch_size=[1,2]", "probe.seed=1"])) != study_name(spec)

def test_a_changed_spec_does_not_resume_a_foreign_study(tmp_path: Path) -> None:
    tune(synthetic_spec(tmp_path, "grid"), output=tmp_path / "out", probe_fn=Surface(), max_trials=2)
    changed = synthetic_spec(tmp_path / "c", "grid")
    changed = load_spec(changed.source, ["budget.memory_gb=30"])
    with pytest.raises(TrainfitError, match="spec changed") as info:
        tune(changed, output=tmp_path / "out", probe_fn=Surface(), resume=True)
    assert "budget.memory_gb" in str(info.value)  # it names what changed


def test_when_everything_ooms_the_summary_says_what_to_change(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2, 4]\n")
    result = tune(load_spec(path), output=tmp_path / "out", probe_fn=Surface(budget_gb=5.0))
    failed = result.summary["all_failed"]
    assert result.summary["best_config"] is None
    assert len(failed["measured_peaks_gb"]) == 1  # auto stops the family after the smallest batch OOMs
    assert any(a.startswith("gradient_checkpointing: true") for a in failed["advice"])
    assert any(a.startswith("lora_r") for a in failed["advice"])
    assert any(a.startswith("batch_size: 1") for a in failed["advice"])


def test_an_oom_that_said_what_it_asked_for_needs_at_least_that(tmp_path: Path) -> None:
    """The budget an OOM needs is at least what was allocated at the failure plus what the failed
    allocation asked for, which can be far above the peak it reached before failing."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2, 4]\n")

    def oom(p: Params, number: int) -> Measurement:
        return Measurement(status="oom", message="out of memory", config=p.to_dict(),
                           peak_memory_bytes=int(3 * GiB), oom_needed_bytes=int(p.batch_size * 3 * GiB),
                           budget_memory_gb=5.0, budget_headroom_gb=HEADROOM)

    smallest = tune(load_spec(path), output=tmp_path / "out", probe_fn=oom).summary["all_failed"]["smallest_peak"]
    assert smallest["searched"] == {"batch_size": 2} and smallest["at_least"]
    assert smallest["needs_memory_gb"] == pytest.approx(6.0 + HEADROOM)
    rows = list(csv.DictReader((tmp_path / "out" / "trials.csv").open()))
    assert [float(r["oom_needs_more_than_gb"]) for r in rows] == [6.0]  # auto stops the family at its first OOM


@pytest.mark.parametrize("parts, first", [
    ({"model": 2.0, "optimizer": 6.0, "runtime": 0.5, "step": 1.0}, "lora_r"),
    ({"model": 2.0, "optimizer": 1.0, "runtime": 0.5, "step": 6.0}, "gradient_checkpointing"),
])
def test_when_nothing_fits_the_advice_starts_with_the_largest_measured_part(
        tmp_path: Path, parts: dict[str, float], first: str) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2, 4]\ntune:\n  strategy: grid\n")

    def over_budget(p: Params, number: int) -> Measurement:
        scaled = {k: int(v * GiB * (p.batch_size / 2 if k == "step" else 1)) for k, v in parts.items()}
        return Measurement(status="ok", config=p.to_dict(), samples_per_second=10.0, tokens_per_second=1e3,
                           peak_memory_bytes=sum(scaled.values()), memory_parts_bytes=scaled,
                           budget_memory_gb=5.0, budget_headroom_gb=HEADROOM, steps_measured=5)

    failed = tune(load_spec(path), output=tmp_path / "out", probe_fn=over_budget).summary["all_failed"]
    assert failed["advice"][0].startswith(first)
    smallest = failed["smallest_peak"]
    assert smallest["searched"] == {"batch_size": 2}
    assert smallest["parts_gb"] == pytest.approx(parts)
    assert smallest["needs_memory_gb"] == pytest.approx(sum(parts.values()) + HEADROOM)


def test_when_the_full_logits_weigh_the_advice_starts_with_a_loss_without_them(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": 5.0, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [2]\n")

    def logits_heavy(p: Params, number: int, logits_gb: float = 2.0) -> Measurement:
        parts = {"model": 1 * GiB, "optimizer": 1 * GiB, "runtime": GiB // 2, "step": 5 * GiB}
        return Measurement(status="ok", config=p.to_dict(), samples_per_second=10.0, tokens_per_second=1e3,
                           peak_memory_bytes=sum(parts.values()), memory_parts_bytes=parts,
                           full_logits_bytes=int(logits_gb * GiB) or None,
                           budget_memory_gb=5.0, budget_headroom_gb=HEADROOM, steps_measured=5)

    failed = tune(load_spec(path), output=tmp_path / "out", probe_fn=logits_heavy).summary["all_failed"]
    assert failed["smallest_peak"]["full_logits_gb"] == pytest.approx(2.0)
    assert failed["advice"][0].startswith("a loss without the full logits") and "2.00 GiB" in failed["advice"][0]
    assert failed["advice"][1].startswith("gradient_checkpointing")
    # a loss that builds no full logits (TRL's fused head) gets no such advice
    failed = tune(load_spec(path), output=tmp_path / "out2",
                  probe_fn=lambda p, n: logits_heavy(p, n, 0.0)).summary["all_failed"]
    assert not any("full logits" in a for a in failed["advice"])


class NoBf16(Surface):
    """A machine without bf16: such probes fail as unsupported, as the worker reports them."""

    def __call__(self, p: Params, number: int) -> Measurement:
        if p.precision == "bf16":
            self.calls.append(p.to_dict())
            return Measurement(status="error", config=p.to_dict(), unsupported={"precision": "bf16"},
                               message="precision=bf16 but this GPU has no bf16 support")
        return super().__call__(p, number)


@pytest.mark.parametrize("strategy", ["grid", "auto", "bayes"])
def test_a_knob_value_the_machine_cannot_run_costs_one_probe(tmp_path: Path, strategy: str) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": BUDGET, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2, 4, 8]\n  precision: [bf16, fp32]\n"
                    f"  gradient_checkpointing: [false, true]\ntune:\n  strategy: {strategy}\n  max_trials: 16\n")
    surface = NoBf16()
    summary = tune(load_spec(path), output=tmp_path / "out", probe_fn=surface).summary
    assert sum(c["precision"] == "bf16" for c in surface.calls) == 1  # not once per family or batch size
    assert [(u["knob"], u["value"]) for u in summary["unsupported"]] == [("precision", "bf16")]
    assert summary["best_config"]["searched"]["precision"] == "fp32"


def test_a_real_probe_of_an_unsupported_kernel_skips_it_for_the_rest(tmp_path: Path, texts_file, capsys) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          data={"path": str(texts_file[0]), "text_field": "text"}, params={"max_length": 32})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2]\n  attention: [flash_attention_2, sdpa]\n"
                    "tune:\n  strategy: grid\n")
    assert main(["tune", str(path), "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "skipped every config with attention=flash_attention_2: cannot run on this machine" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["total_tested"] == 3 and summary["failed_error"] == 1  # flash once, sdpa at both batches


def test_search_section_is_validated(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    path.write_text(path.read_text() + "search:\n  batch_size: {low: 8, high: 2}\n  precision: [bf16, fp8]\n"
                    "  gradient_accumulation_steps: [1, 2]\ntune:\n  target_effective_batch: 16\n"
                    "  constraints: ['lora_rank >= 4']\n  strategy: genetic\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    keys = sorted(p.key for p in info.value.problems)
    assert keys == ["search.batch_size", "search.gradient_accumulation_steps", "search.precision",
                    "tune.constraints", "tune.strategy"]


def test_commands_come_from_the_probed_params(tmp_path: Path) -> None:
    params = Params(batch_size=6, gradient_accumulation_steps=24, lora_r=24, precision="bf16",
                    gradient_checkpointing=True, extra={"ddpm_batch_mul": 4})
    template = ("python -m vibevoice.finetune.train_vibevoice --per_device_train_batch_size {batch_size} "
                "--gradient_accumulation_steps {gradient_accumulation_steps} --lora_r {lora_r} "
                "--ddpm_batch_mul {ddpm_batch_mul}")
    assert render_template(template, params).endswith(
        "--per_device_train_batch_size 6 --gradient_accumulation_steps 24 --lora_r 24 --ddpm_batch_mul 4")
    with pytest.raises(TrainfitError, match="unknown placeholders: lr"):
        render_template("train --lr {lr}", params)
    assert render_template("train --epochs {epochs} --bs {effective_batch_size}", params, 2.5) == \
        "train --epochs 2.5 --bs 144"
    spec_file = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    cmd = build_command(load_spec(spec_file), params)
    assert cmd.startswith("trl sft ")
    # TRL's default is 3 epochs: the command trains the 1 the runtime estimate is for
    for flag in ("--per_device_train_batch_size 6", "--gradient_accumulation_steps 24", "--bf16 true --fp16 false",
                 "--dtype bfloat16", "--gradient_checkpointing true", "--use_peft true --lora_r 24 --lora_alpha 48",
                 "--optim adamw_torch", "--num_train_epochs 1 "):
        assert flag in cmd
    assert "--num_train_epochs 2 " in build_command(load_spec(spec_file, ["tune.epochs=2"]), params)
    # TF32 is a CUDA setting: a config probed on CPU gets --tf32 false (transformers refuses true there)
    tf32 = params.replace(tf32=True)
    assert "--tf32 true " in build_command(load_spec(spec_file), tf32)
    assert "--tf32 false " in build_command(load_spec(spec_file), tf32, cpu_threads=2)
    for bad in ("tune.epochs=0", "tune.time_budget_s=-5"):
        with pytest.raises(SpecError, match=f"{bad.split('=')[0]}: must be > 0"):
            load_spec(spec_file, [bad])


def test_cli_tune_end_to_end_on_a_tiny_model_under_a_real_cap(tmp_path: Path, texts_file, capsys) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"max_length": 64}, budget={"memory_gb": 1.5, "headroom_gb": 0.2})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 4]\n  lora_r: [null, 4]\n")
    out = tmp_path / "out"
    assert main(["tune", str(path), "--output", str(out), "--quick", "--strategy", "grid"]) == 0
    printed = capsys.readouterr().out
    assert "BEST CONFIGURATION" in printed and "fastest per lora_r" in printed
    assert "GiB, full run ~" in printed  # each fitting config's line says how long the full run would take
    assert "[4/4] " in printed  # --quick allows 6 probes, the space has 4 configs
    assert "note (every probe): loss: TRL's fused LM head" in printed  # what the probes noticed, said once
    lengths = json.loads((out / "summary.json").read_text())["lengths"]
    assert lengths["max"] == max(texts_file[1]) and lengths["description"].startswith("text in 'text'")
    assert "data: 200 samples, lengths" in printed and "tokenizer:) for exact counts" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_tested"] == 4 and summary["successful"] == 4
    loss_notes = [n for n in summary["notes"] if n["note"].startswith("loss: ")]
    assert len(loss_notes) == 1 and loss_notes[0]["trials"] == [0, 1, 2, 3]
    best = summary["best_config"]
    assert best["memory_peak_gb"] + 0.2 <= 1.5
    script = (out / "train_command.sh").read_text()
    assert f"--per_device_train_batch_size {best['config']['batch_size']}" in script
    assert len(list((out / "probes").iterdir())) == 4  # each probe's request, log and result kept
    # Running again into the same folder without --resume is refused; nothing measured is lost.
    assert main(["tune", str(path), "--output", str(out), "--quick"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["total_tested"] == 4
    # An output folder that cannot be created (under a file) is a clear error, not a traceback.
    assert main(["tune", str(path), "--output", str(out / "summary.json" / "x"), "--quick"]) == 2
    assert "cannot create the output folder" in capsys.readouterr().err


def test_ranges_constraints_refine_and_module_lists(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64, "lora_r": 8},
                          budget={"memory_gb": BUDGET, "headroom_gb": HEADROOM})
    path.write_text(path.read_text() + (
        "search:\n  batch_size: {low: 1, high: 32, log: true}\n  lora_r: [4, 8, 16]\n"
        "  lora_target_modules: [[q_proj, v_proj], all-linear]\n"
        "tune:\n  constraints: ['lora_r >= 8']\n  objective: tokens_per_second\n"))
    spec = load_spec(path)
    assert spec.search.dim("batch_size").grid_values() == (1, 2, 4, 8, 16, 32)
    surface = Surface()
    result = tune(spec, output=tmp_path / "out", probe_fn=surface, strategy="bayes", max_trials=8, refine=True)
    assert all(c["lora_r"] >= 8 for c in surface.calls)  # the constraint holds for every probe
    assert {tuple(c["lora_target_modules"]) if isinstance(c["lora_target_modules"], list)
            else c["lora_target_modules"] for c in surface.calls} <= {("q_proj", "v_proj"), "all-linear"}
    best = result.summary["best_config"]
    assert result.summary["objective"] == "tokens_per_second"
    assert best["tokens_per_second"] == max(t.objective for t in result.trials if t.feasible)
    # bayes may propose a range value off the grid (e.g. batch 11): it is probed like any other
    assert all(1 <= c["batch_size"] <= 32 for c in surface.calls)


def test_refine_probes_the_neighbours_of_the_best(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "auto")
    first = Surface()
    plain = tune(spec, output=tmp_path / "a", probe_fn=first)
    refined = Surface()
    tune(spec, output=tmp_path / "b", probe_fn=refined, refine=True)
    assert refined.calls[:len(first.calls)] == first.calls  # same auto phase (deterministic)
    extra = refined.calls[len(first.calls):]
    assert extra, "refine probed nothing"
    from trainfit.search.strategies import config_key
    from trainfit.search.tune import neighbours

    auto_best = plain.trials[[t.number for t in plain.trials].index(plain.summary["best_config"]["trial"])].values
    measured = {config_key({k: c[k] for k in spec.search.names}) for c in first.calls}
    wanted = {config_key(v) for v in neighbours(spec.search, auto_best)} - measured
    assert wanted and wanted <= {config_key({k: c[k] for k in spec.search.names}) for c in extra}


def test_quick_refine_searches_locally_beyond_the_quick_budget(tmp_path: Path) -> None:
    """The seeds' `--quick --refine`: 6 configs, then improvements around the best."""
    spec = synthetic_spec(tmp_path, "random")
    quick = tune(spec, output=tmp_path / "a", probe_fn=Surface(), quick=True)
    surface = Surface()
    result = tune(spec, output=tmp_path / "b", probe_fn=surface, quick=True, refine=True)
    assert quick.summary["total_tested"] == 6 and len(surface.calls) > 6
    assert "then refined" in result.stop_reason
    assert result.best.objective >= quick.best.objective
    from trainfit.search.strategies import config_key
    from trainfit.search.tune import neighbours

    # a local search: it ends where no neighbour of the best is left unmeasured
    measured = {config_key(t.values) for t in result.trials}
    assert all(config_key(v) in measured for v in neighbours(spec.search, result.best.values))


def test_cli_default_output_is_a_new_folder_and_resume_takes_the_latest(tmp_path: Path, texts_file, capsys,
                                                                        monkeypatch) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"max_length": 32}, name="one.yaml")
    path.write_text(path.read_text() + "search:\n  batch_size: [1]\n")
    monkeypatch.chdir(tmp_path)
    assert main(["tune", str(path), "--quiet"]) == 0
    runs = list((tmp_path / "trainfit-runs" / "one").iterdir())
    assert len(runs) == 1 and (runs[0] / "summary.json").exists()
    capsys.readouterr()
    assert main(["tune", str(path), "--resume"]) == 0  # nothing left to probe: reports the stored result
    out = capsys.readouterr().out
    assert f"-> {Path('trainfit-runs') / 'one' / runs[0].name}" in out
    assert "resuming: 1 trials already measured" in out and "BEST CONFIGURATION" in out
    assert len(list((tmp_path / "trainfit-runs" / "one").iterdir())) == 1


def test_cli_when_nothing_fits_names_the_closest_config_and_where_its_memory_went(
        tmp_path: Path, texts_file, capsys) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          data={"path": str(texts_file[0]), "text_field": "text"}, params={"max_length": 32},
                          budget={"memory_gb": 2.0, "headroom_gb": 1.9})  # fits under 0.1 GiB: never
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 2]\n")
    assert main(["tune", str(path), "--output", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "No configuration fits: budget 2 GiB (headroom 1.9 GiB)." in out
    assert "closest to fitting: batch_size=1, peak" in out
    assert "of which model" in out and "runtime" in out and "worst-case step" in out
    assert "the largest part is the process itself" in out  # torch alone outweighs this tiny model
    smallest = json.loads((tmp_path / "out" / "summary.json").read_text())["all_failed"]["smallest_peak"]
    assert f"it would fit with --memory-gb {smallest['needs_memory_gb']:.2f}" in out
    with (tmp_path / "out" / "trials.csv").open() as f:
        for row in csv.DictReader(f):  # the parts are columns, each probe's summing to its peak
            parts = [float(v) for k, v in row.items() if k.startswith("memory_") and k != "memory_peak_gb" and v]
            assert len(parts) >= 4 and sum(parts) == pytest.approx(float(row["memory_peak_gb"]))


def test_cli_when_every_config_ooms_says_how_much_they_needed_at_least(tmp_path: Path, capsys) -> None:
    """A real OOM under a CPU cap: the progress line, the nothing-fits table and the closest
    config give the lower bound of need, which is above the cap."""
    model = {"config": {**TINY_LLAMA, "vocab_size": 4096, "max_position_embeddings": 2048}}
    path = make_spec_file(tmp_path, model=model, params={"max_length": 2048},
                          budget={"memory_gb": 0.9, "headroom_gb": 0.1})
    path.write_text(path.read_text() + "search:\n  batch_size: [16]\n")
    assert main(["tune", str(path), "--output", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    smallest = json.loads((tmp_path / "out" / "summary.json").read_text())["all_failed"]["smallest_peak"]
    need = smallest["oom_needs_more_than_gb"]
    assert smallest["status"] == "oom" and need > 0.9 * 0.9  # the allocation failed against the cap
    assert f"-> OOM (needs > {need:.2f} GiB)" in out and f"needs > {need:.2f} GiB: held when" in out
    assert f"--memory-gb above {need + 0.1:.2f}" in out
    # beyond the parts of the peak reached, the step was allocating more (TRL's 512 MiB tile)
    beyond = need - smallest["peak_gb"]
    assert f"and at least {beyond:.2f} GiB more than that peak when it failed" in out


def test_a_shared_storage_holds_several_studies_and_resumes_by_spec(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"  # a real database file, as several machines would share
    spec_a = synthetic_spec(tmp_path / "a", "grid")
    spec_b = load_spec(spec_a.source, ["budget.memory_gb=30"])
    tune(spec_a, output=tmp_path / "out-a", probe_fn=Surface(), max_trials=2, storage=url)
    tune(spec_b, output=tmp_path / "out-b", probe_fn=Surface(budget_gb=30), max_trials=2, storage=url)
    again = Surface()
    events: list[dict[str, Any]] = []
    result = tune(spec_a, output=tmp_path / "out-a2", probe_fn=again, max_trials=4, storage=url, resume=True,
                  on_event=events.append)
    assert len(again.calls) == 2 and result.summary["total_tested"] == 4
    # the same spec file under another budget is another study: the run names it and what differs
    [study] = [e for e in events if e["event"] == "study"]
    assert [o["differs"] for o in study["others"]] == [["budget.memory_gb"]]
    with pytest.raises(TrainfitError, match="already holds this tuning study"):
        tune(spec_b, output=tmp_path / "out-b2", probe_fn=Surface(), storage=url)


def test_grid_probes_each_model_family_in_a_row_smaller_batches_first() -> None:
    from trainfit.params import Params
    from trainfit.search.space import parse_space
    from trainfit.search.strategies import GridStrategy, model_family

    space, problems = parse_space({"batch_size": [8, 2, 4], "lora_r": [None, 8], "padding": ["longest", "max_length"]},
                                  Params(), allow_custom=False)
    assert not problems
    points = GridStrategy(space).points
    families = [model_family(p) for p in points]
    assert len(points) == 12 and len(set(families)) == 2
    assert families == sorted(families, key=families.index)  # one run per family
    first = [p for p in points if model_family(p) == families[0]]
    assert [p["batch_size"] for p in first] == [2, 2, 4, 4, 8, 8]


def test_auto_climbs_on_when_a_small_gain_is_within_measurement_noise() -> None:
    from trainfit.search.space import parse_space
    from trainfit.search.strategies import AutoStrategy, Trial

    space, problems = parse_space({"batch_size": [1, 2, 4, 8]}, Params(), allow_custom=False)
    assert not problems

    def trial(n: int, b: int, sps: float, ci: float) -> Trial:
        m = Measurement(status="ok", config={"batch_size": b}, samples_per_second=sps, step_time_ci95_rel=ci,
                        peak_memory_bytes=(1 + b) * GiB)
        return Trial(number=n, values={"batch_size": b}, measurement=m, objective=sps)

    auto = AutoStrategy(space, budget_gb=None, headroom_gb=0.0, device_type="cpu")
    # +1.5% from batch 1 to 2: saturated when the probes were precise ...
    assert auto.propose([trial(0, 1, 100.0, 0.001), trial(1, 2, 101.5, 0.001)]) is None
    # ... but one more step when each probe's CI is 5%: the true gain may well be larger.
    assert auto.propose([trial(0, 1, 100.0, 0.05), trial(1, 2, 101.5, 0.05)]) == {"batch_size": 4}


def store_for(spec: Any, output: Path, **kw: Any) -> Any:
    from trainfit.search.study import TrialStore

    return TrialStore(output=output, spec=spec, space=spec.search, objective="samples_per_second",
                      seed=0, **{"resume": False, "storage": None, **kw})


def test_a_running_tune_holds_its_output_folder(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid")
    running = store_for(spec, tmp_path / "out")  # as a tune in another terminal holds it
    with pytest.raises(TrainfitError, match=r"in use by a running trainfit tune \(pid \d+"):
        tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=2, resume=True)
    running.close()
    result = tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=2, resume=True)
    assert result.summary["total_tested"] == 2
    # and a finished tune released it
    assert tune(spec, output=tmp_path / "out", probe_fn=Surface(), max_trials=3, resume=True).new_trials == 1


def test_a_shared_storage_retries_only_trials_whose_owner_is_gone(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    machine_a = store_for(spec, tmp_path / "a", storage=url)
    in_flight = machine_a.ask({"batch_size": 1, "gradient_checkpointing": False, "lora_r": 8})
    # Machine B joins while A's probe runs: A's trial is not B's to retry.
    assert store_for(spec, tmp_path / "b", storage=url, resume=True).retried == 0
    # A dies mid-probe (its process is gone): the next one to join retries the trial.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    host = in_flight.user_attrs["owner"].split(":")[0]
    in_flight.set_user_attr("owner", f"{host}:{gone.stdout.strip()}")
    assert store_for(spec, tmp_path / "c", storage=url, resume=True).retried == 1


RUNNER_UP = (24, True, 8)  # 3.1% behind the best feasible config of Surface (12, False, 8)


class Noisy(Surface):
    """Each probe's CI: 4% for the runner-up, 0.1% elsewhere."""

    def __call__(self, p: Params, number: int) -> Measurement:
        m = super().__call__(p, number)
        ci = 0.04 if (p.batch_size, p.gradient_checkpointing, p.lora_r) == RUNNER_UP else 0.001
        return Measurement.from_dict({**m.to_dict(), "step_time_ci95_rel": ci})


def test_the_summary_names_runners_up_within_measurement_noise(tmp_path: Path) -> None:
    spec = synthetic_spec(tmp_path, "grid", max_trials=64)
    summary = tune(spec, output=tmp_path / "out", probe_fn=Noisy()).summary
    best = summary["best_config"]
    ties = summary["within_noise_of_best"]
    # The runner-up 3.1% behind, with a 4% CI, is a tie; the one 3.6% behind with 0.1% is not.
    assert [t["searched"] for t in ties] == [{"batch_size": 24, "gradient_checkpointing": True, "lora_r": 8}]
    for tie in ties:
        assert 0 <= tie["gap"] <= tie["noise"]
        assert 1 - tie["samples_per_second"] / best["samples_per_second"] == pytest.approx(tie["gap"])
    clear = [e for e in summary["runners_up"] if e["trial"] not in {t["trial"] for t in ties}]
    assert all(best["samples_per_second"] / e["samples_per_second"] - 1 > 0.002 for e in clear)


def test_confirmation_rounds_rank_tied_configs_by_the_median_of_interleaved_repeats(tmp_path: Path) -> None:
    class Drifting(Noisy):
        """Measured again, the runner-up comes out 10% faster and the first-round best 10% slower."""

        def __call__(self, p: Params, number: int) -> Measurement:
            m = super().__call__(p, number)
            if self.calls.count(p.to_dict()) == 1:
                return m
            factor = 1.1 if (p.batch_size, p.gradient_checkpointing, p.lora_r) == RUNNER_UP else 0.9
            return Measurement.from_dict({**m.to_dict(), "samples_per_second": m.samples_per_second * factor})

    spec = synthetic_spec(tmp_path, "grid", max_trials=64, confirm_rounds=2, confirm_margin=0.0)
    surface = Drifting()
    result = tune(spec, output=tmp_path / "out", probe_fn=surface)
    s = result.summary
    runner_up = dict(zip(("batch_size", "gradient_checkpointing", "lora_r"), RUNNER_UP, strict=True))
    assert s["best_config"]["searched"] == runner_up == result.best.values
    assert [e["searched"] for e in s["confirmation"]] == [runner_up, {**runner_up, "batch_size": 12,
                                                                        "gradient_checkpointing": False}]
    assert all(len(e["measurements"]) == 3 for e in s["confirmation"])
    assert s["best_config"]["confirmed_median"] == s["confirmation"][0]["median"]
    assert s["total_tested"] == len(result.trials) == len(surface.calls) - 4  # repeats are not new configs
    rows = (tmp_path / "out" / "trials.csv").read_text().splitlines()
    assert len(rows) == 1 + len(surface.calls)  # every probe, repeats included
    assert sum(r.split(",")[1] in ("2", "3") for r in rows[1:]) == 4
    assert [c["batch_size"] for c in surface.calls[-4:]] == [12, 24, 12, 24]  # interleaved: A B A B
    assert f"trial {s['best_config']['trial']}" in (tmp_path / "out" / "train_command.sh").read_text()
    again = Drifting()
    resumed = tune(spec, output=tmp_path / "out", probe_fn=again, resume=True)
    assert again.calls == [] and resumed.summary["best_config"]["searched"] == runner_up


def test_confirmation_leaves_a_config_another_run_is_probing_to_that_run(tmp_path: Path) -> None:
    """Two runs of a shared storage that end their search together confirm together: each
    re-probes only what the other is not probing at that moment."""
    import subprocess
    import sys

    from trainfit.search.tune import confirm

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid", max_trials=64, confirm_rounds=1, confirm_margin=0.0)
    searched = tune(load_spec(spec.source, ["tune.confirm_rounds=0"]), output=tmp_path / "a", storage=url,
                    probe_fn=Noisy())
    assert searched.summary["within_noise_of_best"]  # the runner-up is a tie: confirmation takes it
    runner_up = dict(zip(("batch_size", "gradient_checkpointing", "lora_r"), RUNNER_UP, strict=True))
    in_flight = store_for(spec, tmp_path / "b", storage=url, resume=True).ask(runner_up)
    other_run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # alive, probing it
    in_flight.set_user_attr("owner", f"{in_flight.user_attrs['owner'].split(':')[0]}:{other_run.pid}")
    store = store_for(spec, tmp_path / "c", storage=url, resume=True, join=True)
    surface, events = Noisy(), []
    try:
        confirm(spec, spec.search, store, store.history(), surface, lambda event: None)
        store.close()
        # a run joining now has nothing left to search: it does not wait for the other's repeat
        joined = tune(load_spec(spec.source, ["tune.confirm_rounds=0"]), output=tmp_path / "d", storage=url,
                      join=True, probe_fn=Noisy(), on_event=events.append)
    finally:
        other_run.kill()
    assert [(c["batch_size"], c["gradient_checkpointing"], c["lora_r"]) for c in surface.calls] == [(12, False, 8)]
    assert joined.new_trials == 0 and not [e for e in events if e["event"] == "waiting"]


def test_a_clear_winner_needs_no_confirmation(tmp_path: Path) -> None:
    surface = Surface()  # precise probes, and the runner-up is 3.0% behind: outside the margin
    result = tune(synthetic_spec(tmp_path, "grid", max_trials=64, confirm_rounds=3, confirm_margin=0.02),
                  output=tmp_path / "out", probe_fn=surface)
    assert len(surface.calls) == len(result.trials) and result.summary["confirmation"] == []


def test_confirmation_also_takes_runners_up_within_the_margin(tmp_path: Path) -> None:
    """One probe's CI does not see a machine that drifts between probes: with precise probes,
    the runners-up 3.0% and 3.5% behind are confirmed under a 4% margin, the one 7% behind not."""
    surface = Surface()
    result = tune(synthetic_spec(tmp_path, "grid", max_trials=64, confirm_rounds=1, confirm_margin=0.04),
                  output=tmp_path / "out", probe_fn=surface)
    confirmed = [tuple(e["searched"].values()) for e in result.summary["confirmation"]]
    assert sorted(confirmed) == sorted([(12, False, 8), (24, True, 8), (12, False, 16)])
    assert len(surface.calls) == len(result.trials) + 3


class Slow(Surface):
    """A probe that takes a moment, so that two runs overlap; its calls go to a file."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.log = log

    def __call__(self, p: Params, number: int) -> Measurement:
        import time

        time.sleep(0.15)
        m = super().__call__(p, number)
        self.log.write_text(json.dumps(self.calls))
        return m


def _join(spec: Any, url: str, output: Path, log: Path, summary: Path) -> None:
    """One machine of several started with the same command (run in a child process)."""
    import importlib

    importlib.import_module("trainfit.search.tune").BUSY_WAIT_S = 0.05  # the module, not the function
    result = tune(spec, output=output, probe_fn=Slow(log), storage=url, join=True, max_trials=64)
    summary.write_text(json.dumps(result.summary["best_config"]["searched"]))


@pytest.mark.parametrize("strategy", ["grid", "auto", pytest.param("bayes", marks=pytest.mark.slow)])
def test_runs_sharing_a_storage_split_the_work_without_probing_a_config_twice(tmp_path: Path, strategy: str) -> None:
    """Two runs started at once with `--join` on a fresh storage: one creates the study, the
    other joins it, and between them every config is probed once."""
    import multiprocessing

    url = f"sqlite:///{tmp_path / 'shared.db'}"  # a real database file, as several machines would share
    spec = synthetic_spec(tmp_path, strategy)
    fork = multiprocessing.get_context("fork")
    runs = [fork.Process(target=_join, args=(spec, url, tmp_path / f"m{i}", tmp_path / f"calls{i}.json",
                                             tmp_path / f"best{i}.json")) for i in range(2)]
    for r in runs:
        r.start()
    for r in runs:
        r.join(timeout=120)
        assert r.exitcode == 0
    calls = [json.loads((tmp_path / f"calls{i}.json").read_text()) for i in range(2)]
    probed = [tuple(c[k] for k in ("batch_size", "gradient_checkpointing", "lora_r")) for c in calls[0] + calls[1]]
    assert len(probed) == len(set(probed))  # no config probed twice
    assert all(calls)  # both runs did part of the work
    if strategy == "grid":
        assert len(probed) == 32
    best = [json.loads((tmp_path / f"best{i}.json").read_text()) for i in range(2)]
    alone = tune(synthetic_spec(tmp_path / "alone", strategy), output=tmp_path / "alone-out", probe_fn=Surface())
    assert best[0] == best[1] == alone.best.values  # both saw every result, and found what one run finds


@pytest.mark.parametrize(("option", "message"), [
    (["--max-trials", "0"], "argument --max-trials: 0 is out of range: expected an integer >= 1"),
    (["--time-budget", "-5"], "argument --time-budget: -5 is out of range: expected a number > 0"),
    (["--confirm", "two"], "argument --confirm: 'two' is not an integer"),
])
def test_bad_tune_options_are_usage_errors_that_name_the_bound(tmp_path: Path, capsys: Any, option: list[str],
                                                                message: str) -> None:
    path = synthetic_spec(tmp_path, "grid").source
    with pytest.raises(SystemExit) as exit_:
        main(["tune", str(path), "--output", str(tmp_path / "out"), *option])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing started


def test_a_heartbeat_tells_a_live_trial_on_another_machine_from_a_dead_one(tmp_path: Path, monkeypatch: Any) -> None:
    import time

    from trainfit.search import study

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    spec = synthetic_spec(tmp_path, "grid")
    machine_a = store_for(spec, tmp_path / "a", storage=url)
    live = machine_a.ask({"batch_size": 1, "gradient_checkpointing": False, "lora_r": 8})
    dead = machine_a.ask({"batch_size": 2, "gradient_checkpointing": False, "lora_r": 8})
    for t in (live, dead):
        t.set_user_attr("owner", "another-host:1")  # a pid this host cannot check
    monkeypatch.setattr(study, "HEARTBEAT_S", 0.05)
    with machine_a.beating(live):  # the live machine's probe runs ...
        time.sleep(0.3)  # ... while the dead one's last beat ages past three missed beats
        assert store_for(spec, tmp_path / "b", storage=url, resume=True).retried == 1
    frozen = {t.number: t for t in machine_a.study.get_trials()}
    assert frozen[dead.number].state.name == "FAIL" and frozen[live.number].state.name == "RUNNING"
    assert frozen[live.number].user_attrs["heartbeat"] > frozen[dead.number].user_attrs["heartbeat"] + 0.2


def test_after_a_sigterm_the_printed_command_resumes_the_same_shared_study(tmp_path: Path) -> None:
    """A real `trainfit tune` (real probes) on a shared storage, stopped by SIGTERM as a cluster
    preempts a job (handled as Ctrl-C is): the command it prints (overrides and --storage
    included) continues the same study."""
    import shlex
    import signal
    import subprocess
    import sys

    path = synthetic_spec(tmp_path, "grid").source
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    cli = [sys.executable, "-c", "import sys; from trainfit.cli import main; sys.exit(main())"]
    run = subprocess.Popen([*cli, "tune", str(path), "--set", "probe.max_seconds=1", "--storage", url,
                            "--output", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    assert run.stdout is not None
    first_lines = []
    for line in run.stdout:
        if line.startswith("shared study"):
            first_lines.append(line)
        if line.startswith("[1/"):  # one trial stored; the next probe is running
            break
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 143, err  # not killed by the signal (-15): it stopped its probe and said how to resume
    hint = err.strip().splitlines()[-1].strip()
    assert "shared study trainfit-" in first_lines[0]  # the name every machine of the search prints
    words = shlex.split(hint)
    assert words[:2] == ["trainfit", "tune"] and "--storage" in words and "probe.max_seconds=1" in words
    again = subprocess.run([*cli, *words[1:], "--max-trials", "2", "--quiet"], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["total_tested"] == 2  # the stored trial, plus one new probe: nothing lost, nothing twice


def test_bayes_stops_when_its_sampler_only_proposes_measured_configs(tmp_path: Path) -> None:
    """A small space is soon fully measured; the GP then proposes measured configs only. Each is
    answered from the study without a probe, and `patience` of them in a row end the search
    (before, the loop asked up to 3 x max_trials times, each a GP fit)."""
    import optuna

    spec = load_spec(synthetic_spec(tmp_path, "bayes").source,
                     ["search.batch_size=[1, 2]", "tune.patience=5", "tune.max_trials=64"])
    surface = Surface()
    result = tune(spec, output=tmp_path / "out", probe_fn=surface)
    assert len(surface.calls) == len({json.dumps(c, sort_keys=True) for c in surface.calls}) <= 8  # each probed once
    study = optuna.load_study(study_name=None, storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "out" / "study.journal"))))
    runs, run = [], 0
    for t in sorted(study.trials, key=lambda t: t.number):
        run = run + 1 if t.user_attrs.get("reused") else 0
        runs.append(run)
    assert max(runs) <= 5 and len(study.trials) < 30
    assert "in a row" in result.stop_reason or "no better config" in result.stop_reason


@pytest.mark.parametrize(("option", "message"), [
    (["--storage", "nonsense"], "--storage 'nonsense' is not a database URL"),
    (["--storage", "postgresql://me:secret@db.invalid/trainfit"],  # no driver, or no such host
     "--storage postgresql://me:***@db.invalid/trainfit"),
    (["--join"], "--join is for runs sharing a --storage"),
])
def test_bad_storage_options_are_clear_errors(tmp_path: Path, capsys: Any, option: list[str], message: str) -> None:
    path = synthetic_spec(tmp_path, "grid").source
    assert main(["tune", str(path), "--output", str(tmp_path / "out"), *option]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "secret" not in err


@pytest.mark.parametrize("module", ["trainfit.report", "trainfit.search.study", "trainfit.cli.tune"])
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    """No import cycle depends on which module a caller happens to import first."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_report_html_draws_every_probe_by_family_against_the_budget(tmp_path: Path) -> None:
    from html.parser import HTMLParser

    surface = Surface()
    spec = synthetic_spec(tmp_path, "grid", max_trials=64)
    result = tune(spec, output=tmp_path / "out", probe_fn=surface)
    page = (tmp_path / "out" / "report.html").read_text()

    class Shapes(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[tuple[str, dict[str, str | None]]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append((tag, dict(attrs)))

    shapes = Shapes()
    shapes.feed(page)
    tags = shapes.tags
    trials = result.trials
    ooms = sum(t.measurement.status == "oom" for t in trials)
    fitting_or_over = sum(t.measurement.status == "ok" for t in trials)
    assert ooms > 0 and fitting_or_over > 0
    # each chart: a point per measured probe, a cross per OOM (the memory chart at its peak)
    assert sum(tag == "circle" for tag, _ in tags) == 2 * fitting_or_over
    assert sum(tag == "path" and a.get("class") == "oom" for tag, a in tags) == 2 * ooms
    assert sum(tag == "polyline" for tag, _ in tags) == 2 * 4  # 4 families (checkpointing x LoRA rank)
    hollow = sum(tag == "circle" and a.get("fill") == "white" for tag, a in tags)
    assert hollow == 2 * result.summary["over_budget"]
    assert f"budget {BUDGET:g} GiB" in page and f"fits below {BUDGET - HEADROOM:g} GiB" in page
    best = result.summary["best_config"]
    assert f"Best: trial {best['trial']}" in page and page.count("<tr>") == len(trials) + 1


def test_report_html_puts_an_oom_at_what_it_needed_at_least(tmp_path: Path) -> None:
    import dataclasses

    said = Measurement(status="oom", config={}, peak_memory_bytes=int(0.5 * GiB), oom_needed_bytes=int(0.9 * GiB))
    silent = Measurement(status="oom", config={}, peak_memory_bytes=int(0.5 * GiB))
    assert said.needed_bytes == int(0.9 * GiB) and silent.needed_bytes == int(0.5 * GiB)

    def probe(p: Params, number: int) -> Measurement:
        m = Surface()(p, number)
        return dataclasses.replace(m, oom_needed_bytes=int(123.45 * GiB)) if m.status == "oom" else m

    tune(synthetic_spec(tmp_path, "grid", max_trials=64), output=tmp_path / "out", probe_fn=probe)
    assert "needs &gt; 123.45 GiB" in (tmp_path / "out" / "report.html").read_text()


@pytest.mark.parametrize("device_gb, shown, drawn", [(80.0, "80", True), (1000.0, "1,000", False)])
def test_report_html_draws_the_devices_memory_only_where_it_leaves_the_peaks_readable(
        tmp_path: Path, device_gb: float, shown: str, drawn: bool) -> None:
    """No budget set: the device's memory is the budget. A machine's RAM far above every peak (a
    CPU run) would squeeze them onto the axis, so the title names it instead of a line."""
    tune(synthetic_spec(tmp_path, "grid", no_budget=True, max_trials=64), output=tmp_path / "out",
         probe_fn=Surface(budget_gb=device_gb))  # peaks up to 72 GiB
    page = (tmp_path / "out" / "report.html").read_text()
    assert (f">device memory {shown} GiB<" in page) is drawn  # the line's label
    assert (f"device memory {shown} GiB, far above, not drawn" in page) is not drawn  # the chart's title


def test_probe_and_command_truncate_at_the_models_positions(tmp_path: Path, texts_file) -> None:
    """max_length null means the longest sample, but never past the model's positions: the probe
    measures that length and the `trl sft` command is told it (else TRL would not truncate)."""
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe.runner import build_request
    from trainfit.report import command_length

    path = make_spec_file(tmp_path, model={"config": {**TINY_LLAMA, "max_position_embeddings": 32}},
                          data={"path": str(texts_file[0]), "text_field": "text"}, params={"batch_size": 2})
    spec = load_spec(path)
    stats = analyze_spec(spec, progress=False)
    assert stats.max > 32 and stats.max_positions == 32
    assert command_length(spec.params, stats) == 32
    assert build_request(spec, spec.params, stats, "cpu")["max_length"] == 32
    assert "--max_length 32 " in build_command(spec, spec.params, max_length=command_length(spec.params, stats))
    mine = load_spec(path, ["tune.command_template=python train.py --max_len {max_length}"])
    assert build_command(mine, mine.params, max_length=command_length(mine.params, stats)).endswith("--max_len 32")
    shorter = spec.params.replace(max_length=16)
    assert "--max_length 16 " in build_command(spec, shorter, max_length=command_length(shorter, stats))


def test_a_sharded_dataset_reaches_trl_as_the_same_files(tmp_path: Path) -> None:
    from trainfit.command import trl_data_config

    shards = tmp_path / "data"
    shards.mkdir()
    for i, words in enumerate((["a b", "c"], ["d e f"])):
        (shards / f"part-{i}.jsonl").write_text("".join(json.dumps({"text": w}) + "\n" for w in words))
    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                                    data={"path": "data", "text_field": "text"}))
    assert trl_data_config(spec) == {"datasets": [{"path": "json", "data_files": [str(shards / "part-0.jsonl"),
                                                                                    str(shards / "part-1.jsonl")]}]}
    with pytest.raises(SpecError, match=r"data.path: .*/data/\*.parquet matches no file"):
        load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                                 data={"path": "data/*.parquet", "text_field": "text"}))


def test_cli_tune_without_a_search_section_searches_the_default_space(tmp_path: Path, texts_file, capsys) -> None:
    """No search: section: batch sizes and checkpointing at the spec's own effective batch, so the
    answer trains what the spec describes, only faster."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"max_length": 32, "batch_size": 1, "gradient_accumulation_steps": 2})
    out = tmp_path / "out"
    assert main(["tune", str(path), "--output", str(out), "--strategy", "grid", "--confirm", "1"]) == 0
    printed = capsys.readouterr().out
    assert "no search: section" in printed
    assert "space: batch_size [1, 2], gradient_checkpointing [False, True]" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_tested"] == 4
    assert {e["effective_batch_size"] for e in [summary["best_config"], *summary["runners_up"]]} == {2}
    assert summary["spec"]["tune"]["confirm_rounds"] == 1  # --confirm survives the default space's re-read


def test_unstable_probes_are_flagged_as_they_end_and_at_the_end(capsys: Any) -> None:
    """A busy machine shows as it happens: the trial's line carries its spread, and when most
    probes ended unstable the run says so and what to do."""
    from trainfit.cli.tune import TuneView, noise_warning
    from trainfit.search.strategies import Trial

    def trial(n: int, stable: bool, ci: float) -> Trial:
        m = Measurement(status="ok", config={}, samples_per_second=10.0, peak_memory_bytes=GiB, stable=stable,
                        step_time_ci95_rel=ci, budget_memory_gb=4.0, budget_headroom_gb=0.5)
        return Trial(n, {"batch_size": 1}, m, 10.0)

    noisy = [trial(0, False, 0.65), trial(1, False, 0.40), trial(2, True, 0.01)]
    TuneView(quiet=False, objective="samples_per_second")(
        {"event": "trial_end", "measurement": noisy[0].measurement, "best": noisy[0], "values": {"batch_size": 1},
         "index": 1, "max_trials": 3, "mean_probe_s": 5.0, "refining": False, "elapsed_s": 5.0})
    assert "10 samples/s ±65% (not stable), peak 1.00 GiB" in capsys.readouterr().out
    assert "2 of 3 probes" in noise_warning(noisy) and "median ±52%" in noise_warning(noisy)
    assert noise_warning(noisy[1:]) is None  # half or fewer: nothing to say
    assert noise_warning([trial(0, False, 0.03), trial(1, False, 0.09)]) is None  # near the target: the tie list
