"""What a job ships to a cluster's executors (``icefall_airflow.py_files``): nothing on ``local``;
on a cluster a zip of ``broker`` and ``spark_jobs`` as the driver imports them, built once per
version of the code, unless ``ICEFALL_SPARK_PY_FILES`` says otherwise. The zip at work on a real
cluster: tests/e2e/test_spark_cluster.py."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from icefall_airflow import py_files


def test_the_zip_holds_the_code_the_driver_imports_and_is_built_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import spark_jobs

    monkeypatch.setenv(py_files.PY_FILES_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(py_files.PY_FILES_ENV, raising=False)
    built = Path(py_files.py_files_for("spark://127.0.0.1:7077") or "")
    assert built.parent == tmp_path and built.suffix == ".zip"
    with zipfile.ZipFile(built) as zf:
        names = set(zf.namelist())
        source = Path(spark_jobs.__file__).parent / "commit_round.py"
        assert zf.read("spark_jobs/commit_round.py") == source.read_bytes()
    assert {"broker/__init__.py", "broker/config.py", "spark_jobs/rounds/tasks.py"} <= names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    stamp = built.stat().st_mtime_ns
    assert py_files.build_zip(tmp_path) == built and built.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no partial file left


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "local-cluster[2,1,1024]"])
def test_local_masters_ship_nothing(master: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(py_files.PY_FILES_ENV, raising=False)
    assert py_files.py_files_for(master) is None


def test_the_setting_ships_nothing_or_named_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(py_files.PY_FILES_ENV, "none")
    assert py_files.py_files_for("spark://master:7077") is None
    own = tmp_path / "deps.zip"
    own.write_bytes(b"")
    monkeypatch.setenv(py_files.PY_FILES_ENV, str(own))
    assert py_files.py_files_for("spark://master:7077") == str(own)
    monkeypatch.setenv(py_files.PY_FILES_ENV, f"{own},{tmp_path / 'missing.zip'}")
    with pytest.raises(FileNotFoundError, match="missing.zip"):
        py_files.py_files_for("spark://master:7077")


def test_the_zip_is_private_and_a_planted_one_is_not_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its code runs on every executor: built in a 0700 folder under ICEFALL_HOME (not a shared
    temporary directory), and a zip someone else could have written is rebuilt, not shipped."""
    monkeypatch.delenv(py_files.PY_FILES_DIR_ENV, raising=False)
    monkeypatch.setenv("ICEFALL_HOME", str(tmp_path / "home"))
    built = py_files.build_zip()
    assert built.parent == tmp_path / "home" / "spark-py-files"
    assert built.parent.stat().st_mode & 0o777 == 0o700
    assert built.stat().st_mode & 0o077 == 0
    good = built.read_bytes()

    # the same name, other code: rebuilt from the driver's code
    with zipfile.ZipFile(built, "w") as zf:
        zf.writestr("spark_jobs/commit_round.py", "import os; os.system('evil')\n")
    assert py_files.build_zip() == built and built.read_bytes() == good
    # writable by others: not trusted even with the right content, rebuilt private
    built.chmod(0o666)
    assert py_files.build_zip() == built and built.stat().st_mode & 0o077 == 0
    # a folder others can write is refused with the reason
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(PermissionError, match="writable by no one else"):
        py_files.build_zip(shared)
