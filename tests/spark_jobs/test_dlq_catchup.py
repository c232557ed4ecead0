"""Which catalogs commit several tables at once: a REST catalog's ``/v1/config`` ``endpoints``
decide (served here by a small HTTP server standing in for a REST catalog that lists no
multi-table commit; the built-in catalog lists it), Glue never does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from broker.contracts import CatalogSpec
from spark_jobs.broker_client import BrokerRequestError
from spark_jobs.rounds.dlq_catchup import (
    TRANSACTIONS_ENDPOINT,
    multi_table_commits,
    rest_endpoints_allow_transactions,
)
from tests.support import serving

TABLE_ENDPOINTS = ["GET /v1/{prefix}/namespaces/{namespace}/tables/{table}"]


def test_the_endpoints_list_decides() -> None:
    assert rest_endpoints_allow_transactions(
        {"defaults": {}}
    )  # no list: an older server, as before
    assert rest_endpoints_allow_transactions(
        {"endpoints": [*TABLE_ENDPOINTS, TRANSACTIONS_ENDPOINT]}
    )
    assert not rest_endpoints_allow_transactions({"endpoints": TABLE_ENDPOINTS})


@pytest.fixture
def config_server() -> Iterator[str]:
    class Config(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not self.path.startswith("/v1/config"):
                self.send_error(404)
                return
            body = json.dumps({"defaults": {}, "overrides": {}, "endpoints": TABLE_ENDPOINTS})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Config)) as url:
        yield url


def test_a_rest_catalog_without_the_transactions_endpoint_commits_one_table_at_a_time(
    config_server: str,
) -> None:
    spec = CatalogSpec(type="rest", uri=config_server, builtin=False)
    assert multi_table_commits(spec) is False
    assert multi_table_commits(CatalogSpec(type="glue", warehouse="s3://b/w")) is False


def test_a_catalog_that_does_not_answer_is_named() -> None:
    with pytest.raises(BrokerRequestError, match=r"automq.table.topic.catalog.uri"):
        multi_table_commits(CatalogSpec(type="rest", uri="http://127.0.0.1:9", builtin=False))


def test_the_moved_offsets_of_a_reprocess_survive_the_summary_round_trip() -> None:
    """``icefall.dlq-moved``: what a crashed reprocess's DLQ deletion is made again from."""
    from spark_jobs.rounds.dlq_catchup import _moved, moved_property

    by_partition = {0: [4, 5, 6, 9], 3: [0], 1: [7, 8]}
    text = moved_property("clicks's", by_partition)
    assert _moved({"icefall.dlq-moved": text}) == (
        "clicks's",
        {p: sorted(o) for p, o in sorted(by_partition.items())},
    )
    assert '"0":[[4,7],[9,10]]' in text
