"""Airflow plugin "icefall": the Table topics status view in the Airflow UI, and
the table DAGs' timetables.

Mounts the FastAPI app of ``icefall_airflow.view`` on the API server at
``/icefall`` and adds a "Table topics" entry to the navigation that embeds it.
Registers ``timetable.LeadingIntervalTimetable`` and ``timetable.MaintenanceTimetable``,
which Airflow finds among the plugins' timetables when it deserializes a commit or a
maintenance DAG.
Registered through the ``airflow.plugins`` entry point of the ``icefall``
distribution (pyproject.toml), so every Airflow component that has the package
installed loads it, whatever its plugins folder.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from icefall_airflow.timetable import LeadingIntervalTimetable, MaintenanceTimetable
from icefall_airflow.view import app


class IcefallPlugin(AirflowPlugin):
    name = "icefall"
    # the table DAGs' timetables: Airflow deserializes a custom timetable from the plugins
    timetables = [LeadingIntervalTimetable, MaintenanceTimetable]
    # AirflowPlugin declares these as plain class attributes.
    fastapi_apps = [{"app": app, "url_prefix": "/icefall", "name": "Icefall table topics"}]
    external_views = [
        {
            "name": "Table topics",
            "href": "icefall/",
            "url_route": "icefall-table-topics",
            "destination": "nav",
            "category": "browse",
        }
    ]
