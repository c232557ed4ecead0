"""The warm round driver (``spark_jobs/warm_driver.py``) as ``icefall up`` runs it: started
beside the broker, restarted when it exits (a crash, kill -9, a dead JVM), stopped with the rest.

Its token is new at every ``icefall up`` and reaches the driver and the Airflow components in
their environment only (``ps`` shows neither): Airflow finds the driver through the connection
``icefall_warm_driver`` (``AIRFLOW_CONN_ICEFALL_WARM_DRIVER``), which the commit tasks use
instead of a process per round. ``ICEFALL_NO_WARM_DRIVER=1`` leaves it out (the tasks then run
each round as a Python process, spark-submitted when it needs Spark);
``ICEFALL_WARM_DRIVER_PORT`` fixes its loopback port (default: a free one);
``ICEFALL_WARM_DRIVER_MASTER`` its Spark master (default ``local[*]``). ``icefall up`` reads
the three (``up_settings``) and hands ``WarmDriverProcess`` the port and master.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

from spark_jobs.warm_driver import HEALTH_PATH, TOKEN_ENV

CONN_ENV = "AIRFLOW_CONN_ICEFALL_WARM_DRIVER"
DISABLE_ENV = (
    "ICEFALL_NO_WARM_DRIVER"  # read by broker.supervisor.up_settings, as its port and master
)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie, which nobody may reap once its
    parent is gone, does not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # fields after the command (which may hold spaces): state, ppid, pgrp
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class WarmDriverProcess:
    """One warm driver process group, with its log in ``log_dir/warm-driver.log``."""

    def __init__(
        self, env: dict[str, str], log_dir: Path, port: int | None = None, master: str = "local[*]"
    ) -> None:
        self.port = port or _free_port()
        self.master = master
        self.token = secrets.token_urlsafe(32)
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**env, TOKEN_ENV: self.token}
        self.log_path = log_dir / "warm-driver.log"
        self.ready = log_dir / "warm-driver.ready"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def airflow_connection(self) -> dict[str, str]:
        """The environment that makes Airflow's commit tasks use this driver."""
        conn = {"conn_type": "http", "host": "127.0.0.1", "port": self.port, "password": self.token}
        return {CONN_ENV: json.dumps(conn)}

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready.unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            "spark_jobs.warm_driver",
            "--port",
            str(self.port),
            "--master",
            self.master,
            "--ready-file",
            str(self.ready),
        ]
        log: IO[bytes]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def check(self) -> bool:
        """Start it again if it exited (its JVM and Python workers go with its process group);
        True when it did."""
        if self.proc is None or self.proc.poll() is None:
            return False
        code = self.proc.returncode
        self._kill_group(signal.SIGKILL)
        self.restarts += 1
        print(
            f"icefall: the warm round driver exited with code {code}; restarting it "
            f"(log: {self.log_path})",
            file=sys.stderr,
            flush=True,
        )
        self.start()
        return True

    def healthy(self) -> bool:
        request = urllib.request.Request(
            self.url + HEALTH_PATH, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the warm round driver exited; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the warm round driver did not answer within {timeout:g} s")
            time.sleep(0.5)

    def _kill_group(self, signum: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM to the process group, then wait (up to ``timeout``) for every process in it,
        not only the Python driver, which exits at once: its JVM runs Spark's shutdown hooks,
        which delete the driver's ``spark-*`` and ``blockmgr-*`` directories (~100 MB of jars
        each) from its temporary directory. A SIGKILL as soon as the Python process was gone
        cut them short and left those behind at every stop. SIGKILL whatever is left."""
        if self.proc is None:
            return
        deadline = time.monotonic() + timeout
        self._kill_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        while _group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._kill_group(signal.SIGKILL)  # the JVM and Python workers share the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.ready.unlink(missing_ok=True)
