"""Each kind of run summarised as itself on its run page (issue 50 item 5): not its record's raw
fields (``started_at 1.797e+09``, ``peak_memory_bytes 991162368``), and no "Pages: none yet" for a
kind that writes none."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("flask")

from conftest import EXAMPLES  # noqa: E402

from trainfit.ablate import Ablation, Row  # noqa: E402
from trainfit.cli import main  # noqa: E402
from trainfit.compare import Comparison  # noqa: E402
from trainfit.compare.runs import ConfigRun  # noqa: E402
from trainfit.probe.measurement import Measurement  # noqa: E402
from trainfit.train.records import TrainResult  # noqa: E402
from trainfit.ui.app import create_app  # noqa: E402


def figures(page: str) -> dict[str, str]:
    return dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", page))


def write_runs(tmp_path: Path) -> None:
    """A root holding the examples and a run of each kind besides a tune, under ``runs/``: a plan from
    a figure and an analysis (written by the CLI), a training's result and log, a probe's measurement,
    an ablation, a comparison (their records, written here)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    runs = tmp_path / "runs"
    # a plan from a figure (a real one, written by the CLI)
    assert main(["plan", "--spec", str(tmp_path / "examples" / "tiny-llama.yaml"), "--throughput", "800",
                 "--max-hours", "1", "--output", str(runs / "plan")]) in (0, 1)
    # a training's result and its log, as train writes them
    (runs / "train").mkdir(parents=True)
    (runs / "train" / "train.json").write_text("{}")
    result = TrainResult(status="finished", stopped_by=None, step=40, max_steps=40, resumed_from=None, process_s=70.0,
                         elapsed_s=75.0, planned_s=60.0, output=str(runs / "train"), peak_memory_bytes=3 * 2**29,
                         probe_peak_memory_bytes=2**31)
    (runs / "train" / "train_result.json").write_text(json.dumps(result.to_json()))
    (runs / "train" / "train_log.jsonl").write_text("".join(
        json.dumps({"event": "log", "step": s, "loss": 3.0 - s / 20}) + "\n" for s in (10, 20, 30, 40)) + '{"event": "lo')
    # a probe's measurement
    (runs / "probe").mkdir()
    probe = Measurement(status="ok", config={"batch_size": 4, "max_length": 1024}, samples_per_second=23.45,
                        tokens_per_second=4000.0, peak_memory_bytes=2**30, step_time_ci95_rel=0.187,
                        memory_parts_bytes={"model": 2**28, "optimizer": 2**29, "step": 2**28})
    (runs / "probe" / "measurement.json").write_text(json.dumps(probe.to_dict()))
    # an ablation's table
    (runs / "ablate").mkdir()
    ablation = Ablation(created_at="2026-12-08", device="cpu", baseline={"batch_size": 4}, rows=[
        Row(name="baseline", knobs={}, status="ok", speedup=1.0),
        Row(name="checkpointing", knobs={"gradient_checkpointing": True}, status="ok", speedup=0.8,
            speedup_low=0.75, speedup_high=0.85, memory_change=-0.3),
        Row(name="flash attention", knobs={"attention": "flash_attention_2"}, status="unavailable",
            reason="needs CUDA")])
    (runs / "ablate" / "ablation.json").write_text(json.dumps(ablation.to_json()))
    # an analysis of the bundled data (a real one, written by the CLI)
    assert main(["analyze", "--spec", str(tmp_path / "examples" / "tiny-llama.yaml"), "--json",
                 str(runs / "analyze" / "lengths.json")]) == 0
    # a comparison's record
    (runs / "compare").mkdir()
    curve = [[s, s * 0.1, 3.0 - s / 40] for s in range(1, 21)]
    done = {name: ConfigRun(name=name, status="finished", steps=20, max_steps=20, samples_per_step=4, train_s=2.0,
                            eval_s=0.0, samples_per_second=sps, peak_memory_gb=1.0, losses=curve)
            for name, sps in (("low_lr", 40.0), ("high_lr", 38.0))}
    comparison = Comparison(created_at="2026-12-08", spec="s.yaml", spec_sha256="0", overrides=[], steps=20,
                            minutes=None, seed=0, evaluation=None, target_loss=None, device="cpu",
                            configs={"low_lr": {}, "high_lr": {}, "wide": {}}, runs=done, ranking=["high_lr", "low_lr"])
    (runs / "compare" / "compare.json").write_text(json.dumps(comparison.to_json()))


def test_each_kind_of_run_is_summarised_as_itself(tmp_path: Path, capsys) -> None:
    write_runs(tmp_path)
    client = create_app(tmp_path).test_client()

    def page(name: str) -> str:
        return client.get(f"/run?path=runs/{name}").get_data(as_text=True)

    train = page("train")
    rows = figures(train)
    assert rows["status"] == "finished" and rows["steps"] == "40 of 40"
    assert rows["elapsed"] == "1m15s against the plan&#39;s ~1m00s (125% of it)"
    assert rows["peak memory"] == "1.50 GiB against the probe&#39;s 2.00 GiB"
    assert rows["loss"] == "2.5 at step 10 to 1 at step 40"  # the log's cut last line left out
    assert "<polyline" in train and "none yet" not in train and "<h2>Pages</h2>" not in train

    probe_page = page("probe")
    rows = figures(probe_page)
    assert rows["samples/s"] == "23.45 ±19% (its step time&#39;s 95% interval)" and rows["peak memory"] == "1.00 GiB"
    assert probe_page.count("<rect") == 3 and ">optimizer</text>" in probe_page  # the memory parts as bars

    rows = figures(page("ablate"))
    assert rows["checkpointing"] == "0.80x (0.75x-0.85x), memory -30%"
    assert rows["flash attention"] == "unavailable: needs CUDA"

    rows = figures(page("plan"))
    assert rows["ETA"].startswith("~") and rows["window"].startswith("1 h less 30 min: ")
    assert rows["chosen"] == "the spec&#39;s config" and rows["priority"].startswith("balanced: ")
    assert "started_at" not in rows and "created_at" not in rows

    rows = figures(page("compare"))
    assert rows["best"] == "high_lr" and rows["wide"] == "not run"
    assert rows["low_lr"] == "finished, final loss 2.513, 40 samples/s"  # its last tenth's mean

    rows = figures(page("analyze"))
    assert rows["samples"] == "1,500" and rows["lengths"].startswith("min 22, p50 99, ")
    assert rows["max_length"].startswith("1024 (p99.5 rounded up") and rows["padding (packing)"] == "0% of positions"


def test_a_damaged_record_is_said_on_its_page(tmp_path: Path) -> None:
    (tmp_path / "runs" / "probe").mkdir(parents=True)
    (tmp_path / "runs" / "probe" / "measurement.json").write_text('{"status": 12}')
    page = create_app(tmp_path).test_client().get("/run?path=runs/probe")
    assert page.status_code == 200 and "cannot read measurement.json" in page.get_data(as_text=True)


def test_a_training_and_a_comparison_show_their_progress_live(tmp_path: Path) -> None:
    """Issue 50 item 4: a training's job page shows its steps as a bar, its last loss, its time and
    what the monitor projects is left, read from the log trainfit train writes (RunLog, the writer
    itself); a comparison's shows its configs trained."""
    from trainfit.train.callbacks import RunLog
    from trainfit.train.monitor import Status
    from trainfit.ui.jobs import Job
    from trainfit.ui.live import live_view

    out = tmp_path / "runs" / "train"
    out.mkdir(parents=True)
    log = RunLog(out / "train_log.jsonl")
    log.write("start", resumed_from=None, source="plan.json")
    log.write("log", step=10, max_steps=40, elapsed_s=30.0, loss=2.5)
    log.write("on_track", **Status(step=10, max_steps=40, elapsed_s=30.0, projected_s=120.0, planned_s=110.0,
                                   window_s=3600.0, state="on track").to_json())
    log.write("log", step=20, max_steps=40, elapsed_s=61.0, loss=2.0)
    with (out / "train_log.jsonl").open("a") as f:
        f.write('{"event": "log", "st')  # a line being written

    def job(command: str, output: str) -> Job:
        return Job(id="j", command=command, argv=[], cwd=str(tmp_path), started_at=0.0, output=output)

    live = live_view(tmp_path, job("train", "runs/train"), lambda *a, **k: "")
    assert live == {"progress": [20, 40], "line": "step 20 of 40 (50%); loss 2; 1m01s so far; ~1m30s left (on track)"}
    (tmp_path / "runs" / "cmp").mkdir()
    (tmp_path / "runs" / "cmp" / "compare.json").write_text(json.dumps(
        {"configs": {"a": {}, "b": {}, "c": {}}, "steps": 20, "runs": {"a": {"status": "finished"}}}))
    assert live_view(tmp_path, job("compare", "runs/cmp"), lambda *a, **k: "") == {
        "progress": [1, 3], "line": "1 of 3 configs trained, 20 steps each (a: finished)"}
    assert live_view(tmp_path, job("probe", "runs/train"), lambda *a, **k: "") is None
