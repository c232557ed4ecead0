"""Avro schemas in the registry: parsing and compatibility."""
