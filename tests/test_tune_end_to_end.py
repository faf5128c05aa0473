"""Real ``trainfit tune`` runs of a tiny random-init model: every probe a real model step in its
own worker process, on CPU under a real memory cap, checked through what the CLI prints and
writes (summary.json, trials.csv, train_command.sh, probes/). All in the integration tier."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, make_spec_file
from tune_helpers import synthetic_spec

from trainfit.cli import main
from trainfit.params import Params
from trainfit.probe.estimate import StepCost, epoch_speed, typical_mix

pytestmark = pytest.mark.integration


def test_cli_tune_end_to_end_on_a_tiny_model_under_a_real_cap(tmp_path: Path, texts_file, capsys) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA},
                          data={"path": str(texts_file[0]), "text_field": "text"},
                          params={"max_length": 64}, budget={"memory_gb": 1.5, "headroom_gb": 0.2})
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 4]\n  lora_r: [null, 4]\n")
    out = tmp_path / "out"
    assert main(["tune", str(path), "--output", str(out), "--quick", "--strategy", "grid"]) == 0
    printed = capsys.readouterr().out
    assert "BEST CONFIGURATION (peak memory on the worst-case batch; speed expected over the epoch's own batches)" \
        in printed
    assert "random order, each batch padded to its longest sample (200 of the data's lengths); " in printed
    assert "fastest per lora_r" in printed
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
    assert best["spread_rel"] >= 0  # the probe's 95% interval of its step time
    if best["spread_rel"] >= 0.005:  # the box says how far the probe's own noise may put its speed
        assert f"{best['spread_rel']:.0%} (the probe's 95% interval)" in printed
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


@pytest.mark.slow
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
    # A damaged summary.json: the resume that reading it advises rebuilds it from the stored trials.
    summary = runs[0] / "summary.json"
    kept = json.loads(summary.read_text())
    summary.write_text("[]")
    assert main(["plan", str(runs[0]), "--max-hours", "1"]) == 2
    assert "probing nothing again" in capsys.readouterr().err
    assert main(["tune", str(path), "--output", str(runs[0]), "--resume", "--quiet"]) == 0
    rebuilt = json.loads(summary.read_text())
    assert rebuilt["total_tested"] == 1 and rebuilt["best_config"]["trial"] == kept["best_config"]["trial"]
    assert rebuilt["best_config"]["samples_per_second"] == kept["best_config"]["samples_per_second"]  # not probed again


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


@pytest.mark.slow
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


def test_where_padding_outweighs_a_larger_batch_the_smaller_batch_ranks_first(tmp_path: Path) -> None:
    """19 in 20 samples are 16 positions long, the rest 2,048: a batch of 8 holds a long sample
    more often than not and pads every row to it, so per sample it does ~6x the work of a batch of
    1. The speed a probe reports is the epoch's, over batches as the trainer makes them: the tune
    prices each config's own epoch mix, and grouping by length takes most of the padding away again
    (a megabatch of 400 samples still mixes lengths at its long batches' edge). What the tune
    measured decides nothing here (timing never does in a test): the mixes are the data's, and
    the ranking is checked against a step cost given in numbers."""
    data = tmp_path / "lengths.jsonl"
    rng = __import__("random").Random(0)
    lengths = [2048 if rng.random() < 0.05 else 16 for _ in range(800)]
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in lengths))
    path = make_spec_file(tmp_path, model={"factory": f"{Path(__file__).parent / 'factories.py'}:scaled"},
                          data={"path": str(data), "length_field": "n"}, params={"width_mul": 128})
    # Your own trainer groups (trainfit's loop, which reads rows in a shuffled stream, would not).
    path.write_text(path.read_text() + "search:\n  batch_size: [1, 8]\n  group_by_length: [false, true]\n"
                    "tune:\n  strategy: grid\n  command_template: python train.py --bs {batch_size} "
                    "--group {group_by_length}\n")
    out = tmp_path / "out"
    assert main(["tune", str(path), "--output", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    entries = [summary["best_config"], *summary["runners_up"]]
    by_padding = {(e["config"]["batch_size"], e["config"]["group_by_length"]): e["padding_share"] for e in entries}
    assert by_padding[(1, False)] == 0.0 and by_padding[(8, False)] > 0.5 > 0.25 > by_padding[(8, True)]
    # The tune's own ranking (summary.json, best first) follows the speeds it measured over those mixes.
    speeds = [e["samples_per_second"] for e in entries]
    assert len(entries) == 4 and speeds == sorted(speeds, reverse=True), speeds
    # Over the same epochs, a step costing 1 us a position (rows x padded length) and a fixed part
    # of 50 positions' worth: batch 1 is over twice batch 8's speed in random order, and grouping
    # gives batch 8 that back.
    def speed(batch_size: int, grouped: bool) -> float:
        params = Params(batch_size=batch_size, group_by_length=grouped)
        cost = StepCost(a=50e-6, b=batch_size * 1e-6, c=0.0)  # a micro-batch's seconds at its padded length
        return epoch_speed(cost, typical_mix(lengths, params, 2048, seed=0), 1).samples_per_second

    assert speed(1, False) > 2 * speed(8, False) and speed(8, True) > 2 * speed(8, False)
