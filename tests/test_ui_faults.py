"""``trainfit ui`` under faults (issue 45's hardening pass): a link out of the root, damaged job
records, FIFOs where files were listed, a full disk, a double click on Resume, hostile form values and
addresses. Each test drives the real app (Flask's test client, or the real command in a subprocess)
over real files; the one fault injected is the disk's refusal to take bytes."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("flask")

from test_ui import SPEC, root, spec_form, wait_for_output  # noqa: E402,F401 (root: a fixture)

from trainfit.ui.app import create_app  # noqa: E402
from trainfit.ui.jobs import LOG_CHUNK, Job, Jobs, run_module  # noqa: E402
from trainfit.ui.paths import Root  # noqa: E402

PAGE_TIMEOUT_S = 20.0
"""How long a page may take before it counts as hung (the index of the examples answers in well under a second)."""


def job_record(root: Path, job_id: str, *, started_at: float, output: str | None, returncode: int | None = None,
               command: str = "tune") -> Path:
    """A job's folder as the UI writes it (``job.json``, and ``exit.json`` where ``returncode`` is given)."""
    folder = root / ".trainfit-ui" / "jobs" / job_id
    folder.mkdir(parents=True)
    job = Job(id=job_id, command=command, argv=[*run_module("trainfit"), command, "spec.yaml"], cwd=str(root),
              started_at=started_at, output=output)
    (folder / "job.json").write_text(json.dumps(job.__dict__))
    if returncode is not None:
        (folder / "exit.json").write_text(json.dumps({"returncode": returncode, "finished_at": started_at + 1}))
    return folder


def get_within(client: Any, url: str, timeout_s: float = PAGE_TIMEOUT_S) -> Any:
    """``client.get(url)``, or a failure where it does not answer within ``timeout_s`` (a daemon thread:
    a request stuck for good does not keep the test run from ending)."""
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(client.get(url)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert answer, f"{url} did not answer within {timeout_s:.0f} s"
    return answer[0]


def text_of(reply: Any) -> str:
    return reply.get_data(as_text=True).replace("&#39;", "'").replace("&#34;", '"').replace("&quot;", '"')


def test_a_link_to_a_spec_outside_the_root_is_listed_as_foreign(root: Path,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """A link in the root to a spec outside it made the index and every spec page a 500 (the listing
    named it relative to the root, which it is not under)."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.yaml").write_text("model: {}\n")
    (root / "examples" / "linked.yaml").symlink_to(outside / "secret.yaml")
    client = create_app(root).test_client()

    index = client.get("/")
    page = client.get(f"/spec?path={SPEC}")

    assert index.status_code == 200 and page.status_code == 200, text_of(index)
    assert "examples/linked.yaml" in text_of(index) and "leads outside the root" in text_of(index)
    assert "secret.yaml" not in text_of(index) and "secret.yaml" not in text_of(page)  # where it leads is not told
    assert client.get("/spec?path=examples/linked.yaml").status_code == 403


EXIT_DAMAGES = ['{"returncode": "x"}', "[]", "{}", "1e999", '{"returncode": 1e999}', "{not json"]
JOB_DAMAGES = ["[]", "pid-x", "no-command", "{not json"]


def _damage_job_json(folder: Path, how: str) -> None:
    record = json.loads((folder / "job.json").read_text())
    if how == "pid-x":
        text = json.dumps({**record, "pid": "x"})
    elif how == "no-command":  # the argv does not hold the command: its arguments cannot be told
        text = json.dumps({**record, "argv": ["python"]})
    else:
        text = how
    (folder / "job.json").write_text(text)


@pytest.mark.parametrize("damage", [f"exit.json:{d}" for d in EXIT_DAMAGES] + [f"job.json:{d}" for d in JOB_DAMAGES])
def test_a_damaged_job_record_is_shown_as_such_and_every_page_stays_up(root: Path, damage: str) -> None:
    """One damaged ``exit.json`` or ``job.json`` made the index, the run's page and the job's own a 500."""
    (root / "runs" / "abl").mkdir(parents=True)
    (root / "runs" / "abl" / "ablation.json").write_text("{}")
    job_id = "20260101-000000-tune-abc123"
    folder = job_record(root, job_id, started_at=1_700_000_000.0, output="runs/abl", returncode=0)
    record, text = damage.split(":", 1)
    if record == "exit.json":
        (folder / "exit.json").write_text(text)
    else:
        _damage_job_json(folder, text)
    client = create_app(root).test_client()

    replies = {url: client.get(url) for url in ("/", "/run?path=runs/abl", f"/jobs/{job_id}", f"/api/jobs/{job_id}")}

    for url, reply in replies.items():
        assert reply.status_code != 500 and "Traceback" not in text_of(reply), (url, text_of(reply))
    assert replies["/"].status_code == 200 and replies["/run?path=runs/abl"].status_code == 200
    assert "damaged record" in text_of(replies["/"]) and record in text_of(replies["/"])
    assert "damaged record" in text_of(replies[f"/jobs/{job_id}"])
    assert client.post(f"/jobs/{job_id}/stop").status_code != 500
    assert client.post(f"/jobs/{job_id}/resume").status_code in (409, 422)  # nothing starts on a damaged record
    assert len(list((root / ".trainfit-ui" / "jobs").iterdir())) == 1


def test_a_huge_log_offset_reads_nothing_and_says_where_the_log_ends(root: Path) -> None:
    job_id = "20260101-000000-tune-abc123"
    folder = job_record(root, job_id, started_at=1_700_000_000.0, output=None, returncode=0)
    (folder / "output.log").write_text("done\n")
    client = create_app(root).test_client()

    for offset in (10**30, 2**63, 2**63 - 1, 10**6, -(10**30)):
        reply = client.get(f"/api/jobs/{job_id}?offset={offset}")
        assert reply.status_code == 200, (offset, text_of(reply))
        body = reply.get_json()
        assert body["offset"] == 5 and body["log"] == ("done\n" if offset < 0 else ""), (offset, body)
    assert client.get(f"/api/jobs/{job_id}?offset=x").status_code == 400


@pytest.fixture
def fifos(root: Path) -> Iterator[Callable[[Path], Path]]:
    """Makes FIFOs under the root; at the end each one is opened for writing once, so a reader a test
    left stuck on it (before the fix) gets its end of file and its thread ends, and is removed (the
    root's clean-up reads the jobs' records)."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for path in made:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO where nobody reads: nothing stuck
        except OSError:
            pass
        path.unlink()


def test_a_fifo_where_a_file_was_listed_hangs_no_page(root: Path, fifos: Callable[[Path], Path]) -> None:
    """A FIFO named ``*.yaml`` in the root hung the index and every spec page for good (each read it,
    waiting for a writer); a FIFO as a run's record or a job's file hung their pages too."""
    fifos(root / "pipe.yaml")
    (root / "runs" / "tune").mkdir(parents=True)
    fifos(root / "runs" / "tune" / "summary.json")
    job_id = "20260101-000000-tune-abc123"
    job_record(root, job_id, started_at=1_700_000_000.0, output="runs/tune")
    fifos(root / ".trainfit-ui" / "jobs" / job_id / "exit.json")
    fifos(root / ".trainfit-ui" / "jobs" / job_id / "output.log")
    other = "20260101-000001-tune-def456"
    fifos(root / ".trainfit-ui" / "jobs" / other / "job.json")
    client = create_app(root).test_client()

    index = get_within(client, "/")
    replies = [get_within(client, url) for url in (f"/spec?path={SPEC}", "/run?path=runs/tune", f"/jobs/{job_id}",
                                                  f"/api/jobs/{job_id}", f"/jobs/{other}", "/spec?path=pipe.yaml",
                                                  "/files/pipe.yaml")]

    assert index.status_code == 200 and "pipe.yaml" in text_of(index) and "not a regular file" in text_of(index)
    assert all(r.status_code != 500 for r in replies), [text_of(r) for r in replies]
    assert replies[0].status_code == 200 and replies[1].status_code == 200
    assert "damaged record" in text_of(replies[2]) and "not a regular file" in text_of(replies[2])
    assert replies[5].status_code == 404 and replies[6].status_code == 404


class _FullDisk:
    """A file opened for writing on a full disk: it was made (a directory entry costs no data block
    where the folder has room), but no byte of it is taken."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Fills the disk when called: every file opened for writing from then on (through ``io.open``,
    which ``open``, ``Path.open`` and ``os.fdopen`` all come to) takes no byte. The returned function
    frees it again."""
    real_open = io.open

    def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened_file = real_open(file, mode, *args, **kwargs)
        return _FullDisk(opened_file) if any(c in mode for c in "wxa+") else opened_file

    monkeypatch.setattr(io, "open", opened)
    return lambda: monkeypatch.setattr(io, "open", real_open)


def test_a_full_disk_is_said_with_its_path_and_leaves_nothing_behind(root: Path, full_disk: Callable[[], None]) -> None:
    """The analyze action answered a bare 500 and left an empty run folder and job folder; a spec save
    left a 0-byte spec, and the same save was then refused as "exists already"."""
    client = create_app(root).test_client()

    started = client.post("/spec/run", data=spec_form(root, command="analyze"))
    saved = client.post("/spec/save", data=spec_form(root, name="bigger"))

    for reply in (started, saved):
        assert reply.status_code == 507 and "disk full" in text_of(reply), text_of(reply)
    assert str(root / ".trainfit-ui" / "jobs") in text_of(started) and str(root / "examples") in text_of(saved)
    assert not (root / "trainfit-runs").exists() and not (root / ".trainfit-ui").exists()
    assert not (root / "examples" / "bigger.yaml").exists() and not list((root / "examples").glob("*.tmp"))
    full_disk()  # freed
    again = client.post("/spec/save", data=spec_form(root, name="bigger"))
    assert again.status_code == 303 and (root / "examples" / "bigger.yaml").read_text() == (root / SPEC).read_text()


def test_a_full_disk_refusing_a_new_folder_is_said_too(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk so full that no folder can be made (mkdir's ENOSPC): the run folder of an action was made
    before any job's file, and its refusal was a bare 500."""
    def no_room(path: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(os, "mkdir", no_room)
    reply = create_app(root).test_client().post("/spec/run", data=spec_form(root, command="analyze"))

    assert reply.status_code == 507 and "disk full: cannot write" in text_of(reply), text_of(reply)
    assert str(root / "trainfit-runs") in text_of(reply)
    assert not (root / "trainfit-runs").exists() and not (root / ".trainfit-ui").exists()


@pytest.mark.integration
def test_a_second_job_on_a_folder_with_a_live_one_is_refused(root: Path) -> None:
    """A double click on Resume started two jobs on one folder: the second, refused by the folder's lock
    (exit 2), was then taken for the folder's latest and the run listed as failed."""
    (root / "runs" / "abl").mkdir(parents=True)
    (root / "runs" / "abl" / "ablation.json").write_text("{}")
    stopped = "20260101-000000-ablate-abc123"
    job_record(root, stopped, started_at=1_700_000_000.0, output="runs/abl", returncode=130, command="ablate")
    jobs = Jobs(Root(root))
    # the first click's job: a command that runs until stopped and starts in a second (a `trainfit ui`: no torch)
    live = jobs.start("ui", ["--root", str(root / "examples"), "--port", "0", "--no-browser"],
                      output=root / "runs" / "abl")
    wait_for_output(jobs, live.id, "trainfit ui: serving")
    client = create_app(root).test_client()

    second = client.post(f"/jobs/{stopped}/resume")

    assert second.status_code == 409, text_of(second)
    assert f"job {live.id} runs on runs/abl" in text_of(second)
    assert len(list((root / ".trainfit-ui" / "jobs").iterdir())) == 2  # none started
    assert psutil.pid_exists(live.pid)


def test_the_latest_job_of_a_folder_is_the_last_started_whatever_its_name(root: Path) -> None:
    """Two jobs of one second and one command differ by their names' random suffixes only: the list
    took the one whose suffix sorts last for the newest."""
    (root / "runs" / "abl").mkdir(parents=True)
    (root / "runs" / "abl" / "ablation.json").write_text("{}")
    job_record(root, "20260101-000000-ablate-ffffff", started_at=1_700_000_000.1, output="runs/abl", returncode=1,
               command="ablate")
    job_record(root, "20260101-000000-ablate-000000", started_at=1_700_000_000.9, output="runs/abl", returncode=0,
               command="ablate")

    page = create_app(root).test_client().get("/").get_data(as_text=True)

    assert [job.id for job in Jobs(Root(root)).all()] == ["20260101-000000-ablate-000000",
                                                          "20260101-000000-ablate-ffffff"]
    row = page[page.index('data-path="runs/abl"'):].split("</tr>")[0]
    assert 'class="status finished"' in row and "20260101-000000-ablate-000000" in row, row


def test_each_port_has_its_own_token_cookie(root: Path) -> None:
    """One cookie name for every port: opening a second UI (another port, another token) replaced the
    first's cookie, and the first page then answered 403."""
    first, second = create_app(root, token="first-token"), create_app(root, token="second-token")

    given = [app.test_client().get("/?token=" + token, base_url=f"http://127.0.0.1:{port}")
             for app, token, port in ((first, "first-token", 8001), (second, "second-token", 8002))]
    names = [reply.headers["Set-Cookie"].split("=")[0] for reply in given]

    def answer(app: Any, port: int, cookies: dict[str, str]) -> int:
        """What ``app`` on ``port`` answers a browser holding ``cookies`` for 127.0.0.1 (a cookie has no port)."""
        client = app.test_client()
        for name, value in cookies.items():
            client.set_cookie(name, value, domain="127.0.0.1")
        return client.get("/", base_url=f"http://127.0.0.1:{port}").status_code

    both = dict(zip(names, ("first-token", "second-token")))
    assert names == ["trainfit_token_8001", "trainfit_token_8002"]
    assert answer(first, 8001, both) == 200 and answer(second, 8002, both) == 200
    assert answer(first, 8001, {"trainfit_token_8002": "second-token"}) == 403


def _ui(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainfit", "ui", "--root", str(root), "--no-browser", "--port", "0",
                           *args], capture_output=True, text=True, timeout=60)


def test_an_empty_or_foreign_host_is_a_usage_error_naming_it(root: Path) -> None:
    """``--host ""`` served every interface and printed ``http://:PORT/``; an address not of this machine
    was told to pick another --port."""
    empty = _ui(root, "--host", "")
    foreign = _ui(root, "--host", "192.0.2.1")  # TEST-NET-1: no machine's own address
    unknown = _ui(root, "--host", "no-such-host.invalid")

    assert empty.returncode == 2 and "--host" in empty.stderr and "empty" in empty.stderr, empty.stderr
    for done, host in ((foreign, "192.0.2.1"), (unknown, "no-such-host.invalid")):
        assert done.returncode == 2 and f"--host {host}" in done.stderr and "--port" not in done.stderr, done.stderr
    assert "Traceback" not in empty.stderr + foreign.stderr + unknown.stderr


def test_nothing_under_a_ui_folder_is_served_at_any_depth(root: Path) -> None:
    for folder in (root / ".trainfit-ui", root / "project" / ".trainfit-ui", root / "a" / "b" / ".trainfit-ui"):
        folder.mkdir(parents=True)
        (folder / "token").write_text("s3cret\n")
    client = create_app(root).test_client()

    for url in ("/files/.trainfit-ui/token", "/files/project/.trainfit-ui/token", "/files/a/b/.trainfit-ui/token",
                "/run?path=project/.trainfit-ui"):
        reply = client.get(url)
        assert reply.status_code == 403 and "s3cret" not in text_of(reply), url


@pytest.mark.parametrize("only", ["--storage", "-x", "checkpointing,--help", ","])
def test_an_ablate_word_that_reads_as_an_option_starts_nothing(root: Path, only: str) -> None:
    reply = create_app(root).test_client().post("/spec/run", data=spec_form(root, command="ablate", only=only))

    assert reply.status_code == 400 and "--only" in text_of(reply), text_of(reply)
    assert not (root / "trainfit-runs").exists() and not (root / ".trainfit-ui").exists()


def test_a_long_log_opens_at_its_end_and_each_poll_brings_only_what_is_new(root: Path) -> None:
    """A 150 MB log took ~10 minutes to load: the page read it from its first byte, a chunk a poll. The
    page now gets the last LOG_CHUNK bytes (from a line's start), told how much was left out."""
    job_id = "20260101-000000-tune-abc123"
    folder = job_record(root, job_id, started_at=1_700_000_000.0, output=None)
    lines = [f"line {i:07d} " + "é" * 40 + "\n" for i in range(30_000)]  # ~2.7 MB, 2-byte characters
    (folder / "output.log").write_text("".join(lines))
    size = (folder / "output.log").stat().st_size
    client = create_app(root).test_client()

    first = client.get(f"/api/jobs/{job_id}").get_json()
    with (folder / "output.log").open("a") as log:
        log.write("the end\n")
    poll = client.get(f"/api/jobs/{job_id}?offset={first['offset']}").get_json()
    whole = client.get(first["whole_log"])

    assert first["offset"] == size and first["log"].startswith("line ") and first["log"].endswith(lines[-1])
    assert len(first["log"].encode()) <= LOG_CHUNK and first["cut"] == size - len(first["log"].encode()) > 0
    assert "".join(lines).endswith(first["log"])
    assert poll["log"] == "the end\n" and poll["cut"] == 0
    assert whole.status_code == 200 and whole.get_data(as_text=True) == "".join(lines) + "the end\n"
    assert whole.mimetype == "text/plain"
