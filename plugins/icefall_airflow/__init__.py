"""Icefall's Airflow side: the commit-round DAG factory, its operators and the
"Table topics" status view.

Lives under ``plugins/`` because Airflow puts that folder on ``sys.path`` in
every component (scheduler, DAG processor, workers, API server), so the DAG
files and the plugin import it as ``icefall_airflow`` without installing it.

What it exchanges with the broker and the Spark jobs is the broker package's:
``broker.contracts`` (the manifest, the admin API's answers, the round plan and
the job results), ``broker.admin_client`` (the one admin-API client),
``broker.names`` (DAG ids, pools, assets) and ``broker.topic_configs`` (the
table-topic keys, read through ``TableSettings``).
"""
