"""Which jars Spark gets: the ones pinned from Maven Central (spark_jobs/jvm), or ICEFALL_ICEBERG_JARS."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from spark_jobs import jars


def test_default_is_the_pinned_runtime_and_aws_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jars.ENV, raising=False)
    monkeypatch.delenv(jars.DIR_ENV, raising=False)
    paths = jars.iceberg_jars()
    runtime = next(p for p in paths if Path(p).name.startswith("iceberg-spark-runtime-"))
    bundle = next(p for p in paths if Path(p).name.startswith("iceberg-aws-bundle-"))
    assert Path(runtime).name.startswith(f"iceberg-spark-runtime-3.5_{jars.scala_version()}-1.10.")
    assert Path(bundle).name.startswith("iceberg-aws-bundle-1.10.")
    with zipfile.ZipFile(runtime) as zf:  # the runtime also carries the SQL extensions class
        assert (
            "org/apache/iceberg/spark/extensions/IcebergSparkSessionExtensions.class"
            in zf.namelist()
        )
        assert "org/apache/iceberg/aws/s3/S3FileIO.class" in zf.namelist()
    with zipfile.ZipFile(bundle) as zf:  # the AWS SDK v2 S3FileIO needs comes from the bundle
        assert "software/amazon/awssdk/services/s3/S3Client.class" in zf.namelist()


def test_the_jars_match_the_committed_checksums() -> None:
    pinned = {
        name: digest
        for digest, name in (
            line.split() for line in jars.CHECKSUMS.read_text().splitlines() if line.strip()
        )
    }
    for path in jars.iceberg_jars():
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        assert pinned[Path(path).name] == digest, path


def test_the_pom_pins_what_the_checksums_name() -> None:
    pom = (jars.JVM_DIR / "pom.xml").read_text()
    version = pom.split("<iceberg.version>")[1].split("<")[0]
    pinned = jars.pinned_jar_names()
    assert f"iceberg-aws-bundle-{version}.jar" in pinned
    assert f"iceberg-spark-runtime-3.5_2.12-{version}.jar" in pinned
    for name in pinned:  # every other pinned jar is named in the pom by artifact and version
        if not name.startswith("iceberg-"):
            artifact, _, jar_version = name.removesuffix(".jar").rpartition("-")
            assert f"<artifactId>{artifact}</artifactId>" in pom, name
            assert f"<version>{jar_version}</version>" in pom, name


def test_missing_jars_say_how_to_get_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(jars.ENV, raising=False)
    monkeypatch.setenv(jars.DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make setup"):
        jars.iceberg_jars()


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b = tmp_path / "a.jar", tmp_path / "b.jar"
    a.write_bytes(b"")
    b.write_bytes(b"")
    monkeypatch.setenv(jars.ENV, f"{a}, {b}")
    assert jars.iceberg_jars() == [str(a), str(b)]
    monkeypatch.setenv(jars.ENV, str(tmp_path / "missing.jar"))
    with pytest.raises(FileNotFoundError, match="missing.jar"):
        jars.iceberg_jars()
