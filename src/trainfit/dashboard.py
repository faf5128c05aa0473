"""``trainfit dashboard``: a live web view of a run, on a local port.

The study is served by optuna-dashboard (an install extra: ``pip install 'trainfit[dashboard]'``),
reading the run's ``study.journal`` (or a ``--storage`` URL) as it is, no copy, so a search can
be watched while it runs. Beside it, under ``/trainfit/``, the run folder's own pages
(``report.html``, ``compare.html``, ``ablation.html``, ...) are served as they are rewritten. A
folder with no study (a comparison or an ablation without ``--storage``) is served its pages only.
"""

from __future__ import annotations

import html
import mimetypes
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.search.journal import journal_storage
from trainfit.search.storage import is_journal

PAGES = "/trainfit"
"""Where the run folder's own pages are served."""

StartResponse = Callable[..., Any]


def storage_for(run_dir: Path, storage_url: str | None) -> Any:
    """The study's storage: ``storage_url`` as given (a shared journal file opened as one), else the
    folder's journal; None: the folder holds no study."""
    if storage_url:
        return journal_storage(Path(storage_url)) if is_journal(storage_url) else storage_url
    journal = run_dir / "study.journal"
    if not journal.is_file():
        return None

    return journal_storage(journal)


def app(run_dir: Path, storage_url: str | None = None) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """The WSGI app: the run folder's pages under :data:`PAGES`, optuna-dashboard for the rest
    (without a study: the pages alone, ``/`` leading to their list)."""
    storage = storage_for(run_dir, storage_url)
    if storage is None and not any(run_dir.glob("*.html")):
        raise TrainfitError(f"{run_dir} holds neither a study.journal nor a page to show",
                            "give a `trainfit tune`, `compare` or `ablate` output folder (or --storage URL)")
    dashboard = None
    if storage is not None:
        try:
            import optuna_dashboard  # type: ignore[import-untyped]
        except ImportError:
            raise TrainfitError("the dashboard needs optuna-dashboard", "pip install 'trainfit[dashboard]'") from None
        dashboard = optuna_dashboard.wsgi(storage)

    def serve(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == PAGES or path.startswith(PAGES + "/"):
            return _page(run_dir, path[len(PAGES):].strip("/"), start_response, has_study=dashboard is not None)
        if dashboard is None:
            start_response("302 Found", [("Location", PAGES + "/")])
            return [b""]
        return dashboard(environ, start_response)

    return serve


def _page(run_dir: Path, name: str, start_response: StartResponse, has_study: bool) -> Iterable[bytes]:
    """A page of the folder (an ``.html`` file directly in it), or the list of them."""
    pages = sorted(p.name for p in run_dir.glob("*.html"))
    if not name:
        items = "".join(f'<li><a href="{PAGES}/{html.escape(p)}">{html.escape(p)}</a></li>' for p in pages)
        body = (f"<!doctype html><html><head><meta charset='utf-8'><title>trainfit: {html.escape(run_dir.name)}</title>"
                f"</head><body><h1>{html.escape(str(run_dir))}</h1><ul>{items}</ul>"
                + ("<p><a href='/dashboard'>the study (optuna-dashboard)</a></p>" if has_study else "")
                + "</body></html>").encode()
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [body]
    if name not in pages:  # only the folder's own pages: no path walks out of it
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [f"no page {name} in {run_dir}".encode()]
    kind = mimetypes.guess_type(name)[0] or "text/html"
    start_response("200 OK", [("Content-Type", f"{kind}; charset=utf-8")])
    return [(run_dir / name).read_bytes()]


def serve_forever(run_dir: Path, *, host: str = "127.0.0.1", port: int = 8080, storage_url: str | None = None,
                  on_ready: Callable[[str], None] | None = None) -> None:
    """Serve :func:`app` on ``host:port`` until interrupted; ``on_ready`` gets the base URL."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Threaded(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    wsgi_app = app(run_dir, storage_url)
    try:
        server = make_server(host, port, wsgi_app, server_class=Threaded, handler_class=Quiet)
    except OSError as err:
        raise TrainfitError(f"cannot serve on {host}:{port}: {err.strerror}", "pick another --port") from None
    with server:
        if on_ready is not None:
            on_ready(f"http://{host}:{server.server_port}")
        server.serve_forever()
