"""A headless Chromium screenshot of the "Table topics" view, served by uvicorn against a real broker.

Needs Debian's ``chromium`` (``apt-get install chromium``); skipped without it.
The PNG is kept at ``tmp_path/table-topics.png`` (the path is printed) for a look.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dags import airflow_env

airflow_env.configure()

from tests.plugins.test_status_view import make_table_topic
from tests.support import BrokerProcess, free_port, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def view_url(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The plugin's FastAPI app on uvicorn in a thread, stopped at teardown."""
    import uvicorn
    from icefall_airflow.view import app

    monkeypatch.setenv("ICEFALL_ADMIN_URL", broker.admin_url)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/"
    wait_for(
        lambda: urllib.request.urlopen(url + "api/tables", timeout=5).status == 200,
        30,
        what="uvicorn",
    )
    yield url
    server.should_exit = True
    thread.join(10)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_screenshot_of_the_table_topics_view(
    broker: BrokerProcess, view_url: str, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    make_table_topic(broker, "page-views", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(30):
        producer.produce("page-views", value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(10) == 0
    html = urllib.request.urlopen(view_url, timeout=10).read().decode()
    assert "page-views" in html and "icefall_commit__page-views" in html

    shot = tmp_path / "table-topics.png"
    assert CHROMIUM is not None
    proc = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--window-size=1280,480",
            f"--screenshot={shot}",
            view_url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    assert png_size(shot) == (1280, 480)
    assert shot.stat().st_size > 10_000  # a rendered table, not a blank page
    print(f"screenshot: {shot}")
