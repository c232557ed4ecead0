"""Icefall's Airflow side: the commit-round DAG factory, its operators and the
"Table topics" status view.

Lives under ``plugins/`` (the repository's Airflow side) and is installed with
the ``icefall`` distribution, so every Airflow component imports it like any
package; the plugin is registered by the ``airflow.plugins`` entry point
(``icefall_airflow.plugin``).

What it exchanges with the broker and the Spark jobs is the broker package's:
``broker.contracts`` (the manifest, the admin API's answers, the round plan and
the job results), ``broker.admin_client`` (the one admin-API client),
``broker.names`` (DAG ids, pools, assets) and ``broker.topic_configs`` (the
table-topic keys, read through ``TableSettings``).
"""
