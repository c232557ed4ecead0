"""Airflow is configured (a throwaway AIRFLOW_HOME, this repo's dags/ and plugins/)
before any test here imports it."""

from tests.dags import airflow_env

airflow_env.configure()
