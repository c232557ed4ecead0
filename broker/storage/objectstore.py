"""Segment object storage: a local directory (the embedded default) or S3.

The interface is synchronous and small on purpose: the broker calls it from a
worker thread, and the Spark executors call it directly to read byte ranges.

``read_block`` is the broker's read of a block of a segment object for its block cache (and
so for every Fetch). From S3 it is ``get_range``. From a local directory it is the file's
pages mapped read-only (``mmap``, populated in the worker thread): a Fetch then hands slices
of the page cache to the socket, as Kafka's ``sendfile`` does, where a ``pread`` copied each
8 MiB block into a fresh ``bytes`` first (an allocation, its page faults and the copy). With
Kafka's own ``kafka-consumer-perf-test`` reading 1 GB round the partitions, the mapping cut the
broker's CPU by a fifth (bench/BENCHMARKS.md). A segment object is never written in place
(``put`` writes a new file and renames it), so a mapping never sees its bytes change; one
whose file is deleted (retention, DeleteRecords) keeps the pages until its last slice is gone,
as an open file does.

What a mapping changes: a segment file truncated in place by something other than the broker,
or a disk read error on a page the kernel had dropped, is a SIGBUS that ends the broker, where
a ``pread`` was an error for that one Fetch. Kafka maps its index files with the same exposure.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import uuid
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from broker.config import ObjectStoreConfig

# Linux: fault the mapped pages in at mmap time (Python has the flag on Linux only)
_MAP_POPULATE: int = getattr(mmap, "MAP_POPULATE", 0)
# LocalObjectStore.read_block maps ranges of at least this size and reads smaller ones
MMAP_MIN_BYTES = 1024 * 1024


class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object."""
        ...

    def read_block(self, key: str, start: int, end: int) -> bytes | memoryview:
        """Bytes [start, end) of an object (fewer where the object ends), as a read-only
        buffer the caller keeps: the broker's block cache reads with this."""
        ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str) -> list[str]: ...

    def list_ages(self, prefix: str) -> dict[str, float]:
        """Each object's age in seconds, by the store's own clock: its modification time
        (S3's ``LastModified``, a file's mtime) against the store's time now. Brokers' clocks
        never meet here (the orphan sweep decides with it which objects may still be
        committed by another broker)."""
        ...

    def describe(self) -> str: ...


class LocalObjectStore:
    """Objects as files under a root directory, written atomically (tmp + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"object key escapes the store: {key!r}")
        return path

    def put(self, key: str, data: bytes) -> None:
        """A put that fails (ENOSPC on a full disk) leaves no partial file taking the room
        the flusher's retry needs; the caller keeps the data (the WAL holds it)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        fd = os.open(self._path(key), os.O_RDONLY)
        try:
            return os.pread(fd, end - start, start)
        finally:
            os.close(fd)

    def read_block(self, key: str, start: int, end: int) -> bytes | memoryview:
        """The file's pages [start, end) mapped read-only and populated now (in the caller's
        worker thread, not on first touch in the event loop). A range under ``MMAP_MIN_BYTES``
        is read (``pread``): each mapping holds a file descriptor of its own, and small
        segment objects (a quiet topic's flushes) would fill the block cache with thousands."""
        fd = os.open(self._path(key), os.O_RDONLY)
        try:
            end = min(end, os.fstat(fd).st_size)
            if end - start < MMAP_MIN_BYTES or start % mmap.ALLOCATIONGRANULARITY:
                return os.pread(fd, max(end - start, 0), start)
            mapped = mmap.mmap(
                fd,
                end - start,
                flags=mmap.MAP_SHARED | _MAP_POPULATE,
                prot=mmap.PROT_READ,
                offset=start,
            )
        finally:
            os.close(fd)  # the mapping keeps the pages (and mmap a descriptor of its own)
        return memoryview(mapped)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def list(self, prefix: str) -> list[str]:
        return sorted(
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_file()
            and not p.name.endswith(".tmp")
            and str(p.relative_to(self.root)).startswith(prefix)
        )

    def list_ages(self, prefix: str) -> dict[str, float]:
        mtimes = {}
        for key in self.list(prefix):
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                mtimes[key] = (self.root / key).stat().st_mtime
        # the directory's "now": a probe file's mtime, set by whatever sets the objects' (a
        # shared file server's clock, not this broker's); .tmp files are never listed
        probe = self.root / f".clock-{uuid.uuid4().hex}.tmp"
        try:
            probe.touch()
            now = probe.stat().st_mtime
        except OSError:  # a read-only root: this machine's clock
            now = time.time()
        finally:
            probe.unlink(missing_ok=True)
        return {key: now - mtime for key, mtime in mtimes.items()}

    def describe(self) -> str:
        return str(self.root)


class S3ObjectStore:
    """Objects under ``s3://bucket/prefix`` (AWS, MinIO or moto's server)."""

    def __init__(self, config: ObjectStoreConfig) -> None:
        import boto3
        from botocore.config import Config

        parsed = urlparse(config.url)
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.url = config.url
        self.client = boto3.client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region or "us-east-1",
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_access_key,
            config=Config(retries={"max_attempts": 5, "mode": "standard"}),
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        response = self.client.get_object(
            Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}"
        )
        body: bytes = response["Body"].read()
        return body

    def read_block(self, key: str, start: int, end: int) -> bytes | memoryview:
        return self.get_range(key, start, end)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def list_ages(self, prefix: str) -> dict[str, float]:
        ages: dict[str, float] = {}
        strip = len(self.prefix) + 1 if self.prefix else 0
        now: float | None = None
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            if now is None:  # the server's time at the first page (its HTTP Date header)
                date = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
                now = parsedate_to_datetime(date).timestamp() if date else time.time()
            for obj in page.get("Contents", []):
                ages[obj["Key"][strip:]] = now - obj["LastModified"].timestamp()
        return ages

    def describe(self) -> str:
        return self.url


def open_object_store(config: ObjectStoreConfig) -> ObjectStore:
    if config.is_s3:
        return S3ObjectStore(config)
    parsed = urlparse(config.url)
    return LocalObjectStore(Path(parsed.path if parsed.scheme == "file" else config.url))


def check_s3_location(
    url: str,
    setting: str,
    endpoint_url: str | None,
    region: str | None,
    access_key_id: str | None,
    secret_access_key: str | None,
) -> tuple[int, str] | None:
    """Ask S3 once, at start, whether ``url``'s bucket is there for these credentials: None
    when it is, else the log level and a message naming the setting.

    A missing bucket or refused credentials are ERRORs in the broker's log at start (every
    flush or table create would fail the same way later), yet the broker still starts: a
    bucket created a moment later (an init container) or fixed credentials let it catch up,
    and acknowledged data waits in the WAL meanwhile. A server that does not answer is a
    WARNING: it may be an outage the WAL rides out."""
    import logging

    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    bucket = urlparse(url).netloc
    where = endpoint_url or "AWS"
    # A session of its own: boto3's default session keeps the credentials it found first, and
    # this check is about the ones the process has now.
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region or "us-east-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=Config(connect_timeout=3, read_timeout=5, retries={"max_attempts": 1}),
    )
    try:
        client.head_bucket(Bucket=bucket)
    except NoCredentialsError:
        return logging.ERROR, (
            f"{setting}={url}: no AWS credentials (set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or a profile)"
        )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return logging.ERROR, (
                f"{setting}={url}: bucket '{bucket}' does not exist at {where}; "
                "nothing can be written there until it does"
            )
        if code in (
            "403",
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "Forbidden",
        ):
            return logging.ERROR, (
                f"{setting}={url}: {where} refuses these credentials for bucket "
                f"'{bucket}' ({code}; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
            )
        return logging.WARNING, f"{setting}={url}: {where} answered {code} for bucket '{bucket}'"
    except BotoCoreError as exc:
        return logging.WARNING, (
            f"{setting}={url}: cannot reach {where} ({exc}; the endpoint comes from "
            "AWS_ENDPOINT_URL or object.store.endpoint); acknowledged data "
            "waits in the WAL until it can"
        )
    return None
