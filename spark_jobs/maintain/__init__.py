"""The maintenance job's parts: settings read from the topic configs and the result summary."""
