"""Serving the UI: Werkzeug's threaded server on one port, the URL (with its token, where one is
needed) printed, and a browser opened on it unless asked not to."""

from __future__ import annotations

import logging
import socket
import webbrowser
from collections.abc import Callable
from pathlib import Path

from werkzeug.serving import make_server

from trainfit.errors import TrainfitError
from trainfit.ui.app import create_app, new_token


def url_of(host: str, port: int, token: str | None) -> str:
    """The address a browser opens: with ``?token=`` where the UI needs one."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def serve_forever(root: Path, *, host: str, port: int, open_browser: bool, on_ready: Callable[[str], None]) -> None:
    """Serve the UI over ``root`` on ``host:port`` (0: a free port) until interrupted; ``on_ready``
    gets the URL once the port is open."""
    token = new_token()
    app = create_app(root, token=token, host=host)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request: the job pages poll
    try:  # bound here, not by Werkzeug, which prints its own lines and exits where the port is taken
        listening = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as err:
        raise TrainfitError(f"cannot serve on {host}:{port}: {err.strerror or err}",
                            "pick another --port (0: any free one)") from None
    with listening:  # Werkzeug serves on a copy of it
        port = listening.getsockname()[1]
        server = make_server(host, port, app, threaded=True, fd=listening.fileno())
    url = url_of(host, port, token)
    on_ready(url)
    if open_browser:
        webbrowser.open(url)
    server.serve_forever()
