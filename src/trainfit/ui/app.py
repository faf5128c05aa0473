"""The Flask app of ``trainfit ui``: the pages that list runs and jobs, open a run, and show two runs
side by side; every file under the root is served as it is (a run's ``report.html``); the spec editor
and the jobs are :mod:`trainfit.ui.spec_views` and :mod:`trainfit.ui.job_views`.

Safety: every path a request names goes through :meth:`Root.inside` (403 outside the root); where a
token is set (a host other than this machine's), every request needs it; a POST from another
site's page (an ``Origin`` that is not the UI's own) is refused; only ``trainfit`` commands run."""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, abort, jsonify, render_template, request, send_file
from markupsafe import Markup
from werkzeug.exceptions import HTTPException

from trainfit.errors import TrainfitError
from trainfit.files import DISK_ERRORS
from trainfit.ui.jobs import Jobs
from trainfit.ui.job_views import jobs_views
from trainfit.ui.paths import Refused, Root, write_refused
from trainfit.ui.runs import default_pair, figures, find_runs, summarised
from trainfit.ui.spec_views import spec_views
from trainfit.ui.specs import spec_files
from trainfit.ui.state import UiState, ui

TOKEN_COOKIE = "trainfit_token_{port}"
"""The cookie that keeps the token, one per port: a browser sends a host's cookies to every port of it,
so with one name for all, a second UI (another port, its own token) replaced the first's, and the first
page answered 403."""


def token_cookie() -> str:
    """The name of the token's cookie for the port this request came in on."""
    return TOKEN_COOKIE.format(port=request.environ.get("SERVER_PORT", ""))


def is_loopback(host: str) -> bool:
    """``host`` is reachable from this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    """A random token every request must carry, as Jupyter's: on a shared machine (a login node, a GPU
    server) another user reaches 127.0.0.1 too, and a spec's command_template runs what it says."""
    return secrets.token_urlsafe(24)


def create_app(root: Path | str, *, token: str | None = None, host: str = "127.0.0.1") -> Flask:
    """The UI over ``root`` (its runs, specs and jobs); with ``token``, every request must carry it.
    Served on a loopback ``host``, a request naming another host is refused (a page of another site
    whose name was made to point here: DNS rebinding)."""
    app = Flask(__name__)
    app.extensions["trainfit_ui"] = UiState(root=Root(root), jobs=Jobs(Root(root)), token=token, host=host)
    app.register_blueprint(spec_views)
    app.register_blueprint(jobs_views)
    app.context_processor(lambda: {"ui_root": ui().root.path})
    app.before_request(_guard)
    app.after_request(_remember_token)
    app.after_request(_no_framing)
    app.register_error_handler(TrainfitError, _refused)
    app.register_error_handler(OSError, _system_refused)
    app.register_error_handler(HTTPException, _http_error)
    app.add_url_rule("/", view_func=index)
    app.add_url_rule("/run", view_func=run_page)
    app.add_url_rule("/compare", view_func=compare_page)
    app.add_url_rule("/files/<path:relative>", view_func=serve_file)
    app.add_url_rule("/favicon.ico", view_func=lambda: ("", 204))  # none: a browser's asking is not an error
    return app


def _guard() -> Any:
    """Refuse a request without the token (where one is set), one naming another host where the UI
    serves this machine only, and a POST another site's page sent."""
    token, host = ui().token, ui().host
    named = urlsplit("//" + request.host).hostname or ""
    if is_loopback(host) and not (is_loopback(named) or named == host):
        return _page_error(403, f"a request for {named} is refused: this UI serves {host} only",
                           "open the URL `trainfit ui` printed")
    if token is not None:
        given = request.args.get("token") or request.cookies.get(token_cookie()) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return _page_error(403, "this UI needs its token", "open the URL `trainfit ui` printed (it ends in "
                               "?token=...); a page opened before it was started with another --token carries the old one")
    origin = request.headers.get("Origin")
    if request.method == "POST" and origin and urlsplit(origin).netloc != request.host:
        return _page_error(403, f"a request from another site ({origin}) is refused", "use the UI's own page")
    return None


def _remember_token(response: Response) -> Response:
    """The token given in the URL kept as a cookie, so the links need not carry it."""
    token = ui().token
    if token is not None and request.args.get("token") == token:
        response.set_cookie(token_cookie(), token, httponly=True, samesite="Strict")
    return response


def _no_framing(response: Response) -> Response:
    """No page of another site may frame the UI (a click on Stop or Save made for it); a file served
    from the root runs no script as the UI (an HTML or SVG file of a cloned repository), and only the
    UI's own pages frame it (a tune's report.html, live on its job's page)."""
    served = request.path.startswith("/files/")  # a run's own page: framed by the UI's job page alone, live
    response.headers["X-Frame-Options"] = "SAMEORIGIN" if served else "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    policy = "frame-ancestors 'self'; sandbox" if served else "frame-ancestors 'none'"
    response.headers["Content-Security-Policy"] = policy
    return response


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def _page_error(status: int, message: str, hint: str | None) -> Any:
    if _wants_json():
        return jsonify(ok=False, error=message, hint=hint), status
    return render_template("error.html", status=status, message=message, hint=hint), status


def _refused(err: TrainfitError) -> Any:
    return _page_error(err.status if isinstance(err, Refused) else 400, err.message, err.hint)


def _system_refused(err: OSError) -> Any:
    """A file operation the system refused where no handler expected it (a run folder made on a full
    disk): the cause and the file, on the page, never a bare 500."""
    if err.errno in DISK_ERRORS:
        return _refused(write_refused(err, ui().root.path))
    return _page_error(500, f"{err.strerror or err}: {err.filename or 'no file named'}", None)


def _http_error(err: HTTPException) -> Any:
    return _page_error(err.code or 500, err.description or err.name, None)


def index() -> str:
    state = ui()
    found, damaged = state.jobs.scan()
    jobs = [(job, state.jobs.state(job)) for job in found]
    runs = find_runs(state.root, state.jobs)
    return render_template("index.html", root=state.root.path, runs=runs, pair=default_pair(runs),
                           specs=spec_files(state.root), jobs=jobs, damaged=damaged)


def run_page() -> str:
    state = ui()
    relative = request.args.get("path", "")
    folder = state.root.inside(relative)
    if not folder.is_dir():
        raise Refused(f"{relative} is not a folder", "pick a run the list shows", status=404)
    jobs = [(job, state.jobs.state(job)) for job in state.jobs.all() if job.output == state.root.relative(folder)]
    runs = {r.path: r for r in find_runs(state.root, state.jobs)}
    rows, chart = summarised(folder)
    return render_template("run.html", path=state.root.relative(folder), run=runs.get(state.root.relative(folder)),
                           figures=rows, chart=Markup(chart), pages=sorted(p.name for p in folder.glob("*.html")),
                           is_tune=(folder / "summary.json").is_file(), jobs=jobs)


def compare_page() -> str:
    """Two runs side by side: their key figures in two columns, row by row."""
    state = ui()
    names = [request.args.get("a", ""), request.args.get("b", "")]
    folders = [state.root.inside(name) for name in names]
    columns = [dict(figures(folder)) for folder in folders]
    rows = list(dict.fromkeys(key for column in columns for key in column))
    return render_template("compare.html", names=[state.root.relative(f) for f in folders], rows=rows, columns=columns)


def serve_file(relative: str) -> Response:
    """A file under the root, as it is (a run's pages, its JSON, a job's log)."""
    path = ui().root.inside(relative)
    if not path.is_file():
        abort(404, f"{relative} is not a file")
    return send_file(path, max_age=0)
