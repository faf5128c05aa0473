"""What every request handler of the UI shares: the root, its jobs and the access token, kept on the
Flask app (one app per root)."""

from __future__ import annotations

import dataclasses

from flask import current_app

from trainfit.ui.jobs import Jobs
from trainfit.ui.paths import Root


@dataclasses.dataclass(frozen=True, kw_only=True)
class UiState:
    root: Root
    jobs: Jobs
    token: str | None
    """Required of every request (``?token=`` once, then a cookie) where set (``trainfit ui`` always sets one)."""
    host: str = "127.0.0.1"
    """The address served: on a loopback one, requests naming another host are refused."""


def ui() -> UiState:
    """The state of the app serving this request."""
    state = current_app.extensions["trainfit_ui"]
    assert isinstance(state, UiState)
    return state
