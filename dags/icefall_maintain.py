"""Airflow DAGs ``icefall_maintain__<topic>``: S3 Tables-style maintenance per table topic.

Built from the broker's manifest file (``$ICEFALL_HOME/table_topics.json``) at
parse time, like the commit DAGs; the factory lives in
``plugins/icefall_airflow/maintain_factory.py``. Each DAG runs
``spark_jobs/maintenance.py`` every ``automq.table.topic.maintenance.interval.ms``
in the pool it shares with the table's commit rounds.
"""

from __future__ import annotations

from icefall_airflow.maintain_factory import build_all

globals().update(build_all())
