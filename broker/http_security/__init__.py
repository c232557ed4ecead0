"""Who may use the broker's HTTP services: basic auth and per-subject roles on the schema
registry, OAuth2 client credentials and bearer tokens on the Iceberg REST catalog, TLS on both
(docs/security-http.md). All off by default: each is turned on by its settings in
``broker/config.py``. ``client`` is the other side: how the jobs and the Airflow plugin present
their credentials."""
