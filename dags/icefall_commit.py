"""Airflow DAGs ``icefall_commit__<topic>``: one commit-round DAG per table topic.

The list of table topics is the broker's manifest file
(``$ICEFALL_HOME/table_topics.json``), read at parse time; enabling
``automq.table.topic.enable`` on a topic makes its DAG appear at the DAG
processor's next parse of this file. The factory lives in
``plugins/icefall_airflow/factory.py``.
"""

from __future__ import annotations

from icefall_airflow.factory import build_all

globals().update(build_all())
