"""A real PostgreSQL server for tests: Debian's ``postgresql`` package (``make system-deps``),
a fresh cluster in a temporary directory, on a free port, stopped and removed at the end.

``initdb`` refuses to run as root, so under root the cluster belongs to the
``postgres`` user the package creates. fsync is off: the tests are about what
the broker writes, not about Postgres surviving a power cut.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import free_port


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(f"{name} not found: install Debian's postgresql (make system-deps)")
    return found


class PostgresServer:
    USER = "icefall"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="icefall-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, text=True, timeout=120)

    def _pg_ctl_start(self) -> None:
        """Start the server on the existing data directory, on this server's port and
        socket directory: shared by ``start`` and ``resume`` so a resumed server is the
        same one the broker was configured with."""
        self._run(
            _binary("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "postgres.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )

    def start(self) -> PostgresServer:
        try:
            self._run(
                _binary("initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                self.USER,
                "-E",
                "UTF8",
                "--no-sync",
            )
            self._pg_ctl_start()
            self.started = True
        except BaseException:
            self.stop()
            raise
        return self

    def uri(self, database: str = "postgres") -> str:
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.uri(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.uri(name)

    def log_text(self) -> str:
        path = self.root / "postgres.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pause(self) -> None:
        """Stop the server, keeping its data (``resume`` starts it again on the same port):
        the database unreachable for a while."""
        self._run(_binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def resume(self) -> None:
        self._pg_ctl_start()

    def stop(self) -> None:
        if self.started:
            subprocess.run(
                [*self._as, _binary("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
                check=False,
                capture_output=True,
                timeout=120,
            )
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """One server for a test module (import it there): tests keep apart by creating their own
    databases (``create_database``), and starting a cluster is the slow part."""
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()
