"""`icefall up`: the whole system starts (broker, Airflow), the demo producer writes, a
commit round puts rows in the demo table, and Ctrl-C stops every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, free_port, wait_for


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _processes_with_home(home: Path) -> set[int]:
    """Every process that inherited this run's ICEFALL_HOME (Airflow components, workers, Spark JVMs)."""
    marker = f"ICEFALL_HOME={home}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        data: dict[str, object] = json.loads(response.read())
        return data


@pytest.mark.timeout(900)
def test_up_runs_demo_airflow_commits_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    kafka, admin, registry, catalog, airflow = free_port(), free_port(), free_port(), free_port(), free_port()
    env = {**os.environ, "ICEFALL_AIRFLOW_PORT": str(airflow), "ICEFALL_DEMO_COMMIT_INTERVAL_MS": "20000",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    out_path = tmp_path / "up.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "up", "--home", str(home), "--kafka-port", str(kafka),
             "--admin-port", str(admin), "--registry-port", str(registry), "--catalog-port", str(catalog),
             "--demo-rate", "200"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )
    started: set[int] = set()
    try:
        ready = home / "broker.ready"
        broker_pid = int(str(wait_for(lambda: ready.exists() and ready.read_text().strip(), 60, what="broker ready")))

        def demo_records() -> int:
            answer: Any = _get_json(f"http://127.0.0.1:{admin}/v1/topics/clicks/offsets")
            return sum(int(p["high_watermark"]) for p in answer["partitions"])

        wait_for(lambda: demo_records() >= 50, 60, what="the demo producer to write 50 records")
        schema = _get_json(f"http://127.0.0.1:{registry}/subjects/clicks-value/versions/latest")["schema"]
        assert "user_id" in str(schema)
        manifest = json.loads((home / "table_topics.json").read_text())
        assert [t["topic"] for t in manifest["table_topics"]] == ["clicks"]

        wait_for(lambda: "Icefall is up" in out_path.read_text(), 300, interval=0.5,
                 what=f"Airflow to start (output: {out_path})")
        output = out_path.read_text()
        assert f"http://127.0.0.1:{airflow}" in output and "login admin / " in output

        def table_rows() -> int:
            answer: Any = _get_json(f"http://127.0.0.1:{airflow}/icefall/api/tables")
            [row] = answer["tables"]
            started.update(_processes_with_home(home))
            return int(row["rows"] or 0)

        rows = wait_for(table_rows, 420, interval=2, what="a commit round to put rows in default.clicks")
        assert rows > 0
        assert (home / "airflow" / "airflow.db").exists()

        started.update(_processes_with_home(home))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
        output = out_path.read_text()
        assert "stopping" in output
        wait_for(lambda: not _pid_alive(broker_pid), 30, what="the broker to exit")
        wait_for(lambda: not any(_pid_alive(p) for p in started), 30,
                 what=f"every process up started to exit: {sorted(p for p in started if _pid_alive(p))}")
        assert _processes_with_home(home) == set()
        assert "Traceback" not in output, output[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid in _processes_with_home(home):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
