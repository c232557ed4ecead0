"""The commit task's client of the warm round driver (``icefall_airflow.warm_driver``) against
the driver's real HTTP handler: a driver that is starting is waited for (not a spark-submit
fallback, a second JVM beside the warming one); one that does not get warm in time, or that
nothing answers for, is ``WarmDriverUnreachable`` (the task falls back)."""

from __future__ import annotations

import logging
import threading
from http.server import ThreadingHTTPServer
from typing import Any

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


def test_a_round_asked_of_a_restarting_driver_is_asked_again_once_warm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver answered the health check, then died and its restart is warming up when the
    round's request comes: the request is answered "starting", no round ran, and the round is
    asked again once the new driver is warm (neither a failed task nor a fallback)."""
    driver = AnsweringDriver()
    slot = warm_driver.DriverSlot(driver)
    health = WarmDriverClient.health
    restarts: list[threading.Timer] = []

    def health_then_restart(self: WarmDriverClient, timeout: float = 5.0) -> dict[str, Any]:
        answer = health(self, timeout)
        if not restarts:  # the first check passes; then the driver is restarting for ~1 s
            slot.driver = None
            restarts.append(threading.Timer(1.0, lambda: setattr(slot, "driver", driver)))
            restarts[0].start()
        return answer

    monkeypatch.setattr(WarmDriverClient, "health", health_then_restart)
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), warm_driver.handler(slot, TOKEN))) as url:
        code, result = WarmDriverClient(url, TOKEN).run_round(["--topic", "t"], {}, log)
    assert (code, result) == (0, {"status": "committed"})
    assert len(driver.requests) == 1  # the round ran once, in the warm driver
