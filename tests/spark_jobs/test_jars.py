"""Which Iceberg jars Spark gets: the pinned wheel's runtime, or ICEFALL_ICEBERG_JARS."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from spark_jobs import jars


def test_default_is_the_wheels_runtime_for_pysparks_scala(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jars.ENV, raising=False)
    (jar,) = jars.iceberg_jars()
    name = Path(jar).name
    assert name.startswith(f"iceberg-spark-runtime-3.5_{jars.scala_version()}-1.10.")
    with zipfile.ZipFile(jar) as zf:  # the runtime also carries the SQL extensions class
        assert "org/apache/iceberg/spark/extensions/IcebergSparkSessionExtensions.class" in zf.namelist()


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b = tmp_path / "a.jar", tmp_path / "b.jar"
    a.write_bytes(b"")
    b.write_bytes(b"")
    monkeypatch.setenv(jars.ENV, f"{a}, {b}")
    assert jars.iceberg_jars() == [str(a), str(b)]
    monkeypatch.setenv(jars.ENV, str(tmp_path / "missing.jar"))
    with pytest.raises(FileNotFoundError, match="missing.jar"):
        jars.iceberg_jars()
