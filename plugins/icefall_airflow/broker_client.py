"""A small client of the broker's admin API (JSON over HTTP).

Only tasks and the status view call it, never DAG parsing. urllib keeps it
free of dependencies so it runs the same in a task, the API server and tests.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class BrokerError(RuntimeError):
    """The admin API answered with an error, or could not be reached."""


class BrokerClient:
    def __init__(self, admin_url: str, timeout: float = 10.0) -> None:
        self.admin_url = admin_url.rstrip("/")
        self.timeout = timeout

    def _call(self, path: str, method: str = "GET") -> dict[str, Any]:
        request = urllib.request.Request(self.admin_url + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                data: dict[str, Any] = json.loads(response.read())
                return data
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            raise BrokerError(f"{method} {self.admin_url}{path}: HTTP {exc.code}: {body}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise BrokerError(f"{method} {self.admin_url}{path}: {exc}") from exc

    def cluster(self) -> dict[str, Any]:
        return self._call("/v1/cluster")

    def table_topics(self) -> dict[str, Any]:
        return self._call("/v1/table-topics")

    def offsets(self, topic: str) -> dict[str, Any]:
        return self._call(f"/v1/topics/{urllib.parse.quote(topic)}/offsets")

    def plan(self, topic: str, until_append_ms: int | None) -> dict[str, Any]:
        query = "" if until_append_ms is None else f"?until_append_ms={int(until_append_ms)}"
        return self._call(f"/v1/topics/{urllib.parse.quote(topic)}/plan{query}")

    def ranges(self, topic: str, partition: int, start: int, end: int) -> dict[str, Any]:
        return self._call(f"/v1/topics/{urllib.parse.quote(topic)}/partitions/{partition}/ranges"
                          f"?start={start}&end={end}")

    def pending(self, topic: str, since: dict[str, int] | None = None) -> dict[str, Any]:
        """Records and bytes waiting for the topic's table (past ``since`` when given)."""
        query = urllib.parse.urlencode({"from": json.dumps(since or {})})
        return self._call(f"/v1/topics/{urllib.parse.quote(topic, safe='')}/pending?{query}")

    def flush(self) -> dict[str, Any]:
        return self._call("/v1/flush", method="POST")
