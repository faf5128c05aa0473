"""The pages a user opens, in a real headless browser (Chromium, skipped where it is absent):
report.html, compare.html and ablation.html render their plots (a screenshot, its pixels read), and
``trainfit dashboard`` serves the study, which optuna-dashboard's page lists, beside the run's own
pages (integration)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, make_spec_file, write_texts

from trainfit.cli import main

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no Chromium here (.ci/run installs it: apt-get install chromium)")


def browser(*args: str, timeout: float = 60) -> str:
    assert BROWSER is not None
    done = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=timeout)
    return done.stdout


def screenshot(page: Path, out: Path, height: int = 2400) -> object:
    from PIL import Image

    browser(f"--screenshot={out}", f"--window-size=1200,{height}", page.resolve().as_uri())
    assert out.is_file(), f"no screenshot of {page}"
    return Image.open(out).convert("RGB")


def pixels_near(image: object, color: str, tolerance: int = 40) -> int:
    """How many pixels are within ``tolerance`` of ``color`` (#rrggbb) on each channel."""
    target = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
    return sum(1 for px in image.getdata()  # type: ignore[attr-defined]
               if all(abs(a - b) <= tolerance for a, b in zip(px, target, strict=True)))


def first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The process's first line of stderr, or "" when none comes within ``timeout`` s (no hang)."""
    import threading

    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stderr.readline() if proc.stderr else ""), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pages")
    data = root / "train.jsonl"
    write_texts(data, n=60)
    spec = make_spec_file(root, model={"config": {**TINY_LLAMA, "vocab_size": 256}},
                          data={"path": str(data), "text_field": "text"}, params={"max_length": 64})
    spec.write_text(spec.read_text() + "search:\n  batch_size: [1, 2, 4]\n")
    out = root / "tune"
    assert main(["tune", str(spec), "--output", str(out), "--strategy", "grid"]) == 0
    return out


@needs_browser
@pytest.mark.integration
@pytest.mark.slow
def test_the_tune_report_a_comparison_and_an_ablation_draw_their_plots(tune_dir: Path, tmp_path: Path) -> None:
    image = screenshot(tune_dir / "report.html", tmp_path / "report.png")
    assert pixels_near(image, "#1f77b4") > 200  # the charts' first series: its points and lines are drawn
    assert len(set(image.getdata())) > 50  # type: ignore[attr-defined]  (not a blank page)

    from test_compare import a_run, curve

    from trainfit.compare import Comparison
    from trainfit.compare.report import page

    state = Comparison(created_at="", spec="s.yaml", spec_sha256="", overrides=[], steps=40, minutes=None, seed=0,
                       evaluation=None,
                       target_loss=None, device="cpu",
                       configs={"low": {}, "high": {}},
                       runs={"low": a_run("low", curve(3.0, 2.8)), "high": a_run("high", curve(3.0, 2.0), sps=6.0)})
    (tmp_path / "compare.html").write_text(page(state))
    image = screenshot(tmp_path / "compare.html", tmp_path / "compare.png")
    for color in ("#1f77b4", "#d62728"):  # each config's curve and bars, in its own color
        assert pixels_near(image, color) > 300, color

    from trainfit.ablate import Ablation, Row
    from trainfit.ablate.outputs import page as ablation_page

    rows = [Row(name="baseline", knobs={}, status="ok", samples_per_second=10.0, peak_gb=2.0),
            Row(name="bf16", knobs={"precision": "bf16"}, status="ok", samples_per_second=15.0, peak_gb=1.5),
            Row(name="flash", knobs={"attention": "flash_attention_2"}, status="unavailable", reason="needs CUDA")]
    (tmp_path / "ablation.html").write_text(ablation_page(Ablation(created_at="", device="cpu", baseline={}, rows=rows),
                                                          "s.yaml"))
    image = screenshot(tmp_path / "ablation.html", tmp_path / "ablation.png", height=1200)
    assert pixels_near(image, "#1f77b4") > 1000 and pixels_near(image, "#d62728") > 1000  # speed and memory bars


@pytest.mark.integration
def test_the_dashboard_serves_the_study_and_the_runs_pages(tune_dir: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("optuna_dashboard")
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "dashboard", str(tune_dir), "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = first_line(proc, timeout=60)
        found = re.search(r"(http://127\.0\.0\.1:\d+)/dashboard", line)
        assert found, line
        base = found.group(1)
        studies = json.loads(urllib.request.urlopen(f"{base}/api/studies", timeout=30).read())
        names = [s["study_name"] for s in studies["study_summaries"]]
        assert len(names) == 1 and names[0].startswith("trainfit-")
        index = urllib.request.urlopen(f"{base}/trainfit/", timeout=30).read().decode()
        assert 'href="/trainfit/report.html"' in index
        assert b"<svg" in urllib.request.urlopen(f"{base}/trainfit/report.html", timeout=30).read()
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{base}/trainfit/study.journal", timeout=30)  # the folder's pages only
        if BROWSER is not None:  # optuna-dashboard's own page, run in a browser, lists the study and its trials
            assert names[0] in browser("--virtual-time-budget=10000", "--dump-dom", f"{base}/dashboard")
            dom = browser("--virtual-time-budget=10000", "--dump-dom", f"{base}/dashboard/studies/0/trials")
            assert {"Trial 0", "Trial 1", "Trial 2"} <= set(re.findall(r"Trial \d+", dom))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert main(["dashboard", str(tmp_path)]) == 2
    assert "holds neither a study.journal nor a page" in capsys.readouterr().err
    # a comparison's folder (no study): its pages alone, and / leads to them
    (tmp_path / "compare.html").write_text("<!doctype html><title>c</title><p>curves</p>")
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "dashboard", str(tmp_path), "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        found = re.search(r"(http://127\.0\.0\.1:\d+)/trainfit/", first_line(proc, timeout=60))
        assert found
        landing = urllib.request.urlopen(found.group(1) + "/", timeout=30)  # follows the redirect
        assert landing.geturl().endswith("/trainfit/") and b"compare.html" in landing.read()
        assert b"curves" in urllib.request.urlopen(found.group(1) + "/trainfit/compare.html", timeout=30).read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
