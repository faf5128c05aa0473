"""Jobs in the browser: the actions on a run folder (plan, train), a job's page with its log as it
grows (the page polls ``/api/jobs/ID``), Stop and Resume."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from flask import Blueprint, jsonify, redirect, render_template, request, send_file, url_for
from werkzeug.wrappers import Response

from trainfit.ui import commands
from trainfit.ui.jobs import Job
from trainfit.ui.live import live_view
from trainfit.ui.paths import Refused, open_regular, prune_empty, write_refused
from trainfit.ui.runs import held
from trainfit.ui.state import ui
from trainfit.ui.supervise import LOG_FILE

jobs_views = Blueprint("jobs", __name__)


def start(planned: commands.Planned, spec: Path | None = None) -> Response:
    """Start ``planned`` as a job and send the browser to its page. Refused (409) where a live process
    holds its folder; where it does not start (refused, a full disk), its run folder is removed again
    if nothing was written into it."""
    state = ui()
    try:
        if planned.output is not None and held(planned.output):
            raise Refused(f"{state.root.relative(planned.output)} is held by a running process (a tune, "
                          "a comparison or a training started outside this UI)", "wait for it to end", status=409)
        job = state.jobs.start(planned.command, planned.args, output=planned.output, spec=spec)
    except BaseException as err:
        if planned.output is not None:
            prune_empty(planned.output, up_to=state.root.path)
        if isinstance(err, OSError):
            raise write_refused(err, state.root.jobs) from None
        raise
    return redirect(url_for("jobs.job_page", job_id=job.id), code=303)


@jobs_views.post("/run/action")
def run_action() -> Response:
    """``plan`` or ``train`` on a tune folder under the root."""
    state = ui()
    folder = state.root.inside(request.form.get("path", ""))
    return start(commands.run_command(request.form.get("command", ""), folder, request.form))


def _links(job: Job) -> list[dict[str, str]]:
    """The pages (and the run folder) a job's output holds by now."""
    if job.output is None:
        return []
    folder = ui().root.path / job.output
    pages = sorted(p.name for p in folder.glob("*.html")) if folder.is_dir() else []
    links = [{"name": name, "href": url_for("serve_file", relative=f"{job.output}/{name}")} for name in pages]
    if folder.is_dir():
        links.append({"name": f"run folder {job.output}", "href": url_for("run_page", path=job.output)})
    return links


@jobs_views.get("/jobs/<job_id>")
def job_page(job_id: str) -> str:
    state = ui()
    job = state.jobs.get(job_id)
    return render_template("job.html", job=job, state=state.jobs.state(job), links=_links(job),
                           resumable=job.command in commands.RESUMABLE, live=live_view(ui().root.path, job, url_for),
                           shown=shlex.join(["trainfit", job.command, *(_under_root(a) for a in job.args)]),
                           parts=_parts(job))


def _under_root(arg: str) -> str:
    """A path under the root as the root's own (the job runs there: the line as shown runs as it is)."""
    root = f"{ui().root.path}/"
    return arg[len(root):] if arg.startswith(root) else arg


@jobs_views.get("/api/jobs/<job_id>")
def job_json(job_id: str) -> Any:
    """The job's status and its log from byte ``offset`` on: what the page appends. Without an
    ``offset``, the log's end (``cut``: the bytes before it left out; the whole log is ``/jobs/ID/log``)."""
    state = ui()
    job = state.jobs.get(job_id)
    job_state = state.jobs.state(job)  # before the log: a job seen ended has all its output read below
    asked = request.args.get("offset")
    if asked is None:
        text, offset, cut = state.jobs.tail(job)
    else:
        text, offset, cut = *state.jobs.log(job, _offset(asked)), 0
    return jsonify(ok=True, **dataclasses.asdict(job_state), log=text, offset=offset, cut=cut,
                   whole_log=url_for("jobs.whole_log", job_id=job.id), links=_links(job), live=live_view(ui().root.path, job, url_for))


def _offset(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Refused(f"offset {text!r} is not a whole number of bytes", status=400) from None


@jobs_views.get("/jobs/<job_id>/log")
def whole_log(job_id: str) -> Response:
    """The job's whole log as plain text (the page shows its end only)."""
    state = ui()
    job = state.jobs.get(job_id)
    try:
        log = open_regular(state.root.jobs / job.id / LOG_FILE)
    except FileNotFoundError:
        return Response(b"", mimetype="text/plain")
    except OSError as err:
        raise Refused(f"cannot read the log of job {job_id}: {err.strerror or err}", status=422) from None
    return send_file(log, mimetype="text/plain", max_age=0)  # streamed, and closed once sent


def _parts(job: Job) -> list[Job]:
    """The jobs that wrote ``job``'s run folder (a tune and its resumes), the first first: one run."""
    if job.output is None:
        return [job]
    return sorted((j for j in ui().jobs.all() if j.output == job.output and j.command == job.command),
                  key=lambda j: j.started_at)  # a plan of a tune's folder writes into it too: no part of the tune


@jobs_views.get("/jobs/<job_id>/run-log")
def run_log(job_id: str) -> Response:
    """The whole log of ``job``'s run: every part's (a tune and its resumes), in order, each headed."""
    state = ui()
    parts = _parts(state.jobs.get(job_id))
    out = []
    for i, part in enumerate(parts, 1):
        text, end = state.jobs.log(part)  # a chunk at most each: the part's own log page has the rest
        more = state.jobs.log(part, end)[0]
        out.append(f"=== part {i} of {len(parts)}: {shlex.join(['trainfit', part.command, *part.args])} "
                   f"(job {part.id}) ===\n{text}"
                   + (f"\n[... the rest of this part: {url_for('jobs.whole_log', job_id=part.id)}]\n" if more else ""))
    return Response("\n".join(out), mimetype="text/plain")


@jobs_views.post("/jobs/<job_id>/stop")
def stop(job_id: str) -> Response:
    """Ctrl-C to the job's processes (SIGTERM after a grace period)."""
    state = ui()
    state.jobs.stop(state.jobs.get(job_id))
    return redirect(url_for("jobs.job_page", job_id=job_id), code=303)


@jobs_views.post("/jobs/<job_id>/resume")
def resume(job_id: str) -> Response:
    """The stopped job again with ``--resume``, into the same folder, as a new job."""
    state = ui()
    job = state.jobs.get(job_id)
    if (now := state.jobs.state(job)).command_pid is not None:
        raise Refused(f"job {job_id}'s command still runs (pid {now.command_pid}) though its supervisor was killed: "
                      f"a resume would be a second run over {job.output or 'its folder'}",
                      "stop it first (Stop reaches it), or wait for it to end", status=409)
    if now.status == "running":
        raise Refused(f"job {job_id} is still running", "stop it first, or wait for it to end", status=409)
    if now.problem is not None:
        raise Refused(f"{now.problem}: whether it still runs is not known", "delete its job folder first", status=409)
    args = commands.resumed(job.command, job.args)
    output = None if job.output is None else state.root.path / job.output
    spec = None if job.spec is None else state.root.path / job.spec
    return start(commands.Planned(command=job.command, args=args, output=output), spec=spec)
