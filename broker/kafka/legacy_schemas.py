"""Message schemas kio does not carry, written out in kio's form so its reader and writer
handle them like the generated ones.

kio generates its classes from Kafka 4's message JSON files, and Kafka 4 removed ListOffsets v0
(KIP-896). Clients older than Kafka 0.10.1 still send it to find the log start and end
(``OffsetRequest`` with ``max_num_offsets``), so the broker serves it: the fields below are
those of Kafka 3.x's ``ListOffsetsRequest.json``/``ListOffsetsResponse.json`` at version 0.

No ``from __future__ import annotations`` here: kio reads the field types at run time.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import BrokerId, TopicName
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i64

LIST_OFFSETS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartitionV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(LIST_OFFSETS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    timestamp: i64 = field(metadata={"kafka_type": "int64"})
    max_num_offsets: i32 = field(metadata={"kafka_type": "int32"}, default=i32(1))


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopicV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(LIST_OFFSETS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[ListOffsetsPartitionV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsRequestV0:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(LIST_OFFSETS)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    replica_id: BrokerId = field(metadata={"kafka_type": "int32"})
    topics: tuple[ListOffsetsTopicV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartitionResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(LIST_OFFSETS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    old_style_offsets: tuple[i64, ...] = field(metadata={"kafka_type": "int64"}, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopicResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(LIST_OFFSETS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partitions: tuple[ListOffsetsPartitionResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(LIST_OFFSETS)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    topics: tuple[ListOffsetsTopicResponseV0, ...]


# (api key, version) -> (request class, response class)
SCHEMAS: dict[tuple[int, int], tuple[type[Any], type[Any]]] = {
    (LIST_OFFSETS, 0): (ListOffsetsRequestV0, ListOffsetsResponseV0),
}
