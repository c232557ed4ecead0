"""Airflow DAGs ``icefall_dlq_reprocess__<topic>``: reprocess a table's DLQ, triggered by hand.

Built from the broker's manifest file (``$ICEFALL_HOME/table_topics.json``) at
parse time, like the commit and maintenance DAGs; the factory lives in
``plugins/icefall_airflow/dlq_factory.py``.
"""

from __future__ import annotations

from icefall_airflow.dlq_factory import build_all

globals().update(build_all())
