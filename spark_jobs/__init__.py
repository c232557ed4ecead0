"""Spark applications of the commit round and the helpers they run on the driver and executors.

- ``jars``: where the Iceberg Spark runtime jar comes from.
- ``segments``: read segment byte ranges from the object store and decode the
  Kafka record batches in them (offset window, control batches, aborted transactions).
- ``avro_schema``: Avro schema -> Iceberg schema (as Iceberg's AvroSchemaUtil does),
  the Icefall system columns, the Arrow schema of the rows, and schema-evolution planning.
- ``rows``: Confluent wire-format keys/values -> Arrow record batches for the table,
  with decode failures turned into error records for the DLQ instead of exceptions.
- ``commit_round``: the spark-submit entry point; ``round_plan`` (offset windows,
  task groups), ``round_tasks`` (what an executor task does), ``round_commit`` (the
  conditional publish), ``table_setup``, ``partitioning``, ``dlq``, ``broker_client``
  (the registry client; the admin API's is ``broker.admin_client``).

What the jobs exchange with the broker and Airflow (the manifest, the admin API's
answers, the result JSON) is ``broker.contracts``; the names they share with the
DAGs (tables, DLQ tables, subjects) are ``broker.names``.

Only ``commit_round`` imports Spark: the rest runs inside executor tasks and in
plain unit tests.
"""
