"""The Airflow side's client of the broker's admin API: ``broker.admin_client``'s, with a short timeout.

Only tasks, the triggerer and the status view call it, never DAG parsing. The
client is the Spark jobs' one too (one quoting of topic names, one parsing of
answers into ``broker.contracts`` models); what differs is the timeout: a page
of the API server or a poll of the triggerer should give up on an unreachable
broker after seconds, not the half-minute a Spark job can afford to wait.
"""

from __future__ import annotations

from broker.admin_client import AdminClient, BrokerError

__all__ = ["BrokerClient", "BrokerError"]

TIMEOUT_S = 10.0


class BrokerClient(AdminClient):
    """With the admin API's credentials of ``credentials.admin_user_info`` (looked up at each
    client: a rotated password takes effect at the next)."""

    def __init__(self, admin_url: str, timeout: float = TIMEOUT_S) -> None:
        from icefall_airflow.credentials import admin_user_info

        super().__init__(admin_url, timeout, admin_user_info())
