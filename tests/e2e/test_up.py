"""`icefall up`: the whole system starts, the demo producer writes, Ctrl-C stops every process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.support import REPO, free_port, wait_for


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_up_runs_demo_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kafka, admin, registry, catalog = free_port(), free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker.cli", "up", "--home", str(home), "--kafka-port", str(kafka),
         "--admin-port", str(admin), "--registry-port", str(registry), "--catalog-port", str(catalog),
         "--demo-rate", "200"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        ready = home / "broker.ready"
        broker_pid = int(wait_for(lambda: ready.exists() and ready.read_text().strip(), 60, what="broker ready"))

        def demo_records() -> int:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/v1/topics/clicks/offsets", timeout=5) as r:
                return sum(p["high_watermark"] for p in json.loads(r.read())["partitions"])

        wait_for(lambda: demo_records() >= 50, 60, what="the demo producer to write 50 records")
        with urllib.request.urlopen(f"http://127.0.0.1:{registry}/subjects/clicks-value/versions/latest",
                                    timeout=5) as r:
            assert "user_id" in json.loads(r.read())["schema"]
        manifest = json.loads((home / "table_topics.json").read_text())
        assert [t["topic"] for t in manifest["table_topics"]] == ["clicks"]

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        output = proc.stdout.read().decode() if proc.stdout else ""
        assert "Icefall is up" in output and "stopping" in output
        wait_for(lambda: not _pid_alive(broker_pid), 30, what="the broker to exit")
        assert "Traceback" not in output, output[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
