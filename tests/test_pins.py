"""pyiceberg is pinned to one minor version: the catalog and the commit round use its
private APIs, which change between minor versions without notice.

On an upgrade these tests fail first, on purpose. Before moving the pin (pyproject.toml
and constraints.txt), re-check every API in ``PRIVATE_APIS`` against the new version:
that it still exists, takes the same arguments and does the same thing (its source, not
only its signature), then run tests/broker/catalog and tests/spark_jobs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import tomllib
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.support import REPO

PINNED_MINOR = (0, 12)

# module, attribute (dotted below the module), parameters (None: not a function), who uses it and why
PRIVATE_APIS: list[tuple[str, str, list[str] | None, str]] = [
    (
        "pyiceberg.io.pyarrow",
        "_dataframe_to_data_files",
        ["table_metadata", "df", "io", "write_uuid", "counter"],
        "spark_jobs/rounds/tasks.py: Spark tasks write the round's data files (from a RecordBatchReader too)",
    ),
    (
        "pyiceberg.io.pyarrow",
        "_to_requested_schema",
        [
            "requested_schema",
            "file_schema",
            "batch",
            "downcast_ns_timestamp_to_us",
            "include_field_ids",
            "projected_missing_fields",
            "allow_timestamp_tz_mismatch",
            "format_model",
        ],
        "spark_jobs/rounds/streamed_files.py: each batch in the file's schema, with field ids",
    ),
    (
        "pyiceberg.io.pyarrow",
        "ParquetFormatWriter.__init__",
        ["self", "output_file", "file_schema", "properties"],
        "spark_jobs/rounds/streamed_files.py: sets use_dictionary in the _parquet_writer_kwargs it "
        "makes here, which write() hands to pyarrow's ParquetWriter",
    ),
    (
        "pyiceberg.io.pyarrow",
        "ParquetFormatWriter.write",
        ["self", "table"],
        "spark_jobs/rounds/streamed_files.py: one call per row group, in the writer thread",
    ),
    (
        "pyiceberg.io.pyarrow",
        "ParquetFormatWriter.close",
        ["self"],
        "spark_jobs/rounds/streamed_files.py: the file's statistics once its last row group is in",
    ),
    (
        "pyiceberg.io.pyarrow",
        "write_file",
        ["io", "table_metadata", "tasks"],
        "spark_jobs/rounds/streamed_files.py mirrors what it does per file (schema, path, writer, "
        "DataFile): re-read it on an upgrade",
    ),
    (
        "pyiceberg.io.pyarrow",
        "bin_pack_record_batches",
        ["batches", "target_file_size"],
        "spark_jobs/rounds/streamed_files.py closes a file where this closes one",
    ),
    (
        "pyiceberg.io.pyarrow",
        "ParquetFormatModel.create_writer",
        ["self", "output_file", "file_schema", "properties"],
        "spark_jobs/rounds/streamed_files.py: a file's writer",
    ),
    (
        "pyiceberg.io.fileformat",
        "DataFileStatistics.to_serialized_dict",
        ["self"],
        "spark_jobs/rounds/streamed_files.py: a file's statistics into its DataFile",
    ),
    (
        "pyiceberg.io.fileformat",
        "FileFormatFactory.get",
        None,
        "spark_jobs/rounds/streamed_files.py: the Parquet format model pyiceberg writes with",
    ),
    (
        "pyiceberg.table",
        "WriteTask.generate_data_file_filename",
        ["self", "extension"],
        "spark_jobs/rounds/streamed_files.py: data file names as pyiceberg's writer names them",
    ),
    (
        "pyiceberg.table.update",
        "_apply_table_update",
        ["update", "base_metadata", "context"],
        "broker/catalog/v3.py: registers the format v3 upgrade (singledispatch)",
    ),
    (
        "pyiceberg.table.update",
        "_TableMetadataUpdateContext.add_update",
        ["self", "update"],
        "broker/catalog/v3.py: the upgrade records itself as an applied update",
    ),
    (
        "pyiceberg.catalog",
        "MetastoreCatalog._update_and_stage_table",
        ["self", "current_table", "table_identifier", "requirements", "updates"],
        "broker/catalog/commits.py: a commit's requirements checked and updates applied",
    ),
    (
        "pyiceberg.catalog",
        "MetastoreCatalog._resolve_table_location",
        ["self", "location", "database_name", "table_name"],
        "broker/catalog/store.py: a new table's location",
    ),
    (
        "pyiceberg.catalog",
        "MetastoreCatalog._write_metadata",
        ["metadata", "io", "metadata_path"],
        "broker/catalog/store.py overrides it (a staticmethod) to write v3 files; commits.py calls it",
    ),
    (
        "pyiceberg.catalog.sql",
        "SqlCatalog._convert_orm_to_iceberg",
        ["self", "orm_table"],
        "broker/catalog/store.py overrides it: a table row's metadata from broker.metadata_cache",
    ),
    (
        "pyiceberg.io.pyarrow",
        "PyArrowFileIO._initialize_s3_fs",
        ["self", "netloc"],
        "broker/pyarrow_fileio.py overrides it: the S3 file system rebuilt with allow_delayed_open",
    ),
    (
        "pyiceberg.catalog.sql",
        "SqlCatalog._create_table_row",
        ["self", "namespace", "table_name", "metadata_location"],
        "broker/catalog/commits.py: the row of a table created by a multi-table commit",
    ),
    (
        "pyiceberg.catalog.sql",
        "SqlCatalog._iceberg_type_filter",
        ["self"],
        "broker/catalog/store.py: which rows of iceberg_tables are tables",
    ),
    (
        "pyiceberg.catalog.sql",
        "IcebergTables",
        None,
        "broker/catalog/store.py, commits.py: the SQL catalog's table rows, read and updated directly",
    ),
    (
        "pyiceberg.table.metadata",
        "TableMetadataUtil.parse_raw",
        ["data"],
        "spark_jobs/rounds/tasks.py: the table metadata a task is given",
    ),
    (
        "pyiceberg.table.metadata",
        "new_table_metadata",
        None,
        "broker/catalog/store.py: staged creates",
    ),
    (
        "pyiceberg.serializers",
        "ToOutputFile.table_metadata",
        None,
        "broker/iceberg_json.py: v1/v2 metadata files",
    ),
    (
        "pyiceberg.serializers",
        "Compressor.get_compressor",
        None,
        "broker/iceberg_json.py: v3 metadata files",
    ),
    (
        "pyiceberg.serializers",
        "FromInputFile",
        None,
        "broker/catalog/store.py: metadata files read back",
    ),
    (
        "pyiceberg.typedef",
        "IcebergBaseModel.model_dump_json",
        None,
        "broker/iceberg_json.py: v3 JSON, past TableMetadataV3.model_dump_json (which refuses v3)",
    ),
    (
        "pyiceberg.table.locations",
        "load_location_provider",
        None,
        "broker/catalog/store.py; spark_jobs/rounds/streamed_files.py: data file paths",
    ),
]

RECHECK = "\n".join(f"  {module}.{name}: {why}" for module, name, _, why in PRIVATE_APIS)


def _installed() -> Version:
    return Version(importlib.metadata.version("pyiceberg"))


def _resolve(module: str, name: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def test_installed_pyiceberg_is_the_pinned_minor() -> None:
    installed = _installed()
    assert (installed.major, installed.minor) == PINNED_MINOR, (
        f"pyiceberg {installed} is installed, the code is written against {PINNED_MINOR[0]}.{PINNED_MINOR[1]}.x. "
        f"Re-check these private APIs before moving PINNED_MINOR and the pins:\n{RECHECK}"
    )


def test_pyproject_and_constraints_pin_the_same_minor() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (requirement,) = [
        Requirement(d) for d in project["dependencies"] if Requirement(d).name == "pyiceberg"
    ]
    major, minor = PINNED_MINOR
    assert Version(f"{major}.{minor}.0") in requirement.specifier, requirement
    assert Version(f"{major}.{minor + 1}.0") not in requirement.specifier, (
        f"{requirement}: pin the minor version"
    )
    assert Version(f"{major}.{minor - 1}.999") not in requirement.specifier, (
        f"{requirement}: pin the minor version"
    )
    pinned = [
        line.split("==")[1].strip()
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.startswith("pyiceberg==")
    ]
    assert len(pinned) == 1 and Version(pinned[0]).release[:2] == PINNED_MINOR, pinned


@pytest.mark.parametrize(
    ("module", "name", "parameters", "why"),
    PRIVATE_APIS,
    ids=[f"{m}.{n}" for m, n, _, _ in PRIVATE_APIS],
)
def test_private_api_is_where_the_code_expects_it(
    module: str, name: str, parameters: list[str] | None, why: str
) -> None:
    try:
        found = _resolve(module, name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{module}.{name} is gone in pyiceberg {_installed()} ({exc}); used by {why}")
    if parameters is not None:
        got = list(inspect.signature(found).parameters)
        assert got == parameters, (
            f"{module}.{name} now takes {got}, not {parameters}; used by {why}"
        )


def test_write_metadata_is_still_a_staticmethod_the_catalog_overrides() -> None:
    from pyiceberg.catalog import MetastoreCatalog

    from broker.catalog.store import _SqlCatalog

    assert isinstance(inspect.getattr_static(MetastoreCatalog, "_write_metadata"), staticmethod)
    assert isinstance(inspect.getattr_static(_SqlCatalog, "_write_metadata"), staticmethod)


def test_sql_catalog_rows_have_the_columns_the_catalog_uses() -> None:
    from pyiceberg.catalog.sql import IcebergTables

    columns = set(IcebergTables.__table__.columns.keys())
    assert columns >= {
        "catalog_name",
        "table_namespace",
        "table_name",
        "metadata_location",
        "previous_metadata_location",
    }, columns


def test_the_v3_upgrade_is_registered_with_pyiceberg() -> None:
    from pyiceberg.table.update import _apply_table_update

    from broker.catalog import v3

    assert _apply_table_update.dispatch(v3.UpgradeToV3) is v3._upgrade_to_v3
