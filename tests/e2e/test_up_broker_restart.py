"""``icefall up`` when its broker exits by itself (here ``kill -9``): the supervisor says so,
starts it again on the same home and ports, and the demo producer carries on; Ctrl-C still
stops everything. Without Airflow (``ICEFALL_NO_AIRFLOW``): only the broker's supervision is
under test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.e2e.test_up import _pid_alive, _processes_with_home
from tests.support import REPO, free_port, wait_for


def test_up_restarts_a_broker_that_exits(tmp_path: Path) -> None:
    home = tmp_path / "home"
    admin = free_port()
    ports = ["--kafka-port", str(free_port()), "--admin-port", str(admin)]
    ports += ["--registry-port", str(free_port()), "--catalog-port", str(free_port())]
    out_path = tmp_path / "up.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "up", "--home", str(home), "--demo-rate", "100"]
            + ports,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "ICEFALL_NO_AIRFLOW": "1"},
        )
    ready = home / "broker.ready"

    def broker_pid() -> int:
        text = ready.read_text().strip() if ready.exists() else ""
        return int(text) if text else 0

    def demo_records() -> int:
        url = f"http://127.0.0.1:{admin}/v1/topics/clicks/offsets"
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.loads(response.read())
        return sum(int(p["high_watermark"]) for p in answer["partitions"])

    try:
        first = wait_for(broker_pid, 60, what="the broker to start")
        before = wait_for(lambda: (n := demo_records()) >= 20 and n, 60, what="demo records")
        os.kill(first, signal.SIGKILL)
        second = wait_for(
            lambda: (pid := broker_pid()) not in (0, first) and pid, 60, what="a new broker"
        )
        wait_for(lambda: demo_records() >= before + 20, 60, what="the demo producer to go on")
        assert proc.poll() is None, out_path.read_text()[-3000:]
        output = out_path.read_text()
        assert "the broker exited with code -9; restarting it" in output, output[-3000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, out_path.read_text()[-3000:]
        wait_for(lambda: not _pid_alive(second), 30, what="the new broker to exit")
        assert _processes_with_home(home) == set()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid in _processes_with_home(home):  # the broker runs in a process group of its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
