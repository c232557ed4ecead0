"""Icefall's Airflow side: the commit-round DAG factory, its operators and the
"Table topics" status view.

Lives under ``plugins/`` because Airflow puts that folder on ``sys.path`` in
every component (scheduler, DAG processor, workers, API server), so the DAG
files and the plugin import it as ``icefall_airflow`` without installing it.
"""
