"""The commit round's view of the broker: its admin API and schema registry, over plain HTTP.

The round needs only the admin URL: ``GET /v1/cluster`` names the registry,
the catalog and the object store. Plain ``urllib`` (no client library) so the
same code runs on the driver and on executors of any Spark cluster.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from broker.topic_configs import ENABLE, TableSettings

DEFAULT_TIMEOUT_S = 30.0


class BrokerRequestError(RuntimeError):
    """The broker answered with an error, or not at all; the message says which URL and why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def http_json(url: str, method: str = "GET", body: Any = None, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise BrokerRequestError(f"{method} {url}: HTTP {exc.code}: {detail}", exc.code) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise BrokerRequestError(f"{method} {url}: {exc}") from exc


@dataclass(frozen=True)
class TableTopic:
    """One entry of the broker's table-topic manifest."""

    topic: str
    topic_id: str
    partitions: int
    namespace: str
    table: str
    commit_interval_ms: int
    configs: dict[str, str]

    @property
    def settings(self) -> TableSettings:
        """The topic's ``automq.table.topic.*`` configs, typed (``broker.topic_configs``)."""
        return TableSettings(self.configs)

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.table)


class AdminClient:
    def __init__(self, admin_url: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = admin_url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, **query: Any) -> Any:
        qs = ("?" + urllib.parse.urlencode(query)) if query else ""
        return http_json(self.url + path + qs, timeout=self.timeout)

    def cluster(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.get("/v1/cluster")
        return answer

    def table_topic(self, topic: str) -> TableTopic:
        manifest = self.get("/v1/table-topics")
        for entry in manifest["table_topics"]:
            if entry["topic"] == topic:
                return TableTopic(entry["topic"], entry["topic_id"], int(entry["partitions"]), entry["namespace"],
                                  entry["table"], int(entry["commit_interval_ms"]), dict(entry["configs"]))
        raise BrokerRequestError(f"topic {topic!r} is not a table topic (set {ENABLE}=true)", 404)

    def plan(self, topic: str, until_append_ms: int | None) -> dict[str, Any]:
        quoted = urllib.parse.quote(topic, safe="")
        if until_append_ms is None:
            answer: dict[str, Any] = self.get(f"/v1/topics/{quoted}/plan")
        else:
            answer = self.get(f"/v1/topics/{quoted}/plan", until_append_ms=until_append_ms)
        return answer

    def flushed_plan(self, topic: str, until_append_ms: int | None, deadline_s: float = 60.0) -> dict[str, Any]:
        """The plan, once every offset it names is in segment objects (asks the broker to flush)."""
        give_up = time.monotonic() + deadline_s
        while True:
            if until_append_ms is None:
                http_json(self.url + "/v1/flush", method="POST", body={}, timeout=self.timeout)
            plan = self.plan(topic, until_append_ms)
            if all(p["flushed"] for p in plan["partitions"]):
                return plan
            if time.monotonic() > give_up:
                behind = [p["partition"] for p in plan["partitions"] if not p["flushed"]]
                raise BrokerRequestError(f"the broker has not flushed partitions {behind} of {topic} "
                                         f"within {deadline_s:.0f} s")
            http_json(self.url + "/v1/flush", method="POST", body={}, timeout=self.timeout)
            time.sleep(0.1)  # the flush above already ran; this only spaces out re-plans

    def ranges(self, topic: str, partition: int, start: int, end: int) -> dict[str, Any]:
        quoted = urllib.parse.quote(topic, safe="")
        answer: dict[str, Any] = self.get(f"/v1/topics/{quoted}/partitions/{partition}/ranges", start=start, end=end)
        return answer


class RegistryClient:
    """Schema lookups by id and by subject, cached (schemas under an id never change)."""

    def __init__(self, registry_url: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = registry_url.rstrip("/")
        self.timeout = timeout
        self._by_id: dict[int, dict[str, Any]] = {}

    def schema(self, schema_id: int) -> dict[str, Any]:
        """``{"schema": text, "schemaType": ...}`` of an id."""
        found = self._by_id.get(schema_id)
        if found is None:
            found = http_json(f"{self.url}/schemas/ids/{schema_id}", timeout=self.timeout)
            assert isinstance(found, dict)
            self._by_id[schema_id] = found
        return found

    def avro_schema(self, schema_id: int) -> str:
        """The Avro schema text of an id; a non-Avro schema is an error (the round decodes Avro)."""
        found = self.schema(schema_id)
        kind = found.get("schemaType", "AVRO")
        if kind != "AVRO":
            raise ValueError(f"schema id {schema_id} is {kind}, not AVRO")
        return str(found["schema"])

    def subject_versions(self, subject: str) -> list[tuple[int, str]]:
        """(id, Avro schema text) of every version of ``subject``, oldest first; [] for an unknown subject."""
        quoted = urllib.parse.quote(subject, safe="")
        try:
            versions = http_json(f"{self.url}/subjects/{quoted}/versions", timeout=self.timeout)
        except BrokerRequestError as exc:
            if exc.status == 404:
                return []
            raise
        out = []
        for version in sorted(versions):
            entry = http_json(f"{self.url}/subjects/{quoted}/versions/{version}", timeout=self.timeout)
            if entry.get("schemaType", "AVRO") != "AVRO":
                continue
            self._by_id[int(entry["id"])] = {"schema": entry["schema"], "schemaType": "AVRO"}
            out.append((int(entry["id"]), str(entry["schema"])))
        return out

    def known(self) -> dict[int, str]:
        """Every Avro schema fetched so far, by id: shipped to executors so they rarely ask."""
        return {i: str(s["schema"]) for i, s in self._by_id.items() if s.get("schemaType", "AVRO") == "AVRO"}
