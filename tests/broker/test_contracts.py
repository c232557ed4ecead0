"""The shared contracts without a broker: names, the topic-config view, the models' JSON, lag and the topic-id rule."""

from __future__ import annotations

import json

import pytest

from broker import admin_client, contracts, names, topic_configs
from broker.checkpoint import Checkpoint


def test_names_are_built_in_one_place() -> None:
    assert names.table_name("shop.orders-v2") == "shop_orders_v2"
    assert names.dlq_table("orders") == "orders__dlq" and names.dlq_of("orders__dlq") == "orders"
    assert (names.value_subject("clicks"), names.key_subject("clicks")) == (
        "clicks-value",
        "clicks-key",
    )
    assert names.commit_dag_id("a.b") == "icefall_commit__a.b"
    assert names.writer_dag_ids("t") == ("icefall_commit__t", "icefall_maintain__t")
    assert (
        names.dlq_dag_id("t") == "icefall_dlq_reprocess__t"
        and names.pool_name("t") == "icefall_table__t"
    )
    assert names.asset_name("ns", "t") == "icefall/ns/t"
    assert [
        f("ns", "t")
        for f in (names.pending_asset_name, names.maintenance_asset_name, names.dlq_asset_name)
    ] == ["icefall/ns/t/pending", "icefall/ns/t/maintenance", "icefall/ns/t/dlq-reprocess"]
    assert topic_configs.table_name("a-b") == names.table_name("a-b")


def test_the_typed_view_takes_the_declared_defaults() -> None:
    view = topic_configs.TableSettings({})
    assert view.namespace == topic_configs.KEYS[topic_configs.NAMESPACE].default == "default"
    assert (view.convert_value_type, view.format_version, view.upsert_enabled, view.cdc_field) == (
        "by_schema_id",
        2,
        False,
        None,
    )
    assert (
        view.maintenance_interval_ms == topic_configs.MAINTENANCE_INTERVAL_MS
        and view.maintenance_enabled
    )
    # a manifest entry is a table topic unless its flag says otherwise (old manifests lacked it)
    assert view.enabled and not topic_configs.TableSettings({topic_configs.ENABLE: "false"}).enabled
    # lenient where a DAG file must still parse an odd manifest
    odd = topic_configs.TableSettings(
        {topic_configs.COMMIT_TRIGGER_BYTES: "lots", topic_configs.MAINTENANCE_INTERVAL: ""}
    )
    assert (
        odd.commit_trigger_bytes == 0
        and odd.maintenance_interval_ms == topic_configs.MAINTENANCE_INTERVAL_MS
    )
    assert topic_configs.TableSettings({topic_configs.CDC_FIELD: " op "}).cdc_field == "op"


def test_every_table_key_is_declared_once() -> None:
    declared = {k for k in topic_configs.KEYS if k.startswith(topic_configs.TABLE_PREFIX)}
    constants = {
        v
        for k, v in vars(topic_configs).items()
        if k.isupper()
        and isinstance(v, str)
        and v.startswith(topic_configs.TABLE_PREFIX)
        and v != topic_configs.TABLE_PREFIX
    }
    assert constants == declared


def test_models_read_like_the_json_they_replace() -> None:
    plan = contracts.TopicPlan.model_validate(
        {
            "topic": "t",
            "until_append_ms": None,
            "partitions": [
                {
                    "partition": 0,
                    "log_start_offset": 0,
                    "end_offset": 5,
                    "flushed": True,
                    "high_watermark": 5,
                },
                {
                    "partition": 1,
                    "log_start_offset": 0,
                    "end_offset": 2,
                    "flushed": False,
                    "high_watermark": 3,
                },
            ],
        }
    )
    assert (
        plan["partitions"][1]["end_offset"] == 2
        and plan.get("nope", "x") == "x"
        and "topic" in plan
    )
    assert plan.not_flushed == [1] and not plan.flushed
    with pytest.raises(KeyError):
        plan["nope"]
    # offsets: int keys in Python, sorted string keys in JSON
    answer = contracts.RoundPlan(topic="t", round_id="r", end_offsets={10: 1, 2: 3})
    assert json.dumps(answer.to_json()["end_offsets"]) == '{"2": 3, "10": 1}'
    assert contracts.RoundPlan.model_validate(answer.to_json()).end_offsets == {2: 3, 10: 1}


def test_the_round_result_json_keeps_its_keys_and_order() -> None:
    result = contracts.RoundResult(
        status="committed",
        topic="t",
        namespace="default",
        table="t",
        round_id="r",
        until_append_ms=None,
        snapshot_id=7,
        offsets_after={1: 4, 0: 3},
        seconds={"plan": 0.5},
    )
    out = result.to_json()
    assert list(out)[:6] == ["status", "topic", "namespace", "table", "round_id", "until_append_ms"]
    assert out["offsets_after"] == {"0": 3, "1": 4} and out["seconds"] == {"plan": 0.5}
    assert list(out)[-1] == "message"


def test_the_manifest_model_is_lenient_where_old_manifests_were() -> None:
    manifest = contracts.Manifest.model_validate(
        {
            "version": 1,
            "table_topics": [
                {
                    "topic": "a",
                    "table": "a",
                    "namespace": None,
                    "partitions": "2",
                    "configs": {"x": 1},
                }
            ],
            "disabled_table_topics": None,
        }
    )
    [entry] = manifest.table_topics
    assert (entry.namespace, entry.partitions, entry.configs) == ("default", 2, {"x": "1"})
    assert entry.dag_id == "icefall_commit__a" and entry.identifier == ("default", "a")
    assert (
        manifest.find("a") is entry
        and manifest.find("b") is None
        and manifest.disabled_table_topics == []
    )


def test_offsets_belong_to_the_topic_id_that_committed_them() -> None:
    mine = Checkpoint({0: 5}, 1, topic_id="new")
    assert mine.offsets_for("new") == {0: 5} and mine.offsets_for("old") == {}
    assert Checkpoint({0: 5}, 1).offsets_for("any") == {0: 5}  # recorded before ids were


def test_lag_in_records_and_seconds() -> None:
    asked: list[int] = []

    def oldest(start: int) -> int:
        asked.append(start)
        return 1_000 + start

    parts = [
        contracts.PartitionLag.of(0, 10, 20, 5, oldest),  # committed before the log start
        contracts.PartitionLag.of(1, 0, 7, 7, oldest),  # caught up: not asked
        contracts.PartitionLag.of(2, 0, 4, None, oldest),
    ]
    assert asked == [10, 0] and [p.lag_records for p in parts] == [10, 0, 4]
    assert [p.committed_offset for p in parts] == [5, 7, 0]
    lag = contracts.Lag.of(parts, now_ms=3_500)
    assert (lag.records, lag.seconds) == (14, 2.5)
    assert list(lag.to_json()) == ["records", "seconds", "measured_at_ms", "partitions"]
    assert contracts.Lag.of([parts[1]], 3_500).seconds == 0.0


def test_topic_names_are_quoted_whole() -> None:
    assert admin_client.topic_path("a/b c") == "/v1/topics/a%2Fb%20c"
    assert contracts.PendingRequest(since={1: 5}).query() == {"from": '{"1": 5}'}
    assert contracts.PlanRequest().query() == {} and contracts.PlanRequest(
        until_append_ms=9
    ).query() == {"until_append_ms": "9"}


def test_catalog_secrets_come_from_the_environment_never_from_the_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``/v1/cluster`` serves the spec without secret properties; a job's own
    ``ICEFALL_CATALOG_CREDENTIAL`` becomes the REST catalog's ``credential`` (and token URI)."""
    from broker.http_security.client import CATALOG_CREDENTIAL_ENV

    external = contracts.CatalogSpec(
        uri="https://polaris:8181/api/catalog",
        properties={
            "credential": "id:secret",
            "token": "t0k3n",
            "rest.secret-access-key": "k",
            "client.session-token": "s",
            "token-refresh-enabled": "true",
            "s3.endpoint": "http://minio:9000",
            "header.Authorization": "Bearer b34r3r",
            "header.X-Api-Key": "k3y",
            "gcs.oauth2.token": "g",
            "adls.sas-token.account": "sas",
            "adls.account-key": "ak",
            "authentication.token": "nessie",
            "s3.access-key-id": "AKIA",
            "client.credentials-provider": "com.example.Provider",
            "oauth2-server-uri": "https://idp/token",
        },
        builtin=False,
    )
    assert external.without_secrets().properties == {
        "token-refresh-enabled": "true",
        "s3.endpoint": "http://minio:9000",
        "s3.access-key-id": "AKIA",
        "client.credentials-provider": "com.example.Provider",
        "oauth2-server-uri": "https://idp/token",
    }
    monkeypatch.delenv(CATALOG_CREDENTIAL_ENV, raising=False)
    builtin = contracts.CatalogSpec.rest("http://broker:8181")
    assert "credential" not in builtin.pyiceberg_properties()
    monkeypatch.setenv(CATALOG_CREDENTIAL_ENV, "etl:s3cr3t")
    for properties in (builtin.pyiceberg_properties(), builtin.spark_properties()):
        assert properties["credential"] == "etl:s3cr3t"
        assert properties["oauth2-server-uri"] == "http://broker:8181/v1/oauth/tokens"
    assert "s3cr3t" not in builtin.model_dump_json()
    # a catalog whose own properties authenticate it keeps them
    assert external.pyiceberg_properties()["credential"] == "id:secret"
