"""Confluent-compatible Schema Registry served by the broker."""
