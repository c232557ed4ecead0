"""The warm round driver's request checks (``spark_jobs/warm_driver.py``) over its real HTTP
handler, before any round runs (so no Spark session is needed): flags it sets itself are
refused whatever their spelling, and a malformed body's error names what is wrong without
echoing the values (the body carries credentials; the client raises the error into the task
log). Rounds through the driver: tests/e2e/test_airflow_warm_driver.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from spark_jobs import warm_driver
from tests.support import free_port, serving, wait_for

TOKEN = "t0ken"


@pytest.fixture(scope="module")
def driver_url() -> Iterator[str]:
    handler = warm_driver.handler(warm_driver.WarmDriver(spark=None), TOKEN)
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), handler)) as url:
        yield url


def post(url: str, body: bytes, path: str = warm_driver.ROUNDS_PATH) -> tuple[int, str]:
    request = urllib.request.Request(
        url + path,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["error"]


def test_refused_flags_cannot_be_abbreviated(driver_url: str) -> None:
    for spelling in (["--mast", "local[1]"], ["--maste=local[1]"], ["--res", "/tmp/r.json"]):
        body = json.dumps({"args": ["--topic", "t", *spelling], "env": {}}).encode()
        status, error = post(driver_url, body)
        assert status == 400, (spelling, error)
        assert "not commit_round arguments" in error or "itself" in error, error


def test_a_malformed_body_is_not_echoed(driver_url: str) -> None:
    secret = "hunter2-secret"
    for body in (
        {"args": ["--topic", "t"], "env": {"ICEFALL_REGISTRY_USER_INFO": 12345}, "x": secret},
        {"args": secret, "env": {"ICEFALL_CATALOG_CREDENTIAL": f"id:{secret}"}},
        {"args": ["--topic", "t"], "env": {"K": [secret]}},
    ):
        status, error = post(driver_url, json.dumps(body).encode())
        assert status == 400 and error.startswith("not a WarmRoundRequest: "), error
        assert secret not in error and "12345" not in error, error
    status, error = post(driver_url, f'{{"args": ["{secret}"'.encode())  # cut-off JSON
    assert status == 400 and secret not in error, error


def test_a_prestage_request_names_what_it_lacks(driver_url: str) -> None:
    """``POST /v1/prestage`` takes a round's arguments with the end of its interval, at most a
    minute ahead; the flags a round may not carry are refused there too."""
    path = warm_driver.PRESTAGE_PATH
    ahead = str(int(time.time() * 1000) + 3_600_000)
    for args, reason in (
        (["--topic", "t"], "needs --until-append-time"),
        (["--topic", "t", "--until-append-time", ahead], "at most 60 s ahead"),
        (["--topic", "t", "--until-append-time", "1", "--master", "local"], "sets --master"),
    ):
        status, error = post(driver_url, json.dumps({"args": args}).encode(), path)
        assert status == 400 and reason in error, (args, error)
    assert post(driver_url, b"{}", "/v1/nosuch")[0] == 404


def get_health(url: str, token: str = TOKEN) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        url + warm_driver.HEALTH_PATH, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_starting_driver_answers_starting_until_it_is_warm() -> None:
    slot = warm_driver.DriverSlot()  # what main() serves while Spark starts
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), warm_driver.handler(slot, TOKEN))) as url:
        assert get_health(url, "wrong")[0] == 401  # the token is checked first, as always
        assert get_health(url) == (503, {"status": "starting", "error": warm_driver.STARTING})
        body = json.dumps({"args": ["--topic", "t"], "env": {}}).encode()
        assert post(url, body) == (503, warm_driver.STARTING)  # no round runs yet
        slot.driver = warm_driver.WarmDriver(spark=None)  # warm (here: a driver without Spark)
        status, answer = get_health(url)
        assert status == 503 and answer == {"error": "the Spark JVM is gone"}
        assert post(url, b'{"args": 1}')[0] == 400  # requests now reach the driver


def test_a_driver_that_never_gets_warm_exits_for_a_fresh_start() -> None:
    """``main()`` listens before Spark starts (503 "starting"), and a start that is not warm by
    its deadline exits with code 4 for the supervisor to start a new one. Spark's start is
    replaced by a sleep that never ends, the deadline cut to 2 s."""
    port = free_port()
    script = textwrap.dedent(
        f"""
        import time
        from spark_jobs import commit_round, warm_driver
        warm_driver.STARTUP_DEADLINE_S = 2.0
        commit_round.spark_session = lambda *args, **kwargs: time.sleep(600)
        raise SystemExit(warm_driver.main(["--port", "{port}"]))
        """
    )
    env = {**os.environ, warm_driver.TOKEN_ENV: TOKEN}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"

        def starting() -> bool:
            try:
                return get_health(url)[1].get("status") == "starting"
            except OSError:
                return False  # not listening yet

        wait_for(starting, 30, what="the driver to answer starting")
        assert proc.wait(30) == warm_driver.NOT_WARM_EXIT
        assert proc.stderr is not None
        assert b"not warm within 2 s; exiting for a fresh start" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
