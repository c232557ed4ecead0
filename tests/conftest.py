from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import BrokerProcess, free_port, wait_for


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """Start brokers with extra flags; every one started is stopped at teardown."""
    started: list[BrokerProcess] = []

    def make(
        extra_args: list[str] | None = None, env: dict[str, str] | None = None, name: str = "home"
    ) -> BrokerProcess:
        broker = BrokerProcess(tmp_path / name, extra_args, env)
        started.append(broker)
        return broker.start()

    yield make
    for broker in started:
        with contextlib.suppress(Exception):  # a broker that failed to start or already died
            broker.stop()


@pytest.fixture
def broker(broker_factory: object) -> BrokerProcess:
    assert callable(broker_factory)
    result: BrokerProcess = broker_factory(["--segment-flush-ms", "200"])
    return result


# ---------------------------------------------------------------- S3 (moto)

MOTO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


class MotoS3:
    """moto's S3 server in its own process group on a free port, so broker
    subprocesses can reach it. State is in memory: it dies with the process."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **MOTO_CREDENTIALS},
            )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The AWS_* variables a broker needs to use this server (or ``endpoint``, a proxy in front of it)."""
        return {"AWS_ENDPOINT_URL": endpoint or self.endpoint, **MOTO_CREDENTIALS}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def wait_ready(self, timeout: float = 30.0) -> None:
        def answers() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"moto server exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            with urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=2) as resp:
                return bool(resp.status == 200)

        wait_for(answers, timeout, interval=0.1, what=f"moto server on {self.endpoint} (log: {self.log_path})")

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    """One moto S3 server for the session, killed at its end; tests keep apart by using their own bucket."""
    server = MotoS3(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> str:
    """A fresh, empty bucket on the session's moto server."""
    name = f"icefall-{uuid.uuid4().hex[:12]}"
    moto_s3.client().create_bucket(Bucket=name)
    return name
