"""The one client of the broker's admin API (JSON over HTTP), for the Airflow plugin and the Spark jobs.

There used to be two, one per caller, and they had drifted: one quoted a topic
name with ``/`` left as is (``a/b`` asked for the wrong path), the other did
not. Now both callers use this one, and every answer is parsed into the model
the broker built it from (``broker.contracts``), so a renamed field fails here,
loudly, instead of as a ``KeyError`` deep in a task.

Plain ``urllib`` (no client library): the same code runs on the Spark driver
and executors of any cluster, in Airflow tasks, its triggerer and its API
server, and in tests.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from broker import contracts
from broker.http_security.client import admin_user_info, basic_auth_header
from broker.topic_configs import ENABLE

DEFAULT_TIMEOUT_S = 30.0


class BrokerError(RuntimeError):
    """The broker answered with an error, or not at all; the message says which URL and why
    (``status``: the HTTP status, None when there was no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


BrokerRequestError = BrokerError  # the Spark jobs' name for it


def http_json(
    url: str,
    method: str = "GET",
    body: Any = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    headers: dict[str, str] | None = None,
) -> Any:
    """One JSON request; BrokerError for an HTTP error (with the start of its body) or no answer.
    ``headers``: extra ones (``Authorization``), never part of an error message."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json",
            **(headers or {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise BrokerError(f"{method} {url}: HTTP {exc.code}: {detail}", exc.code) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise BrokerError(f"{method} {url}: {exc}") from exc


def topic_path(topic: str) -> str:
    """``/v1/topics/<topic>``, the name quoted whole (a ``/`` in it is part of the name)."""
    return "/v1/topics/" + urllib.parse.quote(topic, safe="")


def _reachable(partition: contracts.PartitionPlan, offsets: Mapping[int, int]) -> int:
    """How far a flush can bring ``partition`` towards its offset in ``offsets`` (0: none asked)."""
    stable = partition.last_stable_offset
    limit = partition.high_watermark if stable is None else min(stable, partition.high_watermark)
    return min(offsets.get(partition.partition, 0), limit)


class AdminClient:
    """``admin_url``: one broker's admin API, or several, comma-separated (a cluster: any
    broker answers for every partition). A request goes to the one that answered last and,
    when it does not answer at all, to the next; an HTTP error is an answer and is raised.
    ``user_info``: ``user:password`` of an admin API that requires a login
    (``admin.authentication.method=BASIC``); unset, ``ICEFALL_ADMIN_USER_INFO`` if set."""

    def __init__(
        self, admin_url: str, timeout: float = DEFAULT_TIMEOUT_S, user_info: str | None = None
    ) -> None:
        self.urls = [u.strip().rstrip("/") for u in admin_url.split(",") if u.strip()]
        if not self.urls:
            raise ValueError("no admin API URL")
        self.timeout = timeout
        self.user_info = user_info or admin_user_info()
        self._headers = basic_auth_header(self.user_info)

    @property
    def url(self) -> str:
        """The admin API asked first (the one that answered last)."""
        return self.urls[0]

    @property
    def admin_url(self) -> str:
        return ",".join(self.urls)

    def _request(self, path: str, method: str = "GET", body: Any = None) -> Any:
        failures = []
        for url in list(self.urls):
            try:
                answer = http_json(
                    url + path,
                    method=method,
                    body=body,
                    timeout=self.timeout,
                    headers=self._headers,
                )
            except BrokerError as exc:
                if exc.status is not None or len(self.urls) == 1:
                    raise
                failures.append(str(exc))
                continue
            if url != self.urls[0]:
                self.urls.remove(url)
                self.urls.insert(0, url)
            return answer
        raise BrokerError("no admin API answered: " + "; ".join(failures))

    def get(self, path: str, **query: Any) -> Any:
        qs = ("?" + urllib.parse.urlencode(query)) if query else ""
        return self._request(path + qs)

    def post(self, path: str, body: Any) -> Any:
        return self._request(path, method="POST", body=body)

    def health(self) -> contracts.Health:
        return contracts.Health.model_validate(self.get("/healthz"))

    def cluster(self) -> contracts.ClusterInfo:
        return contracts.ClusterInfo.model_validate(self.get("/v1/cluster"))

    def table_topics(self) -> contracts.Manifest:
        return contracts.Manifest.model_validate(self.get("/v1/table-topics"))

    def table_topic(self, topic: str) -> contracts.TableTopic:
        """The manifest entry of ``topic``; BrokerError (404) when it is not a table topic."""
        found = self.table_topics().find(topic)
        if found is None:
            raise BrokerError(f"topic {topic!r} is not a table topic (set {ENABLE}=true)", 404)
        return found

    def offsets(self, topic: str) -> contracts.TopicOffsets:
        return contracts.TopicOffsets.model_validate(self.get(topic_path(topic) + "/offsets"))

    def plan(self, topic: str, until_append_ms: int | None) -> contracts.TopicPlan:
        query = contracts.PlanRequest(until_append_ms=until_append_ms).query()
        return contracts.TopicPlan.model_validate(self.get(topic_path(topic) + "/plan", **query))

    def flushed_plan(
        self, topic: str, until_append_ms: int | None, deadline_s: float = 60.0
    ) -> contracts.TopicPlan:
        """The plan, once every offset it names is in segment objects (asks the broker to flush)."""
        if until_append_ms is None:
            self.flush()
        return self._plan_once(
            topic,
            until_append_ms,
            lambda plan: plan.not_flushed,
            "",
            deadline_s,
            flushed=until_append_ms is None,
        )

    def covering_plan(
        self, topic: str, offsets: Mapping[int, int], deadline_s: float = 60.0
    ) -> contracts.TopicPlan:
        """The plan of the flushed ends, once every partition's reaches ``offsets`` (a round told
        its end offsets: the commit task's plan, which flushed them). Only a partition not
        written that far yet makes it ask the broker to flush: ``flushed_plan`` with no time
        flushes every partition first, and at a steady produce rate finds more appended after
        the flush, so it flushed twice and slept, ~0.1 s a round at 12 MiB/s. An offset past
        a partition's high watermark (or its last stable offset) waits for that only, as a
        flush could not go further."""
        return self._plan_once(
            topic,
            None,
            lambda plan: [
                p.partition for p in plan.partitions if p.end_offset < _reachable(p, offsets)
            ],
            " up to the round's end offsets",
            deadline_s,
        )

    def _plan_once(
        self,
        topic: str,
        until_append_ms: int | None,
        short_of: Callable[[contracts.TopicPlan], list[int]],
        what: str,
        deadline_s: float,
        flushed: bool = False,
    ) -> contracts.TopicPlan:
        """Re-plan until ``short_of`` names no partition, asking the broker to flush between
        plans (``flushed``: a flush already ran, so the next one waits 0.1 s first: a flush
        that did not get there is not asked again at once); BrokerError past ``deadline_s``."""
        give_up = time.monotonic() + deadline_s
        while True:
            plan = self.plan(topic, until_append_ms)
            short = short_of(plan)
            if not short:
                return plan
            if time.monotonic() > give_up:
                raise BrokerError(
                    f"the broker has not flushed partitions {short} of {topic}{what} "
                    f"within {deadline_s:.0f} s"
                )
            if flushed:
                time.sleep(0.1)  # spaces out flushes that did not get there
            self.flush()
            flushed = True

    def ranges(self, topic: str, partition: int, start: int, end: int) -> contracts.TopicRanges:
        query = contracts.RangesRequest(partition=partition, start=start, end=end).query()
        return contracts.TopicRanges.model_validate(
            self.get(f"{topic_path(topic)}/partitions/{int(partition)}/ranges", **query)
        )

    def pending(self, topic: str, since: dict[Any, int] | None = None) -> contracts.Pending:
        """Records and bytes waiting for the topic's table (past ``since`` when given)."""
        query = contracts.PendingRequest(since=since or {}).query()
        return contracts.Pending.model_validate(self.get(topic_path(topic) + "/pending", **query))

    def flush(self) -> contracts.FlushAnswer:
        answer = self.post("/v1/flush", {})
        return contracts.FlushAnswer.model_validate(answer)
