"""Icefall broker: a Kafka-compatible server whose log lives in object storage."""
