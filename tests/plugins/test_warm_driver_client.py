"""The commit task's client of the warm round driver (``icefall_airflow.warm_driver``) against
the driver's real HTTP handler: a driver that is starting is waited for (not a spark-submit
fallback, a second JVM beside the warming one); one that does not get warm in time, or that
nothing answers for, is ``WarmDriverUnreachable`` (the task falls back)."""

from __future__ import annotations

import logging
import threading
from http.server import ThreadingHTTPServer

import pytest
from icefall_airflow import warm_driver as client_module
from icefall_airflow.warm_driver import (
    WarmDriverClient,
    WarmDriverStarting,
    WarmDriverUnreachable,
)

from spark_jobs import warm_driver
from tests.support import free_port, serving

TOKEN = "t0ken"
log = logging.getLogger("test.warm_driver_client")


class AnsweringDriver(warm_driver.WarmDriver):
    """A warm driver whose rounds answer at once (no Spark): the requests it got."""

    def __init__(self) -> None:
        super().__init__(spark=None)
        self.requests: list[warm_driver.WarmRoundRequest] = []

    def jvm_alive(self) -> bool:
        return True

    def run_round(self, request: warm_driver.WarmRoundRequest) -> warm_driver.WarmRoundReply:
        self.requests.append(request)
        self.rounds += 1
        return warm_driver.WarmRoundReply(exit_code=0, result={"status": "committed"})


def test_a_round_waits_for_a_starting_driver(caplog: pytest.LogCaptureFixture) -> None:
    slot = warm_driver.DriverSlot()
    driver = AnsweringDriver()
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), warm_driver.handler(slot, TOKEN))) as url:
        client = WarmDriverClient(url, TOKEN)
        with pytest.raises(WarmDriverStarting):
            client.health()
        warm = threading.Timer(1.5, lambda: setattr(slot, "driver", driver))
        warm.start()
        try:
            with caplog.at_level(logging.INFO, logger=log.name):
                code, result = client.run_round(["--topic", "t"], {}, log)
        finally:
            warm.cancel()
        assert (code, result) == (0, {"status": "committed"})
        assert [r.args for r in driver.requests] == [["--topic", "t"]]  # asked once it was warm
        assert "is starting; waiting up to" in caplog.text


def test_a_driver_not_warm_in_time_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "RESTART_WAIT_S", 1.0)
    slot = warm_driver.DriverSlot()
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), warm_driver.handler(slot, TOKEN))) as url:
        client = WarmDriverClient(url, TOKEN)
        with pytest.raises(WarmDriverUnreachable, match="was not warm within 1 s"):
            client.run_round(["--topic", "t"], {}, log)


def test_nothing_listening_is_unreachable_at_once() -> None:
    client = WarmDriverClient(f"http://127.0.0.1:{free_port()}", TOKEN)
    with pytest.raises(WarmDriverUnreachable, match="no warm driver answers"):
        client.run_round(["--topic", "t"], {}, log)
    assert client.wait_healthy(0.5) is False


def test_a_wrong_token_is_no_starting_driver() -> None:
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), warm_driver.handler(warm_driver.DriverSlot(), TOKEN)
    )
    with serving(server) as url, pytest.raises(WarmDriverUnreachable, match="answered 401"):
        WarmDriverClient(url, "wrong").health()
