"""The "Table topics" view answers lag against a real broker and is a registered Airflow plugin."""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.dags.airflow_env import auth_headers
from tests.support import BrokerProcess, wait_for


def make_table_topic(broker: BrokerProcess, topic: str, partitions: int, **extra: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    config = {
        "automq.table.topic.enable": "true",
        "automq.table.topic.convert.value.type": "raw",
        "automq.table.topic.commit.interval.ms": "30000",
        **{f"automq.table.topic.{k.replace('_', '.')}": v for k, v in extra.items()},
    }
    for future in admin.create_topics([NewTopic(topic, partitions, 1, config=config)]).values():
        future.result(10)


def test_endpoint_reports_lag_in_records_and_seconds(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient
    from icefall_airflow.view import app

    monkeypatch.setenv("ICEFALL_ADMIN_URL", broker.admin_url)
    make_table_topic(broker, "page-views", 2, freshness_sla_ms="1000")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(30):
        producer.produce("page-views", value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(10) == 0
    produced_ms = int(time.time() * 1000)
    broker.admin("/v1/flush", method="POST")

    client = TestClient(app, headers=auth_headers())
    answer = client.get("/api/tables").json()
    assert answer["error"] is None and answer["catalog_url"] == broker.catalog_url
    [row] = answer["tables"]
    assert row["error"] is None, row["error"]
    assert (row["topic"], row["namespace"], row["table"]) == ("page-views", "default", "page_views")
    assert row["table_exists"] is False and row["snapshot_id"] is None and row["dlq_rows"] is None
    assert row["lag_records"] == 30 and row["end_offsets"] == {"0": 15, "1": 15}
    assert [p["lag_records"] for p in row["lag"]["partitions"]] == [15, 15]
    # Seconds of append time: how long ago the oldest record not in the table arrived.
    wait_for(lambda: int(time.time() * 1000) > produced_ms + 300, 5, what="300 ms to pass")
    row = client.get("/api/tables/page-views").json()
    assert 0.3 <= row["lag_seconds"] < 60
    assert row["dag_runs_url"] == "dags/icefall_commit__page-views/runs"
    assert client.get("/api/tables/nope").status_code == 404

    # Freshness (how long the oldest record not in the table has waited) against the topic's SLA.
    assert row["freshness_sla_ms"] == 1000 and row["freshness_seconds"] == row["lag_seconds"]
    row = wait_for(
        lambda: (r := client.get("/api/tables/page-views").json())["freshness_breached"] and r,
        10,
        what="the freshness of page-views to pass its 1 s SLA",
    )
    assert row["freshness_seconds"] > 1
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    labels = '{topic="page-views",namespace="default",table="page_views"}'
    assert f"icefall_table_freshness_sla_seconds{labels} 1\n" in metrics
    assert f"icefall_table_freshness_sla_breached{labels} 1\n" in metrics
    assert f"icefall_table_freshness_seconds{labels} " in metrics

    page = client.get("/")
    assert (
        page.status_code == 200
        and "page-views" in page.text
        and "icefall_commit__page-views" in page.text
        and "freshness SLA" in page.text
        and '1 s<br><small class="error">breached</small>' in page.text
    )
    # No commits yet: the charts say so; the lag line has its one point, now.
    assert page.text.count('<svg class="chart"') == 4 and "no commits" in page.text
    found = client.get("/api/tables/page-views/history").json()
    assert found["commits"] == [] and [p["records"] for p in found["lag"]] == [30]
    a_user_who_may_not_read_the_dags_sees_no_table(app, answer)
    lag_at_a_past_time_is_derived_from_append_times(broker)


def a_user_who_may_not_read_the_dags_sees_no_table(app: Any, everything: dict[str, Any]) -> None:
    """Airflow's auth manager refuses a user without a role every DAG: the view leaves out their
    table topics, says how many it left out, and answers 404 for one of them. No API docs are
    served to anyone (FastAPI's would skip the login)."""
    from fastapi.testclient import TestClient

    assert everything["hidden_tables"] == 0
    nobody = TestClient(app, headers=auth_headers(role=None))
    answer = nobody.get("/api/tables").json()
    assert answer["tables"] == [] and answer["hidden_tables"] == len(everything["tables"]) >= 1
    for path in ("/api/tables/page-views", "/api/tables/page-views/history"):
        assert nobody.get(path).status_code == 404
    page = nobody.get("/").text
    assert (
        "page-views" not in page and f"{len(everything['tables'])} table topic(s) not shown" in page
    )
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert TestClient(app).get(path).status_code == 404


def test_the_view_needs_airflows_login(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logged out: the pages go to the auth manager's login page (coming back after), the JSON
    endpoints answer 401; a token that is not Airflow's: refused, as by Airflow's own API."""
    from fastapi.testclient import TestClient
    from icefall_airflow.view import app

    monkeypatch.setenv("ICEFALL_ADMIN_URL", "http://127.0.0.1:9")
    auth_headers()  # the auth manager is set up, as in the API server
    client = TestClient(app)
    for path in ("/api/tables", "/api/tables/page-views", "/api/tables/page-views/history"):
        answer = client.get(path)
        assert (answer.status_code, answer.json()) == (401, {"detail": "Not authenticated"})
    for path in ("/", "/tables/default.page_views", "/tables/default.page_views/snapshots/1"):
        answer = client.get(path, follow_redirects=False)
        assert answer.status_code == 303
        assert answer.headers["location"] == "/auth/login?" + urllib.parse.urlencode(
            {"next": f"http://testserver{path}"}
        )
    assert client.get("/no-such-page").json() == {"detail": "Not Found"}
    forged = {"Authorization": "Bearer not-a-jwt"}
    assert client.get("/api/tables", headers=forged).status_code == 403
    assert client.get("/", headers=forged, follow_redirects=False).status_code == 303
    # The UI's cookie is as good as the header.
    token = auth_headers()["Authorization"].removeprefix("Bearer ")
    client.cookies.set("_token", token)
    assert client.get("/api/tables").status_code == 200


def lag_at_a_past_time_is_derived_from_append_times(broker: BrokerProcess) -> None:
    """The lag history's points: at a past time, the records appended before it minus the offsets
    the table held, and the age then of the oldest record not in the table."""
    from confluent_kafka import Producer
    from icefall_airflow import history
    from icefall_airflow.broker_client import BrokerClient

    make_table_topic(broker, "lag-history", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(10):
        producer.produce("lag-history", value=f"a{i}".encode())
        assert producer.flush(10) == 0  # a batch each: append times to the record
    cut = int(time.time() * 1000) + 1
    wait_for(lambda: int(time.time() * 1000) > cut + 50, 5, what="the clock to pass the cut")
    for i in range(6):
        producer.produce("lag-history", value=f"b{i}".encode())
    assert producer.flush(10) == 0
    broker.admin("/v1/flush", method="POST")
    client = BrokerClient(broker.admin_url)
    now = int(time.time() * 1000)
    at_cut = history.lag_at(client, "lag-history", {"0": 4}, cut, now)
    oldest = client.ranges("lag-history", 0, 4, 5).ranges[0].max_append_ms
    assert (at_cut.records, at_cut.seconds) == (6, round((cut - oldest) / 1000, 3))
    assert history.lag_at(client, "lag-history", {}, cut, now).records == 10
    assert history.lag_at(client, "lag-history", {"0": 10}, cut, now).seconds == 0.0
    assert history.lag_at(client, "lag-history", {"0": 10}, now, now).records == 6


def test_endpoint_reports_an_unreachable_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient
    from icefall_airflow.view import app

    monkeypatch.setenv("ICEFALL_ADMIN_URL", "http://127.0.0.1:9")
    client = TestClient(app, headers=auth_headers())
    answer = client.get("/api/tables").json()
    assert answer["tables"] == [] and "127.0.0.1:9" in answer["error"]
    assert "127.0.0.1:9" in client.get("/").text


def test_the_plugin_registers_the_app_and_the_view() -> None:
    from airflow import plugins_manager

    plugins, errors = plugins_manager._get_plugins()
    assert not errors
    [icefall] = [p for p in plugins if p.name == "icefall"]
    assert icefall.fastapi_apps[0]["url_prefix"] == "/icefall"
    assert icefall.external_views[0]["name"] == "Table topics"


def test_a_table_with_dlq_rows_links_to_its_reprocess_dag() -> None:
    from icefall_airflow.view import render

    row = {
        "topic": "t",
        "namespace": "default",
        "table": "t",
        "error": None,
        "dag_id": "icefall_commit__t",
        "dag_runs_url": "dags/icefall_commit__t/runs",
        "dlq_dag_id": "icefall_dlq_reprocess__t",
        "lag_records": 0,
        "lag_seconds": 0.0,
        "last_commit_ms": None,
        "snapshot_id": 1,
        "rows": 5,
        "dlq_rows": 3,
        "last_maintenance_ms": None,
    }
    page = render({"tables": [row]})
    assert 'href="../dags/icefall_dlq_reprocess__t"' in page
    assert "<td class=num>—</td>" in page  # no freshness SLA
    kept = render({"tables": [{**row, "freshness_sla_ms": 90_000, "freshness_breached": False}]})
    assert "90 s<br><small>met</small>" in kept
    assert "icefall_dlq_reprocess__t" not in render({"tables": [{**row, "dlq_rows": 0}]})
