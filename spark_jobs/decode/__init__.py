"""From segment bytes to Arrow: Kafka record batches, Avro and JSON values, the row layout."""
