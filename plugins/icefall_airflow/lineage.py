"""OpenLineage for the Spark jobs: Kafka topic -> Iceberg table, with row counts and the snapshot.

Airflow's OpenLineage provider (``apache-airflow-providers-openlineage``) emits a
START and a COMPLETE (or FAIL) event per task; it asks an operator for its
datasets through ``get_openlineage_facets_on_complete``. The Icefall job
operators answer from the job's result JSON (``SparkJobOperator.job_result``),
so Marquez, DataHub or any OpenLineage backend sees:

- commit rounds: input the topic, output the table (and the DLQ table when the
  round sent records there), with the rows written and the snapshot committed;
- DLQ reprocess: input the DLQ table, outputs the table and the DLQ table;
- maintenance: the table in and out (it rewrites files, not rows).

Dataset names follow OpenLineage's naming conventions: a Kafka topic is
``kafka://<first bootstrap host:port>`` / ``<topic>``; an Iceberg table is named by
its location (``s3://bucket`` / ``path/to/table``, or ``file`` / ``/abs/path``), as
the OpenLineage Spark integration names it, with a ``symlinks`` facet giving its
catalog name ``<namespace>.<table>`` (type TABLE, in the catalog URI's namespace)
and a ``catalog`` facet. The snapshot id is the ``version`` facet; rows, bytes and
files the ``outputStatistics`` facet.

The provider is off unless a transport is configured (``[openlineage] transport``,
e.g. ``AIRFLOW__OPENLINEAGE__TRANSPORT='{"type": "http", "url": "http://marquez:5000"}'``):
then nothing is computed or sent. Any error here is the provider's to log; the
task's outcome never depends on lineage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from broker import names
from broker.contracts import CatalogSpec, ClusterInfo

TABLE = "TABLE"


def kafka_namespace(bootstrap: str) -> str:
    """``kafka://host:port`` of the first bootstrap server."""
    first = bootstrap.split(",")[0].strip()
    return f"kafka://{first.split('://')[-1]}"


def location_name(location: str) -> tuple[str, str]:
    """(namespace, name) of a table by its location: ``s3://bucket/a/b`` -> (``s3://bucket``,
    ``a/b``); a local path -> (``file``, ``/abs/path``)."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return "file", parsed.path or location
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")


def catalog_namespace(catalog: CatalogSpec) -> str:
    """Where a table's catalog name lives: the catalog's URI (Glue: ``glue``, S3 Tables: the bucket ARN)."""
    return catalog.uri or catalog.warehouse or catalog.type


def table_locations(catalog: CatalogSpec, identifiers: list[tuple[str, str]]) -> dict[str, str]:
    """``{"<namespace>.<table>": location}`` of the tables the catalog has (others are left out)."""
    from icefall_airflow.tables import open_catalog

    found: dict[str, str] = {}
    try:
        client = open_catalog(catalog)
    except Exception:  # noqa: BLE001 -- the catalog does not answer: the tables are named by it only
        return found
    for namespace, table in identifiers:
        try:
            found[f"{namespace}.{table}"] = client.load_table((namespace, table)).location()
        except Exception:  # noqa: BLE001 -- no such table (yet): named by the catalog only
            continue
    return found


def table_dataset(
    catalog: CatalogSpec,
    identifier: tuple[str, str],
    locations: Mapping[str, str],
    *,
    output: bool,
    snapshot_id: int | None = None,
    rows: int | None = None,
    size: int | None = None,
    files: int | None = None,
) -> Any:
    """An Iceberg table as an OpenLineage input or output dataset, named by its location
    when ``locations`` (``table_locations``) has it, else by the catalog."""
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import (
        catalog_dataset,
        dataset_version_dataset,
        output_statistics_output_dataset,
        symlinks_dataset,
    )

    full_name = ".".join(identifier)
    location = locations.get(full_name)
    catalog_ns = catalog_namespace(catalog)
    namespace, name = location_name(location) if location else (catalog_ns, full_name)
    facets: dict[str, Any] = {
        "symlinks": symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[symlinks_dataset.Identifier(catalog_ns, full_name, TABLE)]
        ),
        "catalog": catalog_dataset.CatalogDatasetFacet(
            framework="iceberg",
            type=catalog.type,
            name="icefall",
            metadataUri=catalog.uri or None,
            warehouseUri=catalog.warehouse,
            source="icefall",
        ),
    }
    if snapshot_id is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(str(snapshot_id))
    if not output:
        return InputDataset(namespace=namespace, name=name, facets=facets)
    statistics: dict[str, Any] = (
        {
            "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=rows, size=size, fileCount=files
            )
        }
        if rows is not None
        else {}
    )
    return OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=statistics)


def topic_dataset(bootstrap: str, topic: str, records: int | None, size: int | None) -> Any:
    from openlineage.client.event_v2 import InputDataset
    from openlineage.client.facet_v2 import input_statistics_input_dataset

    statistics: dict[str, Any] = (
        {
            "inputStatistics": input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
                rowCount=records, size=size
            )
        }
        if records is not None
        else {}
    )
    return InputDataset(namespace=kafka_namespace(bootstrap), name=topic, inputFacets=statistics)


def _lineage(inputs: list[Any], outputs: list[Any]) -> Any:
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=inputs, outputs=outputs)


def round_lineage(result: Mapping[str, Any], cluster: ClusterInfo) -> Any:
    """A commit round: the topic in, the table (and the DLQ table when it took rows) out."""
    catalog = cluster.tables_catalog
    namespace, table = str(result.get("namespace")), str(result.get("table"))
    dlq = names.dlq_table(table)
    tables = [(namespace, table)] + ([(namespace, dlq)] if result.get("dlq_rows") else [])
    locations = table_locations(catalog, tables)
    committed = result.get("status") == "committed"
    outputs = [
        table_dataset(
            catalog,
            (namespace, table),
            locations,
            output=True,
            snapshot_id=result.get("snapshot_id"),
            rows=int(result.get("rows") or 0) if committed else 0,
            files=result.get("data_files"),
        )
    ]
    if result.get("dlq_rows"):
        outputs.append(
            table_dataset(
                catalog,
                (namespace, dlq),
                locations,
                output=True,
                rows=int(result["dlq_rows"]),
            )
        )
    records = int(result.get("records") or 0) if committed else 0
    inputs = [
        topic_dataset(
            cluster.bootstrap, str(result.get("topic")), records, result.get("bytes_read")
        )
    ]
    return _lineage(inputs, outputs)


def reprocess_lineage(
    result: Mapping[str, Any], cluster: ClusterInfo, namespace: str, table: str
) -> Any:
    """A DLQ reprocess: the DLQ table in; the table (rows moved in) and the DLQ table out."""
    catalog = cluster.tables_catalog
    dlq = names.dlq_table(table)
    locations = table_locations(catalog, [(namespace, table), (namespace, dlq)])
    moved = int(result.get("moved") or 0)
    return _lineage(
        [table_dataset(catalog, (namespace, dlq), locations, output=False)],
        [
            table_dataset(
                catalog,
                (namespace, table),
                locations,
                output=True,
                snapshot_id=result.get("snapshot_id"),
                rows=moved,
            ),
            table_dataset(
                catalog,
                (namespace, dlq),
                locations,
                output=True,
                snapshot_id=result.get("dlq_snapshot_id"),
            ),
        ],
    )


def maintenance_lineage(
    result: Mapping[str, Any], cluster: ClusterInfo, namespace: str, table: str
) -> Any:
    """Maintenance: the table in (as it was) and out (its snapshot after; no rows added)."""
    catalog = cluster.tables_catalog
    identifier = (namespace, table)
    locations = table_locations(catalog, [identifier])
    return _lineage(
        [
            table_dataset(
                catalog,
                identifier,
                locations,
                output=False,
                snapshot_id=result.get("snapshot_id_before"),
            )
        ],
        [
            table_dataset(
                catalog,
                identifier,
                locations,
                output=True,
                snapshot_id=result.get("snapshot_id"),
            )
        ],
    )
