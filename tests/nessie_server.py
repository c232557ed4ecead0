"""Project Nessie's own server for the tests of ``automq.table.topic.catalog.type=nessie``.

The server is the ``nessie-quarkus`` runner jar from Maven Central (tests/jvm/nessie, fetched by
``make test``), started as a process with an in-memory version store, so nothing outlives it.
Its Iceberg REST endpoint (``/iceberg``) only takes object-store warehouses (a ``file:`` one is
refused: "Unknown or unsupported scheme: file"), so the warehouse is a bucket on moto's S3 server.

Nessie 0.99 is built for Java 21: the process runs on the first Java 21+ found (``NESSIE_JAVA``,
``JAVA_HOME``, ``java`` on PATH, then ``/usr/lib/jvm/*``), and says so when there is none.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import MOTO_CREDENTIALS, MotoS3, ServerProcess
from tests.support import free_port

NESSIE_JARS = Path(sys.prefix) / "share" / "icefall" / "test-jars" / "nessie"
NESSIE_MIN_JAVA = 21


def java_major(java: str) -> int | None:
    """The feature version ``java -version`` reports (17, 21, 25), or None when it does not run."""
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except OSError:
        return None
    found = re.search(r'version "(\d+)', out)
    return int(found.group(1)) if found else None


def nessie_java() -> str:
    """A ``java`` executable new enough for Nessie's server."""
    candidates = [
        os.environ.get("NESSIE_JAVA"),
        os.path.join(os.environ["JAVA_HOME"], "bin", "java") if "JAVA_HOME" in os.environ else None,
        shutil.which("java"),
        *sorted(str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java")),
    ]
    for java in candidates:
        if java and (java_major(java) or 0) >= NESSIE_MIN_JAVA:
            return java
    raise RuntimeError(
        f"Nessie's server needs Java {NESSIE_MIN_JAVA}+ and none was found (NESSIE_JAVA, "
        "JAVA_HOME, PATH, /usr/lib/jvm): install one or set NESSIE_JAVA"
    )


class NessieServer(ServerProcess):
    """Nessie on a free port, its default warehouse ``s3://BUCKET/warehouse`` on ``moto``."""

    def __init__(self, folder: Path, moto: MotoS3, bucket: str) -> None:
        jars = sorted(NESSIE_JARS.glob("nessie-quarkus-*-runner.jar"))
        if not (NESSIE_JARS / ".pinned").exists() or not jars:
            raise RuntimeError(f"Nessie's server jar is not in {NESSIE_JARS}: run `make test`")
        self.port = free_port()
        self.warehouse = f"s3://{bucket}/warehouse"
        self.log_path = folder / "nessie.log"
        s3 = "nessie.catalog.service.s3.default-options"
        settings = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "quarkus.management.port": str(free_port()),
            "quarkus.management.host": "127.0.0.1",
            "quarkus.otel.sdk.disabled": "true",
            "nessie.version.store.type": "IN_MEMORY",
            "nessie.catalog.default-warehouse": "warehouse",
            "nessie.catalog.warehouses.warehouse.location": self.warehouse,
            f"{s3}.endpoint": moto.endpoint + "/",
            f"{s3}.path-style-access": "true",
            f"{s3}.region": MOTO_CREDENTIALS["AWS_REGION"],
            # Nessie takes its S3 keys as a secret reference, resolved from these two settings.
            f"{s3}.access-key": "urn:nessie-secret:quarkus:icefall-s3",
            "icefall-s3.name": MOTO_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "icefall-s3.secret": MOTO_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        }
        command = [
            nessie_java(),
            "-Xmx512m",
            *(f"-D{key}={value}" for key, value in settings.items()),
            "-jar",
            str(jars[-1]),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **MOTO_CREDENTIALS},
            )

    @property
    def api_uri(self) -> str:
        """Nessie's own API (v2): Iceberg's ``NessieCatalog`` takes this as its ``uri``."""
        return f"http://127.0.0.1:{self.port}/api/v2"

    @property
    def iceberg_uri(self) -> str:
        """Nessie's Iceberg REST endpoint on branch ``main``."""
        return f"http://127.0.0.1:{self.port}/iceberg/main"

    def wait_ready(self, timeout: float = 90.0) -> None:
        self.wait_http(self.api_uri + "/config", "Nessie's server", timeout, interval=0.3)
