"""Micro-benchmark: ``RowConverter.convert`` on the commit round's workload, general path vs C columns.

The values are those of ``bench/commit_round.py``: ~500-byte Confluent wire-format
Avro records of its 16-field ``PageEvent`` schema (string keys, no headers), in
chunks of ``segments.DEFAULT_CHUNK_RECORDS``, into a table with exactly the
round's schema (``avro_schema.table_schema``, flavor ``spark``). Both paths run
in the same process on the same chunks, and their batches are checked equal.

Figures: records/s and MiB/s of value bytes, from CPU time of this (single-
threaded) process, best of ``--repeat`` passes (the machine may be shared; CPU
time holds up better than wall time): for the whole ``convert`` and for the
value column alone (``RowConverter._column``, the part the C decoder replaces).

    .venv/bin/python bench/avro_decode.py [--records 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.commit_round import SCHEMA, _tails, _zigzag_varint
from spark_jobs.decode import avro_columns, avro_schema
from spark_jobs.decode.rows import RowConverter
from spark_jobs.decode.segments import DEFAULT_CHUNK_RECORDS, RecordChunk

MIB = 1024 * 1024
SCHEMA_ID = 1


def workload(records: int) -> list[RecordChunk]:
    tails, keys = _tails(min(records, 32_768))
    header = b"\x00" + struct.pack(">I", SCHEMA_ID)
    now_ms = int(time.time() * 1000)
    chunks = []
    for start in range(0, records, DEFAULT_CHUNK_RECORDS):
        n = min(DEFAULT_CHUNK_RECORDS, records - start)
        offsets = list(range(start, start + n))
        values: list[bytes | None] = [
            header + _zigzag_varint(o) + _zigzag_varint(now_ms + o) + tails[o % len(tails)]
            for o in offsets
        ]
        chunk_keys: list[bytes | None] = [keys[o % len(keys)] for o in offsets]
        chunks.append(
            RecordChunk(0, offsets, [now_ms + o for o in offsets], chunk_keys, values, [()] * n)
        )
    return chunks


def best_cpu(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not avro_columns.available():
        sys.exit("spark_jobs._avro_columns is not built: pip install -e . first")

    chunks = workload(args.records)
    value_bytes = sum(len(v) for c in chunks for v in c.values if v is not None)
    records = sum(len(c) for c in chunks)
    table = avro_schema.table_schema(SCHEMA)
    lookup = {SCHEMA_ID: SCHEMA}.__getitem__
    converters = {
        "python": RowConverter(table, lookup, flavor="spark", use_extension=False),
        "c": RowConverter(table, lookup, flavor="spark"),
    }
    for converter in converters.values():  # warm up (plans, imports) and compare
        converter.convert(chunks[0])
    a, b = (c.convert(chunks[0]) for c in converters.values())
    assert a.batch.equals(b.batch) and a.errors == b.errors == [], "the two paths disagree"

    print(
        f"{records} records, {value_bytes / records:.0f} B mean value, {value_bytes / MIB:.1f} MiB, "
        f"{len(SCHEMA['fields'])} fields, chunks of {DEFAULT_CHUNK_RECORDS}; best of {args.repeat}, CPU time"
    )
    results: dict[tuple[str, str], float] = {}
    for what in ("convert", "value column"):
        for name, converter in converters.items():
            if what == "convert":

                def run(c: RowConverter = converter) -> None:
                    for chunk in chunks:
                        c.convert(chunk)
            else:

                def run(c: RowConverter = converter) -> None:
                    for chunk in chunks:
                        c._column(chunk, "value", c.value_type, chunk.values, c.value_target, {})

            seconds = best_cpu(run, args.repeat)
            results[(what, name)] = seconds
            print(
                f"  {what:<13} {name:<7} {records / seconds:>12,.0f} records/s  "
                f"{value_bytes / MIB / seconds:>8.1f} MiB/s"
                f"  {seconds / records * 1e6:>6.2f} µs/record"
            )
        ratio = results[(what, "python")] / results[(what, "c")]
        print(f"  {what:<13} C / Python: {ratio:.1f}x")


if __name__ == "__main__":
    main()
