"""``trainfit ui``: its routes through Flask's test client over a root made in a temp folder, and real
``trainfit`` jobs started, read, stopped and resumed by it (no part of the UI is mocked)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

pytest.importorskip("flask")

from conftest import EXAMPLES, alive, gone_within  # noqa: E402
from tune_helpers import fixed_speed  # noqa: E402

from trainfit.data.analyze import analyze_spec  # noqa: E402
from trainfit.params import KNOBS  # noqa: E402
from trainfit.tune.options import TuneOptions  # noqa: E402
from trainfit.spec import load_spec  # noqa: E402
from trainfit.tune import tune  # noqa: E402
from trainfit.ui import commands, forms  # noqa: E402
from trainfit.ui.app import create_app, is_loopback, new_token  # noqa: E402
from trainfit.ui.commands import resumed  # noqa: E402
from trainfit.ui.jobs import LOG_CHUNK, Job, Jobs, State, run_module, whole_characters  # noqa: E402
from trainfit.ui.paths import Root  # noqa: E402

SPEC = "examples/tiny-llama.yaml"


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A root holding the bundled examples (specs, data, tokenizer); a job a test left running is
    killed at its end (its whole process group)."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    yield tmp_path
    jobs = Jobs(Root(tmp_path))
    for job in jobs.all():
        if jobs.state(job).status == "running":
            os.killpg(job.pid, signal.SIGKILL)


def spec_form(root: Path, **fields: str) -> dict[str, str]:
    """The spec editor's form as a browser posts it (a textarea's lines end in CRLF)."""
    return {"path": SPEC, "yaml": (root / SPEC).read_text().replace("\n", "\r\n"), **fields}


def wait_for(jobs: Jobs, job_id: str, status: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while (now := jobs.state(jobs.get(job_id)).status) != status:
        assert time.monotonic() < deadline, f"job {job_id} still {now}, not {status}: {jobs.log(jobs.get(job_id))[0]}"
        time.sleep(0.2)


def wait_for_output(jobs: Jobs, job_id: str, text: str, timeout_s: float = 120) -> None:
    """Until the job's log holds ``text`` (its start-up imports torch: long on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while text not in (log := jobs.log(jobs.get(job_id))[0]):
        assert time.monotonic() < deadline and jobs.state(jobs.get(job_id)).status == "running", log
        time.sleep(0.2)


def started_job(reply) -> str:
    assert reply.status_code == 303, reply.get_data(as_text=True)
    match = re.fullmatch(r"/jobs/([\w-]+)", reply.headers["Location"])
    assert match, reply.headers["Location"]
    return match.group(1)


def test_the_index_lists_every_run_folder_under_the_root(root: Path) -> None:
    tune = root / "trainfit-runs" / "tiny" / "20261127-101500"
    (tune / "probes" / "trial-0001").mkdir(parents=True)
    (tune / "summary.json").write_text("{}")
    (tune / "report.html").write_text("<html></html>")
    (tune / "probes" / "trial-0001" / "measurement.json").write_text("{}")  # inside a run: not a run
    (tune / "train").mkdir()
    (tune / "train" / "train.json").write_text("{}")  # a tune folder's training: a run of its own
    ablation = root / "elsewhere" / "abl"
    ablation.mkdir(parents=True)
    (ablation / "ablation.json").write_text(json.dumps({"baseline_samples_per_second": 12.5}))
    (root / "not-a-run").mkdir()

    page = create_app(root).test_client().get("/").get_data(as_text=True)

    listed = re.findall(r'<tr class="run" data-path="([^"]+)"', page)
    assert sorted(listed) == ["elsewhere/abl", "trainfit-runs/tiny/20261127-101500",
                              "trainfit-runs/tiny/20261127-101500/train"]
    assert "/files/trainfit-runs/tiny/20261127-101500/report.html" in page
    assert SPEC in page and "examples/compare-configs.yaml" not in page  # a spec has a model: key


def test_the_runs_below_a_stray_record_are_found(root: Path) -> None:
    """A folder holding a probe's ``measurement.json`` (``trainfit probe --json`` run in a project's own
    folder) was taken for a run with an inside of its own: nothing below it was searched."""
    project = root / "project"
    (project / "runs" / "abl").mkdir(parents=True)
    (project / "measurement.json").write_text("{}")
    (project / "runs" / "abl" / "ablation.json").write_text("{}")
    (project / "runs" / "abl" / "configs").mkdir()
    (project / "runs" / "abl" / "configs" / "lengths.json").write_text("{}")  # an ablation's inside: not a run

    page = create_app(root).test_client().get("/").get_data(as_text=True)

    assert sorted(re.findall(r'<tr class="run" data-path="([^"]+)"', page)) == ["project", "project/runs/abl"]


def test_two_tune_runs_side_by_side_show_their_summaries_figures(root: Path) -> None:
    for name, speed, rel in (("slow", 20.0, 0.12), ("fast", 80.0, None)):  # real tune folders; the figures given
        spec = load_spec(root / SPEC, ["tune.max_trials=1"])
        tune(spec, TuneOptions(output=root / "runs" / name, probe_fn=fixed_speed(speed, ci95_rel=rel),
                               stats=analyze_spec(spec, progress=False)))  # the data's samples: a full run's time
    client = create_app(root).test_client()

    page = client.get("/compare?a=runs/slow&b=runs/fast").get_data(as_text=True)
    run = client.get("/run?path=runs/fast").get_data(as_text=True)
    listed = client.get("/").get_data(as_text=True)

    # issue 50 item 6: the noise beside the figure, wherever it is (the CLI's ±)
    speeds = re.search(r"<th>samples/s</th><td>([^<]*)</td><td>([^<]*)</td>", page)
    assert speeds and speeds.groups() == ("20 ±12% (the probe&#39;s 95% interval)", "80"), page
    assert re.findall(r'data-path="runs/(\w+)">.*?<td class="speed">([^<]*)</td>', listed, re.S) == [
        ("fast", "80"), ("slow", "20 ±12%")]
    report = (root / "runs" / "slow" / "report.html").read_text()
    assert report.count('class="interval"') == 1 and "<td>20 ±12%</td>" in report  # the plot's bar, the table's ±
    assert "<th>best config</th>" in page and "<th>peak memory (GiB)</th>" in page
    # issue 50: a duration as the CLI says it, not "full run (hours) 0.01777"
    assert re.search(r"<th>full run</th><td>~\d+(m\d+)?s for 1 epoch\(s\)</td>", page), page
    assert 'id="run-plan"' in run and 'id="run-train"' in run and "report.html" in run
    assert "trainfit dashboard runs/fast" in run


def test_every_knob_has_a_control_of_its_kind(root: Path) -> None:
    page = create_app(root).test_client().get(f"/spec?path={SPEC}").get_data(as_text=True)

    controls = {name: kind for kind, name in re.findall(r'<(?:input|select) (?:type="(\w+)" )?id="knob-(\w+)"', page)}
    assert set(controls) == set(KNOBS)
    for name, knob in KNOBS.items():
        expected = {"bool": "checkbox", "int": "number", "float": "number", "choice": "", "modules": "text"}[knob.kind]
        assert controls[name] == expected, name
        if knob.kind == "choice":
            select = page[page.index(f'id="knob-{name}"'):].split("</select>")[0]
            assert re.findall(r'<option value="([^"]+)"', select) == [forms.word(c) for c in knob.choices]
    assert re.search(r'id="knob-batch_size"[^>]*value="4"', page)  # the spec's own value, not the default


def test_a_changed_control_is_an_override_and_the_rest_are_not(root: Path) -> None:
    params = {"batch_size": 4, "precision": "fp32"}
    form = {"knob.batch_size": "8", "knob.precision": "fp32", "knob.gradient_checkpointing.present": "1",
            "knob.gradient_checkpointing": "on", "knob.tf32.present": "1", "knob.lora_r": ""}
    assert forms.overrides(form, params) == ["batch_size=8", "gradient_checkpointing=true"]

    reply = create_app(root).test_client().post("/api/validate", data=spec_form(root, **form)).get_json()
    assert reply == {"ok": True, "problems": [], "overrides": ["batch_size=8", "gradient_checkpointing=true"]}


def test_each_knob_is_fixed_or_searched_and_a_changed_search_is_one_override(root: Path) -> None:
    """Issue 50 item 1: the example searches batch_size, gradient_checkpointing and lora_r. The form
    shows them as searched, with their choices; editing the choices, searching another knob or fixing one
    is one ``search={...}`` override, which a tune runs (its space says so), and a searched knob's
    value field says nothing (the CLI would refuse its --set)."""
    client = create_app(root).test_client()
    page = client.get(f"/spec?path={SPEC}").get_data(as_text=True)
    assert re.search(r'id="search-on-batch_size"[^>]*checked', page)
    assert 'id="search-batch_size" name="search.batch_size" value="[1, 2, 4, 8, 16, 32]"' in page
    assert not re.search(r'id="search-on-precision"[^>]*checked', page)
    assert 'data-suggested="[eager, sdpa, flash_attention_2]"' in page  # a choice knob's every choice to start from
    assert 'data-suggested="[false, true]"' in page  # a bool's both

    same = {"search.present": "1", "search.batch_size.on": "on", "search.batch_size": "[1, 2, 4, 8, 16, 32]",
            "search.gradient_checkpointing.on": "on", "search.gradient_checkpointing": "[false, true]",
            "search.lora_r.on": "on", "search.lora_r": "[null, 8]"}
    assert client.post("/api/validate", data=spec_form(root, **same)).get_json()["overrides"] == []
    edited = {**same, "search.batch_size": "1, 2", "knob.batch_size": "8",  # its value field: disabled, not sent
              "search.gradient_checkpointing.on": "", "knob.gradient_checkpointing.present": "1",
              "knob.gradient_checkpointing": "on",  # fixed at true: no longer searched, so honoured
              "search.precision.on": "on", "search.precision": "[fp32, bf16]"}
    reply = client.post("/api/validate", data=spec_form(root, **edited)).get_json()
    assert reply == {"ok": True, "problems": [], "overrides": ["gradient_checkpointing=true",
                                                               "search={batch_size: [1, 2], lora_r: [null, 8], precision: [fp32, bf16]}"]}
    bad = client.post("/api/validate", data=spec_form(root, **{**same, "search.batch_size": "[1, two]"})).get_json()
    assert not bad["ok"] and bad["problems"][0]["key"] == "search.batch_size"

    started = client.post("/spec/run", data=spec_form(root, command="tune", quick="on", max_trials="1",
                                                      **{**same, "search.batch_size": "[1]"}))
    assert started.status_code == 303
    jobs = Jobs(Root(root))
    [job] = jobs.all()
    assert "search={batch_size: [1], gradient_checkpointing: [false, true], lora_r: [null, 8]}" in job.argv
    wait_for_output(jobs, job.id, "space: batch_size [1], gradient_checkpointing [False, True]")
    wait_for(jobs, job.id, "finished")
    live = client.get(f"/api/jobs/{job.id}").get_json()["live"]  # issue 50 item 4: the report, live on the job page
    assert live["href"] == f"/files/{job.output}/report.html" and live["version"].isdigit()
    assert live["line"].startswith("1 probed (1 fit, 0 OOM) in ") and "best so far: batch_size=1 " in live["line"]
    job_page = client.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert f'src="/files/{job.output}/report.html?v={live["version"]}"' in job_page
    # issue 50 item 8: the command line as run in the root, its paths from there
    assert '<code id="command">trainfit tune examples/tiny-llama.yaml --set &#39;search={batch_size: [1],' in job_page
    assert f"--output {job.output} --quick --max-trials 1</code>" in job_page


def test_a_bad_spec_returns_its_problems_and_starts_nothing(root: Path) -> None:
    client = create_app(root).test_client()
    bad = spec_form(root, **{"knob.batch_size": "0", "knob.precision": "fp17", "command": "tune"})

    checked = client.post("/api/validate", data=bad).get_json()
    reply = client.post("/spec/run", data=bad)

    assert not checked["ok"]
    assert [p["key"] for p in checked["problems"]] == ["params.batch_size", "params.precision"]
    assert reply.status_code == 400
    text = reply.get_data(as_text=True)
    assert "must be &gt;= 1, got 0" in text and "is not one of fp32, bf16, fp16" in text
    broken = client.post("/spec/run", data={**spec_form(root, command="tune"), "yaml": "model: [unclosed"})
    assert broken.status_code == 400 and "unsaved edits" in broken.get_data(as_text=True)
    assert not (root / ".trainfit-ui").exists() and not (root / "trainfit-runs").exists()


def test_saving_writes_a_new_spec_beside_the_old_and_never_over_a_file(root: Path) -> None:
    client = create_app(root).test_client()

    reply = client.post("/spec/save", data=spec_form(root, name="bigger", **{"knob.batch_size": "8"}))
    again = client.post("/spec/save", data=spec_form(root, name="bigger"))

    assert reply.status_code == 303 and reply.headers["Location"].endswith("path=examples/bigger.yaml")
    saved = (root / "examples" / "bigger.yaml").read_text()
    assert "\r" not in saved and "batch_size: 8" in saved and "tokenizer: data/tokenizer.json" in saved
    assert again.status_code == 409 and "exists already" in again.get_data(as_text=True)
    assert client.post("/api/validate", data={**spec_form(root), "path": "examples/bigger.yaml",
                                              "yaml": saved}).get_json()["ok"]


def test_a_yaml_date_is_checked_and_saved_as_the_loader_reads_it(root: Path) -> None:
    """A date (``2024-01-01``, a ``datetime.date`` to PyYAML) made the check and the save a 500: a
    TypeError from the overrides' JSON copy."""
    client = create_app(root).test_client()
    dated = (root / SPEC).read_text().replace("text_field: text", "text_field: 2024-01-01")  # a string is fine
    wrong = dated.replace("memory_gb: 4", "memory_gb: 2024-01-01")  # a number expected

    bad = client.post("/api/validate", data={**spec_form(root), "yaml": wrong})
    reply = client.post("/spec/save", data={**spec_form(root, name="dated", **{"knob.batch_size": "8"}), "yaml": dated})

    assert bad.get_json()["problems"] == [{"key": "budget.memory_gb", "hint": None,
                                           "message": "expected a number (or null), got '2024-01-01'"}]
    assert reply.status_code == 303, reply.get_data(as_text=True)
    saved = load_spec(root / "examples" / "dated.yaml").data
    assert saved is not None and saved.text_field == "2024-01-01"


def test_a_path_outside_the_root_is_refused(root: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.yaml").write_text("model: {}\n")
    (root / "link").symlink_to(outside)
    client = create_app(root).test_client()

    for url in ("/spec?path=../outside/secret.yaml", f"/spec?path={outside}/secret.yaml", "/spec?path=link/secret.yaml",
                "/run?path=..", "/files/link/secret.yaml", "/compare?a=examples&b=/etc"):
        reply = client.get(url)
        assert reply.status_code == 403, url
        assert "outside the UI's root" in reply.get_data(as_text=True).replace("&#39;", "'"), url
    assert client.get("/spec?path=examples/missing.yaml").status_code == 404
    (root / ".env").write_text("SECRET=1\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    assert client.get("/files/.env").status_code == 403 and client.get("/files/.git/config").status_code == 403
    (root / "notes.txt").symlink_to(root / ".env")  # a link leads where it points
    assert client.get("/files/notes.txt").status_code == 403 and client.get("/spec?path=.env").status_code == 403
    assert client.post("/run/action", data={"path": "/etc", "command": "plan"}).status_code == 403


def test_every_request_needs_the_token_and_names_this_machine(root: Path) -> None:
    """`trainfit ui` always sets a token (another user of a shared machine reaches 127.0.0.1 too); served on
    127.0.0.1, a request naming another host (a site whose name was pointed here: DNS rebinding) is refused;
    no other site may frame a page, and a file served from the root runs no script."""
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert len(new_token()) >= 24 and new_token() != new_token()
    rebound = create_app(root).test_client()
    assert rebound.get("/", headers={"Host": "evil.example:8765"}).status_code == 403
    assert rebound.post("/api/validate", headers={"Host": "evil.example:8765", "Origin": "http://evil.example:8765"},
                        data={"path": SPEC}).status_code == 403
    assert rebound.get("/", headers={"Host": "localhost:8765"}).status_code == 200
    page = rebound.get("/")
    assert page.headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    (root / "page.html").write_text("<script>fetch('/spec/save', {method: 'POST'})</script>")
    served = rebound.get("/files/page.html")  # framed by the UI's own job page alone (a tune's live report)
    assert served.headers["Content-Security-Policy"] == "frame-ancestors 'self'; sandbox"
    assert served.headers["X-Frame-Options"] == "SAMEORIGIN"
    client = create_app(root, token="s3cret-token").test_client()

    refused = client.get("/")
    wrong = client.get("/?token=guess")
    given = client.get("/?token=s3cret-token")
    later = client.get(f"/spec?path={SPEC}")  # the cookie carries it now

    assert refused.status_code == 403 and "needs its token" in refused.get_data(as_text=True)
    assert wrong.status_code == 403
    assert given.status_code == 200 and later.status_code == 200
    assert create_app(root).test_client().get("/").status_code == 200  # an app made without one (these tests)


def test_a_post_from_another_site_is_refused(root: Path) -> None:
    reply = create_app(root).test_client().post("/spec/run", data=spec_form(root, command="analyze"),
                                                headers={"Origin": "http://evil.example"})
    assert reply.status_code == 403 and not (root / ".trainfit-ui").exists()


def test_two_starts_within_one_second_get_two_run_folders(root: Path) -> None:
    """A new run folder was found free but not made (a tune makes it once its process is up): two starts
    within one second (two tabs, a double click) were given the same folder and wrote into it."""
    (root / "run").mkdir()
    tunes = [commands.spec_command("tune", root / SPEC, [], {}, Root(root)) for _ in range(2)]
    trains = [commands.run_command("train", root / "run", {}) for _ in range(2)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        raced = list(pool.map(lambda _: commands.new_folder(root / "race", "probe"), range(8)))

    folders = [p.output for p in tunes + trains]
    assert len(set(folders)) == 4 and all(f is not None and f.is_dir() for f in folders)
    assert folders[2] == root / "run" / "train" and folders[3] is not None and folders[3].name.startswith("train-")
    assert len(set(raced)) == 8 and all(f.is_dir() for f in raced)


def test_a_log_is_read_in_whole_characters_across_its_chunks(root: Path) -> None:
    """The log is read in chunks of ``LOG_CHUNK`` bytes: a character split at a chunk's end was decoded as
    U+FFFD at the end of one chunk and again at the start of the next."""
    job = Job(id="20260101-000000-tune-abc123", command="tune", argv=[], cwd=str(root), started_at=0.0, output=None)
    text = "a" + "é" * (LOG_CHUNK // 2) + "€🙂 — done\n"  # byte LOG_CHUNK is the second of an é
    (root / ".trainfit-ui" / "jobs" / job.id).mkdir(parents=True)
    (root / ".trainfit-ui" / "jobs" / job.id / "output.log").write_bytes(text.encode())
    jobs = Jobs(Root(root))

    chunks, offset = [], 0
    while (read := jobs.log(job, offset))[0]:
        chunks.append(read[0])
        offset = read[1]

    assert len(chunks) == 2 and "".join(chunks) == text and offset == len(text.encode())
    inside, after = jobs.log(job, 2)  # from inside the first é: on from the next character
    assert inside == text[2:2 + len(inside)] and after == len(text[:2 + len(inside)].encode())
    for cut in range(1, 4):  # a writer part-way through the 🙂 (4 bytes): nothing of it yet
        assert whole_characters("🙂".encode()[:cut], at_start=False) == (0, 0)


def test_resume_adds_the_flag_once_and_only_where_the_command_has_it() -> None:
    assert resumed("tune", ["s.yaml", "--output", "o"]) == ["s.yaml", "--output", "o", "--resume"]
    assert resumed("train", ["r", "--resume"]) == ["r", "--resume"]
    with pytest.raises(Exception, match="cannot resume"):
        resumed("plan", ["r"])


@pytest.mark.integration
def test_a_real_job_records_its_log_and_exit_and_a_new_ui_lists_it(root: Path) -> None:
    client = create_app(root).test_client()
    (root / "json.py").write_text("raise SystemExit(99)\n")  # a project's own module in the root shadows nothing

    job_id = started_job(client.post("/spec/run", data=spec_form(root, command="analyze")))
    jobs = Jobs(Root(root))
    wait_for(jobs, job_id, "finished", timeout_s=120)

    job = jobs.get(job_id)
    assert job.argv[:5] == [*run_module("trainfit"), "analyze"] and job.args[0] != "analyze"
    assert json.loads((root / ".trainfit-ui" / "jobs" / job_id / "exit.json").read_text())["returncode"] == 0
    reply = create_app(root).test_client().get(f"/api/jobs/{job_id}").get_json()  # a new UI over the same root
    assert reply["status"] == "finished" and reply["returncode"] == 0
    assert "samples              1,500" in reply["log"]
    assert any(link["name"] == "lengths.html" for link in reply["links"])
    index = create_app(root).test_client().get("/").get_data(as_text=True)
    assert f'data-id="{job_id}"' in index and f'data-path="{job.output}"' in index


@pytest.mark.integration
@pytest.mark.slow  # an ablate stopped and resumed: the slow tier's kind of run (pyproject's markers)
def test_a_running_job_outlives_its_ui_and_stops_on_request(root: Path) -> None:
    # An ablation: its Ctrl-C keeps the rows measured and exits 130 wherever it lands. (A tune's may land
    # in the study journal's file lock and exit 2: seen once in ~15 runs on a loaded machine.)
    first = create_app(root).test_client()
    job_id = started_job(first.post("/spec/run", data=spec_form(root, command="ablate", only="checkpointing")))
    second = create_app(root).test_client()  # the UI restarted: the job goes on, this one sees and stops it
    jobs = Jobs(Root(root))
    assert jobs.state(jobs.get(job_id)).status == "running"
    wait_for_output(jobs, job_id, "trainfit ablate: ")  # it has begun

    assert second.post(f"/jobs/{job_id}/stop").status_code == 303
    wait_for(jobs, job_id, "interrupted", timeout_s=60)

    state = jobs.state(jobs.get(job_id))
    assert state.returncode in (130, 143)  # Ctrl-C; SIGTERM where it took over 10 s to stop (a loaded machine)
    assert "interrupted" in jobs.log(jobs.get(job_id))[0]
    again = started_job(second.post(f"/jobs/{job_id}/resume"))
    assert jobs.get(again).argv[-1] == "--resume" and jobs.get(again).output == jobs.get(job_id).output
    assert second.post(f"/jobs/{again}/resume").status_code == 409  # still running
    second.post(f"/jobs/{again}/stop")  # (where no row was measured yet, the resume ends at once: nothing to resume)
    deadline = time.monotonic() + 60
    while (ended := jobs.state(jobs.get(again))).status == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert ended.returncode is not None  # whichever way it ended, its supervisor recorded it


@pytest.mark.integration
def test_a_command_outliving_its_killed_supervisor_runs_on_and_is_not_resumed(root: Path) -> None:
    """A supervisor killed outright (SIGKILL) records no exit: its job read as interrupted while its command
    ran on, and Resume would start a second run over the same folder. The command here is a `trainfit ui`
    (it runs until stopped, and starts in a second: no torch)."""
    jobs = Jobs(Root(root))
    job = jobs.start("ui", ["--root", str(root / "examples"), "--port", "0", "--no-browser"], output=None)
    wait_for_output(jobs, job.id, "trainfit ui: serving")
    (command,) = psutil.Process(job.pid).children()
    command_pid = command.pid
    os.kill(job.pid, signal.SIGKILL)
    assert gone_within(job.pid, 10)
    client = create_app(root).test_client()
    try:
        state = jobs.state(job)
        refused = client.post(f"/jobs/{job.id}/resume")
        page = client.get(f"/jobs/{job.id}").get_data(as_text=True)

        assert (state.status, state.command_pid) == ("running", command_pid)
        said = refused.get_data(as_text=True)
        assert refused.status_code == 409 and f"command still runs (pid {command_pid}) though its supervisor" in said
        assert f"its supervisor was killed: pid {command_pid} runs on" in page
        assert client.post(f"/jobs/{job.id}/stop").status_code == 303  # Ctrl-C to its process group reaches it
        assert gone_within(command_pid, 30)
        assert jobs.state(job) == State(status="interrupted", returncode=None, finished_at=None)
    finally:
        if alive(command_pid):  # read as ended before the fix: the root's clean-up would leave it
            command.kill()


def test_the_command_prints_an_install_hint_without_flask(tmp_path: Path) -> None:
    blocker = tmp_path / "block" / "flask"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named flask (blocked by the test)')\n")
    env_path = f"{tmp_path / 'block'}:{Path(__file__).resolve().parent.parent / 'src'}"
    done = subprocess.run([sys.executable, "-m", "trainfit", "ui", "--no-browser", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "pip install 'trainfit[ui]'" in done.stderr and "Traceback" not in done.stderr


def test_served_beyond_this_machine_the_printed_url_carries_the_token(root: Path) -> None:
    server = subprocess.Popen([sys.executable, "-m", "trainfit", "ui", "--root", str(root), "--host", "0.0.0.0",
                               "--port", "0", "--no-browser"], stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        url = re.search(r"at (http://\S+)", server.stderr.readline())
        assert url and "?token=" in url.group(1), url
        port = re.search(r":(\d+)/", url.group(1)).group(1)  # type: ignore[union-attr]
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30)
        with urllib.request.urlopen(url.group(1).replace("0.0.0.0", "127.0.0.1"), timeout=30) as reply:
            assert reply.status == 200 and "Runs under" in reply.read().decode()
        taken = subprocess.run([sys.executable, "-m", "trainfit", "ui", "--root", str(root), "--port", port,
                                "--host", "0.0.0.0", "--no-browser"], capture_output=True, text=True, timeout=60)
        assert taken.returncode == 2 and "cannot serve on 0.0.0.0:" in taken.stderr and "--port" in taken.stderr
        assert "Traceback" not in taken.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)


def started_url(root: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """`trainfit ui` on a free port: the process and the URL it printed."""
    server = subprocess.Popen([sys.executable, "-m", "trainfit", "ui", "--root", str(root), "--port", "0",
                               "--no-browser", *extra], stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    url = re.search(r"at (http://\S+)", server.stderr.readline())
    assert url, "no URL printed"
    return server, url.group(1)


def test_a_restart_keeps_the_token_so_open_pages_work_on(root: Path) -> None:
    """Issue 50: each start made a new token, so a job page left open got 403 after a restart. The
    token is kept under the root (owner-only), and the page's token works on the next server."""
    first, url = started_url(root)
    first.terminate()
    first.wait(timeout=30)
    token = url.split("?token=")[1]
    kept = root / ".trainfit-ui" / "token"
    assert kept.read_text().strip() == token and stat.S_IMODE(kept.stat().st_mode) == 0o600
    second, again = started_url(root)
    try:
        assert again.split("?token=")[1] == token
        port = re.search(r":(\d+)/", again).group(1)  # type: ignore[union-attr]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/jobs/none?token={token}", timeout=30) as reply:
            raise AssertionError(f"no such job, yet {reply.status}")
    except urllib.error.HTTPError as err:
        assert err.code == 404  # past the token check: the job is what is missing
    finally:
        second.terminate()
        second.wait(timeout=30)


def test_a_token_given_is_used_and_kept_and_a_bad_one_is_refused(root: Path, tmp_path: Path) -> None:
    from trainfit.ui.server import kept_token

    assert kept_token(root, "given-token-0123456789") == "given-token-0123456789"
    assert kept_token(root) == "given-token-0123456789"  # the next start without --token keeps it
    kept = root / ".trainfit-ui" / "token"
    kept.write_text("not a token!\n")
    fresh = kept_token(root)  # a damaged one is replaced by a new one
    assert fresh != "not a token!" and kept.read_text() == fresh + "\n"
    kept.chmod(0o644)  # widened since (or planted readable): not trusted, replaced
    assert kept_token(root) != fresh and stat.S_IMODE(kept.stat().st_mode) == 0o600
    planted = tmp_path / "planted"
    planted.write_text("planted-token-0123456789\n")
    planted.chmod(0o600)
    kept.unlink()
    kept.symlink_to(planted)  # a link where the token belongs is not followed, and is replaced
    assert kept_token(root) != "planted-token-0123456789" and not kept.is_symlink()
    assert planted.read_text() == "planted-token-0123456789\n"
    done = subprocess.run([sys.executable, "-m", "trainfit", "ui", "--root", str(root), "--token", "short",
                           "--no-browser"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "a token is 16 to 128 of the characters" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_side_by_side_picks_two_runs_of_one_kind_at_first() -> None:
    """Issue 50 item 8: the a/b picks were the two newest runs, whatever their kinds (a tune beside a
    training: few rows line up)."""
    from trainfit.ui.runs import Run, default_pair

    def run(path: str, kind: str) -> Run:
        return Run(path=path, kind=kind, status="finished", pages=[], modified=0.0)

    newest_first = [run("t2", "tune"), run("tr", "train"), run("p", "probe"), run("t1", "tune")]
    assert default_pair(newest_first) == ("t1", "t2")
    assert default_pair([run("tr", "train"), run("t1", "tune")]) == ("t1", "tr")  # none alike: the next newest
    assert default_pair([run("t1", "tune")]) == ("", "")


@pytest.mark.slow
def test_a_resumed_tune_is_one_run(root: Path) -> None:
    """Issue 50 item 7: a tune and its resume are one run: each part's page lists the parts and links
    the run's whole log, the run's tuning time is its parts' together, and a tune no process runs any
    more is not "stopped: running"."""
    jobs = Jobs(Root(root))
    out = root / "runs" / "t"
    first = jobs.start("tune", [str(root / SPEC), "--output", str(out), "--quick", "--max-trials", "1"], output=out)
    wait_for(jobs, first.id, "finished")
    second = jobs.start("tune", [str(root / SPEC), "--output", str(out), "--quick", "--max-trials", "2", "--resume"],
                        output=out)
    wait_for(jobs, second.id, "finished")
    client = create_app(root).test_client()

    page = client.get(f"/jobs/{second.id}").get_data(as_text=True)
    assert "One run in 2 parts:" in page and f"1. tune {first.id}" in page and "<b>2. this one (tune)</b>" in page
    whole = client.get(f"/jobs/{second.id}/run-log").get_data(as_text=True)
    assert whole.index(f"=== part 1 of 2: trainfit tune ") < whole.index(f"(job {second.id}) ===")
    assert whole.count("space: ") == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_tuning_time_s"] > summary["tuning_time_s"] > 0
    rows = dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", client.get("/run?path=runs/t").get_data(
        as_text=True)))
    assert re.fullmatch(r"\d+ s over its resumed parts \(the last \d+ s\)", rows["tuning time"])
    (out / "summary.json").write_text(json.dumps({**summary, "stop_reason": "running"}))  # as a killed tune leaves it
    rows = dict(re.findall(r"<tr><th>([^<]*)</th><td>([^<]*)</td></tr>", client.get("/run?path=runs/t").get_data(
        as_text=True)))
    assert rows["stopped"].startswith("interrupted: no process runs it")
