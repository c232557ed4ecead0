"""Protobuf schemas in the registry: the .proto parser, descriptors, canonical text and compatibility."""
