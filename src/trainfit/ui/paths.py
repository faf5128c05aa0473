"""The root folder the UI serves, and the one check every path from a request goes through: it is
resolved (``..`` and links followed) and refused unless it lies inside the root."""

from __future__ import annotations

from pathlib import Path

from trainfit.errors import TrainfitError

UI_FOLDER = ".trainfit-ui"
"""The UI's own records under the root: ``jobs/<id>/`` (each job's record and log), saved specs."""


class Refused(TrainfitError):
    """A request named a path the UI will not touch; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, hint: str | None = None, *, status: int = 403) -> None:
        super().__init__(message, hint)
        self.status = status


class Root:
    """The folder the UI works in: run folders, specs and the UI's jobs all live under it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise TrainfitError(f"{path} is not a folder", "give --root a folder (default: the current folder)")

    @property
    def jobs(self) -> Path:
        """Where each job's folder is made."""
        return self.path / UI_FOLDER / "jobs"

    def inside(self, relative: str, *, must_exist: bool = True) -> Path:
        """``relative`` (a path from a request, relative to the root) resolved, or :class:`Refused`:
        403 outside the root (an absolute path, ``..``, a link out), 404 where nothing is there."""
        if not relative or "\x00" in relative:
            raise Refused("no path given", "pick a file or folder under the root", status=404)
        path = (self.path / relative).resolve()
        if path != self.path and self.path not in path.parents:
            raise Refused(f"{relative} is outside the UI's root {self.path}",
                          "only files and folders under the root can be opened; start `trainfit ui --root` higher up")
        hidden = [part for part in path.relative_to(self.path).parts if part.startswith(".")]
        if hidden not in ([], [UI_FOLDER]):  # checked where the path leads: a link to .env is .env
            raise Refused(f"{relative} is a hidden file or lies in a hidden folder",
                          "the UI opens run folders and specs, not dot-files (.env, .git, .ssh)")
        if must_exist and not path.exists():
            raise Refused(f"{relative} does not exist under {self.path}", "pick one the page lists", status=404)
        return path

    def relative(self, path: Path) -> str:
        """``path`` (under the root) as the root-relative text a URL carries."""
        return path.resolve().relative_to(self.path).as_posix()
