"""Serving the UI: Werkzeug's threaded server on one port, the URL (with its token, where one is
needed) printed, and a browser opened on it unless asked not to."""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import IO

from werkzeug.serving import make_server

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.ui.app import create_app, new_token
from trainfit.ui.paths import TOKEN_PATTERN, UI_FOLDER

TOKEN_FILE = "token"
"""The UI's token, kept under ``ROOT/.trainfit-ui/`` (owner-only) from one start to the next."""

def url_of(host: str, port: int, token: str | None) -> str:
    """The address a browser opens: with ``?token=`` where the UI needs one."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def cannot_serve(host: str, port: int, err: OSError) -> TrainfitError:
    """Why the port could not be opened, naming the option to change: the host where it names no address
    of this machine (an unknown name, another machine's address), else the port (taken, or one below 1024)."""
    # a name the resolver does not know: a gaierror (its EAI_ codes are negative), re-raised by create_server as OSError
    if isinstance(err, socket.gaierror) or err.errno == errno.EADDRNOTAVAIL or (err.errno or 0) < 0:
        return TrainfitError(f"cannot serve on --host {host}: {err.strerror or err}",
                             "give an address of this machine: 127.0.0.1 (this machine only), 0.0.0.0 (every "
                             "interface) or one of its own")
    return TrainfitError(f"cannot serve on {host}:{port}: {err.strerror or err}",
                         "pick another --port (0: any free one)")


def kept_token(root: Path, given: str | None = None) -> str:
    """The token of the UI over ``root``: ``given`` (``--token``), else the one an earlier start kept
    under the root, else a new one; kept there (readable by its owner only), so that a restart of
    ``trainfit ui`` leaves the pages a browser holds open working, as its jobs go on working."""
    path = root / UI_FOLDER / TOKEN_FILE
    kept = own_token(path)
    token = given or kept or new_token()
    if token != kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        def owner_only(f: IO[bytes]) -> None:
            os.fchmod(f.fileno(), 0o600)  # before the token is in it
            f.write(token.encode() + b"\n")

        write_atomically(path, owner_only)
    return token


def own_token(path: Path) -> str | None:
    """The token kept at ``path``, where it is one this user wrote: a regular file (not through a
    link), owned by this user, readable by no one else, holding a token. None otherwise (none kept,
    or one planted or widened since, which a new token then replaces)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:  # a link where the token belongs
            return None
        raise TrainfitError(f"cannot read the UI's token {path}: {err.strerror or err}",
                            f"remove it (rm {path}) to have a new one made, or give --token") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        text = f.read(4096).decode(errors="replace").strip()
    return text if TOKEN_PATTERN.fullmatch(text) else None


def serve_forever(root: Path, *, host: str, port: int, open_browser: bool, on_ready: Callable[[str], None],
                  token: str | None = None) -> None:
    """Serve the UI over ``root`` on ``host:port`` (0: a free port) until interrupted; ``on_ready``
    gets the URL once the port is open. ``token``: the one to require (default: :func:`kept_token`'s)."""
    token = kept_token(root, token)
    app = create_app(root, token=token, host=host)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request: the job pages poll
    try:  # bound here, not by Werkzeug, which prints its own lines and exits where the port is taken
        listening = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as err:
        raise cannot_serve(host, port, err) from None
    with listening:  # Werkzeug serves on a copy of it
        port = listening.getsockname()[1]
        server = make_server(host, port, app, threaded=True, fd=listening.fileno())
    url = url_of(host, port, token)
    on_ready(url)
    if open_browser:
        webbrowser.open(url)
    server.serve_forever()
