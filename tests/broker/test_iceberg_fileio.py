"""broker.iceberg_fileio on moto's S3 server: a small file pyiceberg writes is one PutObject, a
large one still a multipart upload, both read back whole; a write that fails says so at the
latest when the file closes; every catalog Icefall opens uses it unless told otherwise; pyarrow's
FileIO is made at the first file, not before; table loads share one file system and its
connections, but not with a forked child."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from pyarrow.fs import FileSystem
from pyiceberg.io import FileIO, load_file_io

from broker.contracts import ICEFALL_FILE_IO, CatalogSpec, with_default_io
from broker.iceberg_fileio import IcefallFileIO
from tests.conftest import MOTO_CREDENTIALS, MotoS3

MIB = 1 << 20


def s3_io(moto_s3: MotoS3, **extra: str) -> FileIO:
    return load_file_io(
        with_default_io(
            {
                "s3.endpoint": moto_s3.endpoint,
                "s3.region": "us-east-1",
                "s3.access-key-id": MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                "s3.secret-access-key": MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                **extra,
            }
        ),
        "s3://",
    )


def write(io: FileIO, location: str, data: bytes) -> None:
    with io.new_output(location).create(overwrite=True) as out:
        out.write(data)


def read(io: FileIO, location: str) -> bytes:
    with io.new_input(location).open() as f:
        return f.read()


def test_a_small_file_is_one_put_and_a_large_one_multipart(moto_s3: MotoS3, s3_bucket: str) -> None:
    io = s3_io(moto_s3)
    assert isinstance(io, IcefallFileIO)
    small, large = os.urandom(200_000), os.urandom(12 * MIB)  # pyarrow's parts are 10 MB
    write(io, f"s3://{s3_bucket}/t/metadata/00001.metadata.json", small)
    write(io, f"s3://{s3_bucket}/t/data/big.parquet", large)

    seen = moto_s3.requests_seen(s3_bucket)
    on_small = [r for r in seen if "00001.metadata.json" in r]
    assert on_small == [f"PUT /{s3_bucket}/t/metadata/00001.metadata.json"], on_small
    on_large = [r for r in seen if "big.parquet" in r]
    assert on_large[0] == f"POST /{s3_bucket}/t/data/big.parquet?uploads", on_large
    assert sum("partNumber=" in r for r in on_large) >= 2, on_large

    assert read(io, f"s3://{s3_bucket}/t/metadata/00001.metadata.json") == small
    assert read(io, f"s3://{s3_bucket}/t/data/big.parquet") == large


def test_a_write_to_a_missing_bucket_fails_when_the_file_closes(moto_s3: MotoS3) -> None:
    io = s3_io(moto_s3)
    with pytest.raises(OSError, match="NO_SUCH_BUCKET"):
        write(io, "s3://icefall-no-such-bucket/t/x.json", b"{}")


def delayed_open(io: FileIO) -> bool:
    assert isinstance(io, IcefallFileIO)
    settings: dict[str, object] = (
        io.pyarrow_io().fs_by_scheme("s3", "any-bucket").__reduce__()[1][0]
    )
    return bool(settings["allow_delayed_open"])


def test_a_custom_retry_strategy_keeps_pyicebergs_file_system(moto_s3: MotoS3) -> None:
    """pyarrow's pickling cannot carry a retry strategy: that file system is left as made."""
    retrying = s3_io(moto_s3, **{"s3.retry-strategy-impl": "pyarrow.fs.AwsDefaultS3RetryStrategy"})
    assert not delayed_open(retrying)
    assert delayed_open(s3_io(moto_s3))


@pytest.mark.parametrize(
    "spec",
    [
        CatalogSpec(type="rest", uri="http://127.0.0.1:8181"),
        CatalogSpec(type="glue", warehouse="s3://lake/wh", builtin=False),
        CatalogSpec(type="nessie", uri="http://127.0.0.1:19120/api/v2"),
        CatalogSpec(
            type="tablebucket", warehouse="arn:aws:s3tables:us-east-1:123456789012:bucket/lake"
        ),
    ],
    ids=lambda spec: spec.type,
)
def test_every_catalog_icefall_opens_uses_it_unless_told_otherwise(spec: CatalogSpec) -> None:
    assert spec.pyiceberg_properties(env={})["py-io-impl"] == ICEFALL_FILE_IO
    own = spec.model_copy(
        update={"properties": {**spec.properties, "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO"}}
    )
    assert own.pyiceberg_properties(env={})["py-io-impl"] == "pyiceberg.io.fsspec.FsspecFileIO"


def test_pyarrows_fileio_is_made_at_the_first_file(tmp_path: Path) -> None:
    """pyiceberg makes a table's FileIO at every load_table, and a round with nothing new opens
    no file: neither pays for pyarrow's FileIO module (pyarrow.dataset, pandas) before a file
    is opened (a fresh interpreter: nothing imported it before)."""
    probe = f"""
import sys
from pyiceberg.io import load_file_io
from broker.contracts import with_default_io
io = load_file_io(with_default_io({{}}), "file://{tmp_path}")
assert type(io).__name__ == "IcefallFileIO", type(io)
print("before", "pyiceberg.io.pyarrow" in sys.modules, "pandas" in sys.modules)
with io.new_output("{tmp_path}/a.json").create() as out:
    out.write(b"{{}}")
print("after", "pyiceberg.io.pyarrow" in sys.modules, type(io.pyarrow_io()).__name__)
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.split("\n")
    assert out[:2] == ["before False False", "after True DelayedOpenFileIO"], out
    assert (tmp_path / "a.json").read_bytes() == b"{}"


def test_it_reads_deletes_and_pickles_as_its_properties(tmp_path: Path) -> None:
    io = load_file_io(with_default_io({"some.property": "x"}), f"file://{tmp_path}")
    assert isinstance(io, IcefallFileIO)
    write(io, f"{tmp_path}/a.bin", b"payload")
    copy = pickle.loads(pickle.dumps(io))
    assert isinstance(copy, IcefallFileIO) and copy.properties == io.properties
    assert read(copy, f"{tmp_path}/a.bin") == b"payload"
    copy.delete(f"{tmp_path}/a.bin")
    assert not (tmp_path / "a.bin").exists()
    assert not io.new_input(f"{tmp_path}/a.bin").exists()


def test_fileios_of_the_same_properties_share_one_pyarrow_fileio(tmp_path: Path) -> None:
    first = load_file_io(with_default_io({"some.property": "x"}), f"file://{tmp_path}")
    again = load_file_io(with_default_io({"some.property": "x"}), f"file://{tmp_path}")
    other = load_file_io(with_default_io({"some.property": "y"}), f"file://{tmp_path}")
    assert isinstance(first, IcefallFileIO) and isinstance(again, IcefallFileIO)
    assert isinstance(other, IcefallFileIO)
    assert again.pyarrow_io() is first.pyarrow_io()
    assert other.pyarrow_io() is not first.pyarrow_io()
    shared = first.pyarrow_io()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the AWS SDK is not fork-safe, so nothing is shared into it
        try:
            os.close(reader)
            child = load_file_io(with_default_io({"some.property": "x"}), f"file://{tmp_path}")
            assert isinstance(child, IcefallFileIO)
            told = b"own" if child.pyarrow_io() is not shared else b"shared"
            # a FileIO made before the fork makes its own too
            told += b" own" if first.pyarrow_io() is not shared else b" shared"
            os.write(writer, told)
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as answer:
        told = answer.read()
    os.waitpid(pid, 0)
    assert told == b"own own"
    assert first.pyarrow_io() is shared  # the parent's stays


def test_table_loads_on_s3_share_one_file_system(
    moto_s3: MotoS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyiceberg makes a FileIO at every load_table; its SQL catalog (the broker's own) reads the
    table's metadata file through it. With a file system each, every load made an AWS client
    and opened a connection (on AWS a TLS handshake) for that one file. (moto's server closes
    every connection, so the connections themselves cannot be counted here.)"""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from broker.pyarrow_fileio import DelayedOpenFileIO

    made: list[str | None] = []
    make = DelayedOpenFileIO._initialize_s3_fs

    def counted(self: DelayedOpenFileIO, netloc: str | None) -> FileSystem:
        made.append(netloc)
        return make(self, netloc)

    monkeypatch.setattr(DelayedOpenFileIO, "_initialize_s3_fs", counted)
    catalog = SqlCatalog(
        "loads",
        **with_default_io(
            {
                "uri": f"sqlite:///{moto_s3.log_path.parent / f'{s3_bucket}.db'}",
                "warehouse": f"s3://{s3_bucket}/warehouse",
                "s3.endpoint": moto_s3.endpoint,
                "s3.region": "us-east-1",
                "s3.access-key-id": MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                "s3.secret-access-key": MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            }
        ),
    )
    catalog.create_namespace("n")
    table = catalog.create_table("n.t", pa.schema([("a", pa.int64())]))
    table.append(pa.table({"a": [1, 2, 3]}))
    for _ in range(20):
        assert catalog.load_table("n.t").scan().to_arrow().num_rows == 3
    # the table's FileIO properties (the catalog's and the table's) are the same at each load
    # after the first commit; before it, the new table's own: two sets, one file system each
    assert made == [s3_bucket] * len(made) and 1 <= len(made) <= 2, made
