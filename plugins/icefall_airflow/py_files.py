"""The project's Python code for a Spark cluster's executors: ``--py-files`` of every job.

On ``local[*]`` the executors are this machine's Python workers and import the
installed package. On a cluster (any master but ``local``) they run on other
machines, whose Python may have another version of Icefall or none: each job
then ships a zip of the two packages its tasks import (``broker`` and
``spark_jobs``), built here from the code the driver runs, so driver and executors
always agree. PySpark puts a ``--py-files`` zip ahead of site-packages on
the executors.

The zip is named by a hash of its content and built once per version of the code
(in ``$ICEFALL_SPARK_PY_FILES_DIR``, default ``$ICEFALL_HOME/spark-py-files``), atomically,
so concurrent tasks share it. Its code runs on every executor, so nobody else may plant it:
the folder is created 0700, and a zip found there is reused only if this user owns it (and
the folder), no one else can write either, and its entries hash to the name it has; anything
else is rebuilt (not a shared temporary directory with a predictable name).
Python cannot import C extensions from a zip: the
executors then decode with the pure-Python fallbacks of ``spark_jobs._kafka_records``
and ``spark_jobs._avro_columns`` (slower). Where the executors' Python has the
same Icefall installed (one image for Airflow and the Spark workers, as in
docker-compose.yml), set ``ICEFALL_SPARK_PY_FILES=none`` to ship nothing and keep
them; or name your own files there (comma-separated).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import zipfile
from pathlib import Path

PY_FILES_ENV = "ICEFALL_SPARK_PY_FILES"
PY_FILES_DIR_ENV = "ICEFALL_SPARK_PY_FILES_DIR"
NONE = "none"
PACKAGES = ("broker", "spark_jobs")


def _package_files(package: str) -> list[tuple[str, Path]]:
    """(name in the zip, path) of every ``.py`` file of an installed package."""
    import importlib

    root = Path(importlib.import_module(package).__file__ or "").resolve().parent
    return sorted(
        (f"{package}/{path.relative_to(root).as_posix()}", path)
        for path in root.rglob("*.py")
        if "__pycache__" not in path.parts
    )


def _content_digest(contents: list[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for name, data in contents:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _private(path: Path) -> bool:
    """Owned by this user and writable by no one else (so no one else can have planted it)."""
    info = path.lstat()
    return (
        not stat.S_ISLNK(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _reusable(target: Path, expected: str) -> bool:
    """``target`` is ours, no one else can write it or its folder, and it holds the code."""
    if not (target.is_file() and _private(target) and _private(target.parent)):
        return False
    try:
        with zipfile.ZipFile(target) as zf:
            found = [(info.filename, zf.read(info)) for info in zf.infolist()]
    except (OSError, zipfile.BadZipFile):
        return False
    return _content_digest(found) == expected


def default_folder() -> Path:
    from broker.config import BrokerConfig

    return BrokerConfig().home / "spark-py-files"


def build_zip(folder: Path | None = None) -> Path:
    """The zip of ``PACKAGES`` as this process imports them, built if it is not there yet."""
    files = [entry for package in PACKAGES for entry in _package_files(package)]
    contents = [(name, path.read_bytes()) for name, path in files]
    expected = _content_digest(contents)
    folder = folder or Path(os.environ.get(PY_FILES_DIR_ENV) or default_folder())
    target = folder / f"icefall-py-files-{expected[:16]}.zip"
    if _reusable(target, expected):
        return target
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _private(folder):
        raise PermissionError(
            f"{folder} (the Spark jobs' code zip) must be owned by this user and writable by "
            f"no one else; set {PY_FILES_DIR_ENV} to a private directory"
        )
    fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in contents:
                # a fixed date: the same code gives the same bytes
                zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
        os.replace(tmp, target)  # mkstemp made it 0600
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


def py_files_for(master: str) -> str | None:
    """``--py-files`` for a job on ``master``: none on ``local``; else ``$ICEFALL_SPARK_PY_FILES``
    (``none``: ship nothing), else the zip of the code."""
    if is_local(master):
        return None
    setting = os.environ.get(PY_FILES_ENV, "").strip()
    if setting.lower() == NONE:
        return None
    if setting:
        missing = [p for p in setting.split(",") if p.strip() and not Path(p.strip()).is_file()]
        if missing:
            raise FileNotFoundError(f"{PY_FILES_ENV} names files that do not exist: {missing}")
        return setting
    return str(build_zip())
