"""The Kafka wire protocol: framing, message types (from kio) and handlers."""
