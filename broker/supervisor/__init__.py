"""``icefall up``: the supervisor that starts the broker, Airflow and the demo, apart from the broker's own modules."""
