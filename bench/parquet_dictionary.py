"""A round's Parquet write with a dictionary only where it pays
(``spark_jobs/rounds/dictionary_columns.py``) against a dictionary for every column
(pyarrow's default, what the streamed writer did before), in the same run.

Workload: ``--records`` records of ``bench/commit_round.py``'s 16-field Avro values (the
chunks of ``bench/avro_decode.py``: string keys, no headers, Kafka offsets and timestamps),
decoded once into Arrow batches as a round decodes them. Each of ``--turns`` turns writes
them through ``streamed_files.write_data_files`` (the writer a warm-driver round uses:
24 MiB row groups on a writer thread, zstd, pyiceberg's statistics) both ways, taking turns
going first, into a local table directory.

Figures per way, medians over the turns: this process's CPU seconds for the write (all
threads: the writer thread does the encoding) and the Parquet bytes; then the ratios
every-column / chosen (> 1: choosing is better). The first turn of each way is not counted.

    .venv/bin/python bench/parquet_dictionary.py [--records 300000] [--turns 7] [--quick]

``--quick`` (200,000 records, three turns, a few seconds) prints the CPU ratio last.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

from bench._common import run_info
from bench.avro_decode import SCHEMA, SCHEMA_ID, workload
from spark_jobs.decode import avro_schema
from spark_jobs.decode.rows import RowConverter
from spark_jobs.rounds import dictionary_columns, streamed_files

MIB = 1 << 20
WAYS = ("chosen", "every column")


def _every_column(first: pa.Table, sample_rows: int = 0) -> list[str]:
    """Every column path, dictionary-encoded as pyarrow does by default."""
    return dictionary_columns.column_paths(first.schema)


def _table(location: Path, schema: pa.Schema) -> Any:
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import assign_fresh_schema_ids
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    iceberg = assign_fresh_schema_ids(visit_pyarrow(schema, _ConvertToIcebergWithoutIDs()))
    return new_table_metadata(
        iceberg,
        PartitionSpec(),
        UNSORTED_SORT_ORDER,
        str(location),
        {"write.parquet.compression-codec": "zstd"},
    )


def run(records: int, turns: int, folder: Path) -> dict[str, Any]:
    from pyiceberg.io import load_file_io

    converter = RowConverter(
        avro_schema.table_schema(SCHEMA), {SCHEMA_ID: SCHEMA}.__getitem__, flavor="spark"
    )
    batches = [converter.convert(chunk).batch for chunk in workload(records)]
    metadata = _table(folder, batches[0].schema)
    io = load_file_io({}, metadata.location)
    chosen = streamed_files.dictionary_columns
    figures: dict[str, dict[str, list[float]]] = {w: {"cpu": [], "mib": []} for w in WAYS}
    try:
        for turn in range(turns + 1):
            for way in WAYS if turn % 2 else WAYS[::-1]:
                streamed_files.dictionary_columns = chosen if way == "chosen" else _every_column
                start = time.process_time()
                files = streamed_files.write_data_files(
                    metadata,
                    iter(batches),
                    batches[0].schema,
                    io,
                    write_uuid=uuid.uuid4(),
                    counter=itertools.count(),
                )
                cpu = time.process_time() - start
                mib = sum(f.file_size_in_bytes for f in files) / MIB
                print(f"[write] {way} turn {turn}: {cpu:.3f} CPU-s, {mib:.1f} MiB", file=sys.stderr)
                if turn:
                    figures[way]["cpu"].append(cpu)
                    figures[way]["mib"].append(mib)
    finally:
        streamed_files.dictionary_columns = chosen
    medians = {
        w: {k: round(statistics.median(v), 3) for k, v in f.items()} for w, f in figures.items()
    }
    ours, theirs = medians["chosen"], medians["every column"]
    return {
        "records": sum(b.num_rows for b in batches),
        "medians": medians,
        "ratios": {k: round(theirs[k] / ours[k], 2) for k in ("cpu", "mib")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--turns", type=int, default=7, help="turns counted (default 7)")
    parser.add_argument("--quick", action="store_true", help="200,000 records, three turns")
    args = parser.parse_args()
    if args.quick:
        args.records, args.turns = 200_000, 3
    if args.records < 1 or args.turns < 1:
        parser.error("--records and --turns must be 1 or more")
    info = run_info()
    with tempfile.TemporaryDirectory(prefix="icefall-bench-dictionary-") as tmp:
        found = run(args.records, args.turns, Path(tmp))
    m, r = found["medians"], found["ratios"]
    print(
        f"{info['date']}, {info['machine']['cpu']} (nproc {info['machine']['nproc']}), "
        f"`{info['command']}`: {found['records']:,} records, {args.turns} turns, medians:\n\n"
        "| Parquet dictionaries | write CPU-s | Parquet MiB |\n|---|---|---|\n"
        + "\n".join(f"| {w} | {m[w]['cpu']} | {m[w]['mib']} |" for w in WAYS)
        + f"\n| every column / chosen | {r['cpu']} × | {r['mib']} × |"
    )
    print(f"write CPU-s, every column / chosen: {r['cpu']} × (Parquet bytes {r['mib']} ×)")


if __name__ == "__main__":
    main()
