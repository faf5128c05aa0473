"""Jobs in the browser: the actions on a run folder (plan, train), a job's page with its log as it
grows (the page polls ``/api/jobs/ID``), Stop and Resume."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from flask import Blueprint, jsonify, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from trainfit.ui import commands
from trainfit.ui.jobs import Job
from trainfit.ui.paths import Refused
from trainfit.ui.state import ui

jobs_views = Blueprint("jobs", __name__)


def start(planned: commands.Planned, spec: Path | None = None) -> Response:
    """Start ``planned`` as a job and send the browser to its page."""
    job = ui().jobs.start(planned.command, planned.args, output=planned.output, spec=spec)
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
                           resumable=job.command in commands.RESUMABLE)


@jobs_views.get("/api/jobs/<job_id>")
def job_json(job_id: str) -> Any:
    """The job's status and its log from byte ``offset`` on: what the page appends."""
    state = ui()
    job = state.jobs.get(job_id)
    job_state = state.jobs.state(job)  # before the log: a job seen ended has all its output read below
    text, offset = state.jobs.log(job, request.args.get("offset", 0, type=int))
    return jsonify(ok=True, **dataclasses.asdict(job_state), log=text, offset=offset, links=_links(job))


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
    args = commands.resumed(job.command, job.args)
    output = None if job.output is None else state.root.path / job.output
    spec = None if job.spec is None else state.root.path / job.spec
    return start(commands.Planned(command=job.command, args=args, output=output), spec=spec)
