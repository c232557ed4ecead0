"""The DAG factory: one commit-round DAG per table topic, ``icefall_commit__<topic>``.

Built from the broker's manifest file only (no network, no database at parse
time). The schedule is the topic's commit interval as a data-interval
timetable, so each run is one round for [a, b), the UI's Backfill works, and a
re-run commits nothing new; a run is created a few seconds before b and its
``commit`` task waits for b before it plans (``timetable``), so the round is not late by Airflow's
scheduling. ``max_active_runs=1`` keeps one round in flight
per DAG; the commit task takes the table's one-slot pool, which maintenance
DAGs share, so two writers never race on the table.

One task runs a round, ``commit`` (``commit_operator``): it plans (broker end
offsets for the interval, waiting until they are in segment objects: ``planning``),
runs ``commit_round.py`` (in the warm driver, else as a Python process, or with
spark-submit when the round needs Spark) and publishes
(asset event ``icefall/<namespace>/<table>``, skipped when nothing new was committed:
``publish``). On tables partitioned by hour or day ``commit`` >> ``announce``
(partitioned events on ``icefall/<namespace>/<table>/closed-partitions`` for the hours
or days the commit closed, ``event_partitions``). A topic with a freshness SLA
gets a deadline alert on each run (``freshness``).
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from airflow.sdk import (
    DAG,
    Asset,
    AssetOrTimeSchedule,
    AssetWatcher,
    Param,
    get_current_context,
    task,
)

from broker import names
from broker.env_values import PLAN_DEADLINE_S
from icefall_airflow import event_partitions, freshness, manifest, planning, publish
from icefall_airflow.assets import closed_partitions_asset, pending_asset, table_asset
from icefall_airflow.broker_client import BrokerClient, BrokerError
from icefall_airflow.commit_operator import CommitRoundOperator
from icefall_airflow.lag import measure
from icefall_airflow.pending_trigger import PendingBytesTrigger
from icefall_airflow.timetable import LeadingIntervalTimetable

log = logging.getLogger(__name__)

# Fixed, in the past: the scheduler starts at the latest interval (catchup off);
# earlier intervals are there for the UI's Backfill.
START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
EVENT_LOOKBACK_MS = 10 * 60 * 1000

DOC = """\
### Commit rounds of topic `{topic}` into `{namespace}.{table}`

Every {interval_s:g} s (the topic's `automq.table.topic.commit.interval.ms`) one round commits,
per partition, the offsets appended before the end of the run's data interval. Re-running a run
or backfilling committed intervals commits nothing new.

Manual run params: `until` = `interval` (default; a run without a logical date commits up to its
trigger time), `now`, or `offsets` with `until_offsets` = `{{"0": 1234, ...}}` (exclusive ends); `max_records`
caps the round. Each commit emits an event on the asset `{asset}` (its extra: snapshot,
offsets, rows, event-time range); on a table partitioned by hour or day, each hour or day the
commit closes gets a partitioned event on `{asset}/closed-partitions`.
"""


def round_params() -> dict[str, Param]:
    return {
        "until": Param(
            planning.UNTIL_INTERVAL,
            enum=list(planning.UNTIL_CHOICES),
            description="interval: the run's data interval end (its trigger time if it has none); "
            "now: what was appended before the run was triggered; offsets: until_offsets",
        ),
        "until_offsets": Param(
            None,
            type=["null", "object"],
            description='with until=offsets: {"<partition>": <exclusive end offset>}',
        ),
        "max_records": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="commit at most this many records in this round",
        ),
    }


def _plan(entry: manifest.TableTopic) -> dict[str, Any]:
    if not entry.enabled:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(
            f"topic {entry.topic} is not a table topic now ({manifest.ENABLE_KEY}=false): "
            "no round; set it to true to resume"
        )
    context = get_current_context()
    dag_run = context.get("dag_run")
    # a run the size trigger started (an asset event) commits what had arrived when it was
    # created; a run without an interval (until=now, or no logical date) likewise: its
    # run_after, not the clock, so that every try of the task plans the same offsets
    by_size = getattr(dag_run, "run_type", None) == "asset_triggered"
    run_after = getattr(dag_run, "run_after", None)
    request = planning.round_request(
        entry.topic,
        context["params"],
        None if by_size else context.get("data_interval_end"),
        context["run_id"],
        int(run_after.timestamp() * 1000) if run_after else int(time.time() * 1000),
    )
    client = BrokerClient(manifest.admin_url())
    if request.until_append_ms is not None and request.until_append_ms > time.time() * 1000:
        _prestage(request)  # the interval has not ended: a warm driver can start on its rows
    plan = planning.plan_round(client, request, PLAN_DEADLINE_S.read())
    log.info(
        "round %s of %s: end offsets %s (high watermarks %s, until append time %s)",
        request.round_id,
        entry.topic,
        plan.end_offsets,
        plan.high_watermarks,
        request.until_append_ms,
    )
    return plan.to_xcom()


def _prestage(request: planning.RoundRequest) -> None:
    """Ask the warm driver, if there is one, to write the round's rows ahead while its interval
    ends (``spark_jobs.prestage``); the round is the same without (it reads them all itself),
    so a driver that does not answer is only logged."""
    from icefall_airflow import credentials
    from icefall_airflow.warm_driver import WarmDriverClient

    warm = WarmDriverClient.from_connection()
    if warm is None or request.max_records or request.until_append_ms is None:
        return
    args = ["--topic", request.topic, "--until-append-time", str(request.until_append_ms)]
    try:
        status = warm.prestage([*args, "--admin-url", manifest.admin_url()], credentials.job_env())
    except Exception as exc:  # noqa: BLE001 -- only an optimisation
        log.info("the warm driver did not take the pre-stage of %s: %s", request.topic, exc)
    else:
        log.info("the warm driver is %s for round %s", status, request.round_id)


def _publish(
    entry: manifest.TableTopic, asset: Asset, result: dict[str, Any], plan: dict[str, Any]
) -> None:
    """The commit task's last step: the asset event of a round that committed, with its
    extra (``publish``); a round that committed nothing skips the task, so no event."""
    from airflow.sdk.exceptions import AirflowSkipException

    publish.check_result(result)
    log.info(publish.summary_line(result))
    if result["status"] == "nothing_new":
        raise AirflowSkipException(
            f"nothing new committed in round {result.get('round_id')}: no asset event"
        )
    if result.get("from_earlier_try") and (event := _event_of(asset, result)) is not None:
        raise AirflowSkipException(
            f"round {result.get('round_id')}'s snapshot {result['snapshot_id']} already has its "
            f"asset event (emitted {event}): no second one"
        )
    try:
        lag = measure(
            BrokerClient(manifest.admin_url()),
            entry.topic,
            publish.committed_offsets(result),
            int(time.time() * 1000),
        ).to_json()
    except BrokerError as exc:  # the commit is done; a missing lag figure must not fail it
        log.warning("could not measure the lag after the commit: %s", exc)
        lag = None
    events = get_current_context()["outlet_events"][asset]
    events.extra.update(publish.asset_extra(result, plan, lag))


def _event_of(asset: Asset, result: dict[str, Any]) -> str | None:
    """When the asset's event for the result's snapshot was emitted, if it was: a round that an
    earlier try committed (``spark_jobs/rounds/earlier_try.py``) gets its event here unless that
    try, or a run this one re-runs (a cleared run, a backfill), already emitted it. Events are
    looked for from a little before the commit (clock skew between the catalog and Airflow)."""
    from airflow.sdk.execution_time.context import InletEventsAccessor

    since_ms = int(result.get("snapshot_timestamp_ms") or 0) - EVENT_LOOKBACK_MS
    events = InletEventsAccessor(asset_name=asset.name, asset_uri=asset.uri).after(
        datetime.fromtimestamp(max(since_ms, 0) / 1000, UTC).isoformat()
    )
    for event in events:
        if (event.extra or {}).get("snapshot_id") == result["snapshot_id"]:
            return event.timestamp.isoformat()
    return None


def _announce(asset: Asset, result: dict[str, Any]) -> None:
    """One partitioned event per event-time partition the commit closed; skipped when none did."""
    from airflow.sdk.exceptions import AirflowSkipException

    keys = event_partitions.closed_keys(publish.check_result(result))
    if not keys:
        raise AirflowSkipException(
            f"round {result.get('round_id')} closed no event-time partition "
            f"(watermark {result.get('watermark_ms')})"
        )
    log.info("round %s closed event-time partitions %s", result.get("round_id"), keys)
    events = get_current_context()["outlet_events"][asset]
    events.extra.update(event_partitions.announce_extra(result))
    events.add_partitions(keys)


def commit_schedule(entry: manifest.TableTopic) -> Any:
    """The topic's commit interval (each run created a little ahead of its interval's end:
    ``timetable``); with ``commit.trigger.bytes``, that interval or the size trigger,
    whichever comes first (``pending_trigger``)."""
    interval = LeadingIntervalTimetable(timedelta(milliseconds=entry.schedule_ms))
    if not entry.commit_trigger_bytes:
        return interval
    watcher = AssetWatcher(
        name=names.pending_watcher_name(entry.topic),
        trigger=PendingBytesTrigger(entry.topic, entry.commit_trigger_bytes),
    )
    return AssetOrTimeSchedule(
        # typed as the Task SDK's timetables; Airflow serializes a core one here as well
        # (encode_timetable), which is how a custom timetable is written
        timetable=cast(Any, interval),
        assets=pending_asset(entry.namespace, entry.table, [watcher]),
    )


def build_commit_dag(entry: manifest.TableTopic) -> DAG:
    asset = table_asset(entry.namespace, entry.table)
    with DAG(
        dag_id=entry.dag_id,
        description=f"Commit rounds: Kafka topic {entry.topic} -> Iceberg {entry.namespace}.{entry.table}",
        schedule=commit_schedule(entry),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,
        dagrun_timeout=timedelta(hours=1),
        deadline=freshness.deadline_alert(entry),  # automq.table.topic.freshness.sla.ms
        params=round_params(),
        tags=entry.dag_tags("commit"),
        doc_md=entry.disabled_note
        + DOC.format(
            topic=entry.topic,
            namespace=entry.namespace,
            table=entry.table,
            interval_s=entry.schedule_ms / 1000,
            asset=entry.asset_name,
        ),
        default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    ) as dag:
        commit = CommitRoundOperator(
            task_id="commit",
            planner=functools.partial(_plan, entry),
            publisher=functools.partial(_publish, entry, asset),
            outlets=[asset],
            pool=entry.pool,
            name=f"icefall-commit-{entry.topic}",
            execution_timeout=timedelta(minutes=30),
            rounds_need_spark=entry.settings.rounds_need_spark,
        )
        if event_partitions.may_close_partitions(entry.settings.partition_by):
            closed = closed_partitions_asset(entry.namespace, entry.table)
            # Its own task, with retries: the closure is already in the snapshot, so a
            # failed announce or a passing API error must not lose the hours it
            # closed (the next round would not close them again). A failed attempt emits
            # nothing, so a retry announces each key once; a round that committed nothing new
            # closed nothing and skips it.
            task(task_id="announce", outlets=[closed])(_announce)(
                closed,
                commit.output,  # type: ignore[arg-type]
            )
    return dag


def build_all(path: Path | None = None) -> dict[str, DAG]:
    """One DAG per table topic of the manifest at ``path`` (default ``HOME/table_topics.json``).

    A topic whose ``automq.table.topic.enable`` was set to ``false`` keeps its
    DAG (history, backfills, the same schedule for when it comes back), marked
    disabled; ``icefall_airflow.sync`` pauses it and its commit task skips, so it
    commits nothing while the topic is off. A topic deleted, or whose flag was
    deleted rather than set to false, drops out: Airflow marks its DAG stale.
    """
    current = manifest.read(path)
    dags: dict[str, DAG] = {}
    for entry in current.to_build(names.commit_dag_id):
        dags[entry.dag_id] = build_commit_dag(entry)
    return dags
