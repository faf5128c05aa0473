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
    """Required of every request (``?token=`` once, then a cookie) where set: the UI serves beyond this machine."""


def ui() -> UiState:
    """The state of the app serving this request."""
    state = current_app.extensions["trainfit_ui"]
    assert isinstance(state, UiState)
    return state
