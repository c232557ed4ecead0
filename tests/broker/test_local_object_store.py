"""The local object store's block reads: large ranges mapped (the page cache's bytes, no copy
into the broker), small ones read; a mapping keeps its bytes when the object is deleted or
replaced, as the block cache needs while a Fetch response is still being written."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from broker.storage import objectstore
from broker.storage.objectstore import LocalObjectStore

MIB = 1024 * 1024


def _store_with(tmp_path: Path, size: int) -> tuple[LocalObjectStore, bytes]:
    store = LocalObjectStore(tmp_path / "objects")
    data = os.urandom(size)
    store.put("topic/0001.seg", data)
    return store, data


def test_a_large_range_is_the_file_mapped(tmp_path: Path) -> None:
    store, data = _store_with(tmp_path, 3 * MIB + 123)
    block = store.read_block("topic/0001.seg", 0, 8 * MIB)  # past the end: the object's bytes
    assert isinstance(block, memoryview) and isinstance(block.obj, mmap.mmap)
    assert block.readonly and len(block) == len(data) and bytes(block) == data
    inner = store.read_block("topic/0001.seg", MIB, 2 * MIB)  # a page-aligned range inside
    assert isinstance(inner, memoryview) and bytes(inner) == data[MIB : 2 * MIB]


def test_a_small_range_or_object_is_read(tmp_path: Path) -> None:
    store, data = _store_with(tmp_path, MIB // 2)
    block = store.read_block("topic/0001.seg", 0, 8 * MIB)
    assert isinstance(block, bytes) and block == data
    assert store.read_block("topic/0001.seg", MIB, 2 * MIB) == b""  # wholly past the end
    unaligned = store.read_block("topic/0001.seg", 100, 300)
    assert unaligned == data[100:300]


def test_a_mapping_keeps_its_bytes_when_the_object_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(objectstore, "MMAP_MIN_BYTES", 4096)
    store, data = _store_with(tmp_path, 64 * 1024)
    block = store.read_block("topic/0001.seg", 0, MIB)
    assert isinstance(block, memoryview) and isinstance(block.obj, mmap.mmap)
    store.put("topic/0001.seg", os.urandom(len(data)))  # replaced: a new file under the key
    assert bytes(block) == data
    store.delete("topic/0001.seg")  # retention deletes it while a response still holds it
    assert not (tmp_path / "objects" / "topic" / "0001.seg").exists()
    assert bytes(block[:100]) == data[:100] and bytes(block) == data


def test_a_missing_object_is_an_error_not_an_empty_block(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    with pytest.raises(FileNotFoundError):
        store.read_block("topic/none.seg", 0, 8 * MIB)
