"""The commit task's way to a warm round driver (``spark_jobs/warm_driver.py``), when one is configured.

The Airflow connection ``icefall_warm_driver`` (``icefall up`` defines it as
``AIRFLOW_CONN_ICEFALL_WARM_DRIVER``: host and port of the driver, the password its token)
turns it on; without it the commit task runs the round itself (``commit_operator``: a Python
process, spark-submit when the round needs Spark). The round's arguments
are the ones spark-submit would get, and the credentials go in the request body (as they go
in spark-submit's environment, never its argv).

Only a driver that cannot be reached makes the task run the round itself
(``WarmDriverUnreachable``): a driver that is starting (it answers 503 ``starting`` while
Spark warms up: ``icefall up`` has just started it, or its supervisor restarted it) is waited
for, up to ``RESTART_WAIT_S``, rather than starting the round's own JVM beside it; a driver
that dies during a round (kill -9, a crash) is waited for (its supervisor restarts it) and the
round is asked for again, once; a round re-run with the same round id commits each record once
(``commit_round``), so neither path can write a record twice.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

WARM_DRIVER_CONN_ID = "icefall_warm_driver"
ROUND_TIMEOUT_S = 1800.0  # the commit task's execution_timeout
RESTART_WAIT_S = 180.0  # a restarted driver's JVM starts and warms up in 20-80 s on two busy cores


class WarmDriverUnreachable(RuntimeError):
    """No warm driver answers at the configured address; the message says which and why."""


class WarmDriverStarting(RuntimeError):
    """The warm driver answers, but is still starting Spark (503 ``starting``)."""


@dataclass(frozen=True)
class WarmDriverClient:
    url: str
    token: str

    @classmethod
    def from_connection(cls, conn_id: str = WARM_DRIVER_CONN_ID) -> WarmDriverClient | None:
        """The client for the connection, None when it is not defined (the task runs the round)."""
        from icefall_airflow.credentials import _connection, _mask

        connection = _connection(conn_id)
        if connection is None or not connection.host:
            return None
        token = connection.password or ""
        _mask(token)
        return cls(f"http://{connection.host}:{connection.port or 80}", token)

    def _call(self, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
        request = urllib.request.Request(
            self.url + path,
            method="GET" if body is None else "POST",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            if exc.code == 503 and _status(detail) == "starting":
                raise WarmDriverStarting(f"the warm driver at {self.url} is starting") from exc
            raise RuntimeError(f"warm driver at {self.url} answered {exc.code}: {detail}") from exc

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        """The driver's health answer; ``WarmDriverStarting`` while it warms up,
        ``WarmDriverUnreachable`` when nothing (or a dead JVM) answers."""
        from spark_jobs.warm_driver import HEALTH_PATH

        try:
            answer: dict[str, Any] = self._call(HEALTH_PATH, None, timeout)
        except WarmDriverStarting:
            raise
        except (OSError, http.client.HTTPException, RuntimeError) as exc:
            raise WarmDriverUnreachable(f"no warm driver answers at {self.url}: {exc}") from exc
        return answer

    def wait_healthy(self, timeout: float) -> bool:
        """True once the driver answers warm, False if it did not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.health()
            except (WarmDriverUnreachable, WarmDriverStarting):
                if time.monotonic() > deadline:
                    return False
                time.sleep(1.0)
            else:
                return True

    def prestage(self, args: list[str], env: dict[str, str], timeout: float = 5.0) -> str:
        """Ask the driver to write the round's rows ahead, as the broker flushes them
        (``spark_jobs.prestage``): ``args`` are the round's, with ``--until-append-time`` its
        interval's end. The driver's answer in words; errors as the calls' (the caller goes on
        without: the round then reads everything itself)."""
        from spark_jobs.warm_driver import PRESTAGE_PATH

        answer = self._call(PRESTAGE_PATH, {"args": args, "env": env}, timeout)
        return str(answer.get("status")) if isinstance(answer, dict) else str(answer)

    def run_round(
        self, args: list[str], env: dict[str, str], log: Any
    ) -> tuple[int, dict[str, Any]]:
        """The round's exit code and result JSON; ``WarmDriverUnreachable`` when no driver answers
        (before the round, or after it died during the round and did not come back)."""
        from spark_jobs.warm_driver import ROUNDS_PATH, WarmRoundReply

        try:
            self.health()
        except WarmDriverStarting as exc:
            log.info(
                "%s; waiting up to %.0f s for it (rather than a JVM of the round's own beside it)",
                exc,
                RESTART_WAIT_S,
            )
            if not self.wait_healthy(RESTART_WAIT_S):
                raise WarmDriverUnreachable(
                    f"the warm driver at {self.url} was not warm within {RESTART_WAIT_S:.0f} s"
                ) from exc
        body = {"args": args, "env": env}
        for attempt in (1, 2):
            try:
                answer = self._call(ROUNDS_PATH, body, ROUND_TIMEOUT_S)
            except (OSError, http.client.HTTPException, WarmDriverStarting) as exc:
                # WarmDriverStarting: it died after the health check and its restart is
                # warming up; no round ran, so asking again once it is warm is safe
                if attempt == 2:
                    raise WarmDriverUnreachable(
                        f"the warm driver at {self.url} died during the round twice: {exc}"
                    ) from exc
                log.warning(
                    "the warm driver at %s died during the round (%s); waiting up to %.0f s for "
                    "it to restart, then asking again (a re-run round commits each record once)",
                    self.url,
                    exc,
                    RESTART_WAIT_S,
                )
                if not self.wait_healthy(RESTART_WAIT_S):
                    raise WarmDriverUnreachable(
                        f"the warm driver at {self.url} died during the round and did not come "
                        f"back within {RESTART_WAIT_S:.0f} s"
                    ) from exc
            else:
                reply = WarmRoundReply.model_validate(answer)
                return reply.exit_code, reply.result
        raise AssertionError("unreachable")


def _status(body: str) -> str | None:
    """The ``status`` of a JSON error body, None when it has none."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer.get("status") if isinstance(answer, dict) else None
