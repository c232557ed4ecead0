"""The commit round's parts: plan, staged tasks, writers, publish, upsert, the DLQ, table set-up and evolution."""
