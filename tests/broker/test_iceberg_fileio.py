"""broker.iceberg_fileio on moto's S3 server: a small file pyiceberg writes is one PutObject, a
large one still a multipart upload, both read back whole; a write that fails says so at the
latest when the file closes; every catalog Icefall opens uses it unless told otherwise."""

from __future__ import annotations

import os

import pytest
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
    settings: dict[str, object] = io.fs_by_scheme("s3", "any-bucket").__reduce__()[1][0]
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
