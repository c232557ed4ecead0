"""What every Icefall Spark job leaves behind for Airflow: a result JSON and one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def error_message(exc: BaseException) -> str:
    """One readable line: a JVM error without its Java stack trace."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        return f"{java.getClass().getName()}: {java.getMessage()}"
    desc = getattr(exc, "desc", None)  # pyspark's AnalysisException and friends
    if isinstance(desc, str):
        return f"{type(exc).__name__}: {desc.splitlines()[0] if desc else ''}"
    return f"{type(exc).__name__}: {exc}"


def write_result(path: Path, result: Any) -> None:
    """The result JSON, replaced atomically: a reader (the DAG's commit task) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, path)
