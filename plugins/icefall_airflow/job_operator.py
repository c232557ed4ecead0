"""One way to run an Icefall Spark job from Airflow: ``spark_jobs/<script>`` through spark-submit.

The commit round, maintenance and the DLQ reprocess are all the same kind of
step: a SparkSubmitOperator on the connection ``spark_default`` (``local[*]``
when that connection does not exist, instead of the provider's YARN default),
with the Iceberg jar, this venv's Python and the registry's and catalog's
credentials (Airflow connections, ``credentials``) looked up when the task runs,
never at DAG parse time; the credentials go in spark-submit's environment, not its
argv. On a cluster (any master but ``local``) the job also ships the project's code
to the executors (``--py-files``, ``py_files``). Each job writes a result JSON, which the operator returns for XCom, so
the next task does not need the same disk. When a job fails it still writes its
result: the task then fails with the job's own message instead of spark-submit's
bare exit code. The result also answers Airflow's OpenLineage provider
(``get_openlineage_facets_on_complete``, ``lineage``).

``SparkJobOperator`` does what the apache-spark provider's ``SparkSubmitOperator`` does (the
same keyword arguments, templated fields, ``SparkSubmitHook``, ``on_kill`` and OpenLineage
``conf`` injection when ``[openlineage] spark_inject_*`` asks for it) but does not subclass
it: that operator's module imports the OpenLineage provider's listener and
``openlineage.client``, about 0.6 CPU-s in every process that imports it, and every DAG parse and
every task process (the commit DAG's, the maintenance DAG's) imports this module through the DAG factories. The
hook (and OpenLineage, when configured) is imported only when a job is submitted with
spark-submit; a round in the warm driver imports neither.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from pydantic import ValidationError

from broker.contracts import Contract
from broker.topic_configs import ENABLE

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

SPARK_CONN_ID = "spark_default"
LOCAL_SPARK_CONNECTION = json.dumps({"conn_type": "spark", "host": "local[*]"})
SPARK_CONN_ENV = "AIRFLOW_CONN_SPARK_DEFAULT"


class SparkJobFailed(RuntimeError):
    """The Spark job failed; the message is the job's."""


class JobResultError(ValueError):
    """A job's result JSON is not what its contract says."""


def check_job_result(
    result: Any, job: str, statuses: tuple[str, ...], model: type[Contract] | None = None
) -> dict[str, Any]:
    """``result`` if it is a result object with one of ``statuses`` (``job`` names it in errors)
    that ``model`` (its ``broker.contracts`` model) accepts."""
    if not isinstance(result, dict):
        raise JobResultError(f"{job} returned {type(result).__name__}, not a result object")
    if result.get("status") not in statuses:
        raise JobResultError(
            f"unknown {job} status {result.get('status')!r} (expected one of {statuses})"
        )
    if model is not None:
        try:
            model.model_validate(result)
        except ValidationError as exc:
            raise JobResultError(f"{job}'s result is not a {model.__name__}: {exc}") from exc
    return result


def job_script(name: str) -> str:
    """Path of a Spark application in ``spark_jobs`` (next to the helpers it imports)."""
    import spark_jobs

    return str(Path(spark_jobs.__file__).resolve().parent / name)


def ensure_spark_connection(conn_id: str) -> None:
    """Make ``spark_default`` mean ``local[*]`` when nobody defined it (the provider would say YARN)."""
    if conn_id != SPARK_CONN_ID or os.environ.get(SPARK_CONN_ENV):
        return
    from airflow.sdk import Connection

    try:
        Connection.get(conn_id)
    except Exception:  # noqa: BLE001 -- not defined anywhere: fall back to the single-machine default
        os.environ[SPARK_CONN_ENV] = LOCAL_SPARK_CONNECTION


def spark_master(conn_id: str) -> str:
    """The master the apache-spark provider's hook submits to for ``conn_id``, from the
    connection's public fields and by the provider's rule: a ``spark`` connection whose host is
    the whole master URL (or has no port) is that host, else ``<conn_type>://<host>``; the port
    appended when there is one."""
    from airflow.sdk import Connection

    conn = Connection.get(conn_id)
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    return f"{master}:{conn.port}" if conn.port else master


def spark_deploy_mode(conn_id: str, given: str | None) -> str | None:
    """The deploy mode spark-submit uses, by the provider's hook's rule: the operator's own, else
    the connection's extra ``deploy-mode``."""
    if given:
        return given
    from airflow.sdk import Connection

    try:
        mode = Connection.get(conn_id).extra_dejson.get("deploy-mode")
    except Exception:  # noqa: BLE001 -- no such connection: local[*] (ensure_spark_connection)
        return None
    return str(mode) if mode else None


def read_result(path: str) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    return result


class SparkJobOperator(BaseOperator):
    """Base of the Icefall job operators: ``run_job`` submits ``script`` and returns its result.

    Takes ``SparkSubmitOperator``'s keyword arguments, with ``conn_id`` ``spark_default`` and
    ``spark_binary`` ``spark-submit`` by default; ``execute`` submits ``application`` as that
    operator's does (each job operator overrides it)."""

    script = ""  # a file of spark_jobs/, set by each subclass
    driver_jvm_opts: str | None = None  # SPARK_SUBMIT_OPTS unless the environment sets its own

    # SparkSubmitOperator's
    template_fields: Sequence[str] = (
        "application",
        "conf",
        "files",
        "py_files",
        "jars",
        "driver_class_path",
        "packages",
        "exclude_packages",
        "keytab",
        "principal",
        "proxy_user",
        "name",
        "application_args",
        "env_vars",
        "properties_file",
    )

    def __init__(
        self,
        *,
        application: str = "",
        conf: dict[Any, Any] | None = None,
        conn_id: str = SPARK_CONN_ID,
        files: str | None = None,
        py_files: str | None = None,
        archives: str | None = None,
        driver_class_path: str | None = None,
        jars: str | None = None,
        java_class: str | None = None,
        packages: str | None = None,
        exclude_packages: str | None = None,
        repositories: str | None = None,
        total_executor_cores: int | None = None,
        executor_cores: int | None = None,
        executor_memory: str | None = None,
        driver_memory: str | None = None,
        keytab: str | None = None,
        principal: str | None = None,
        proxy_user: str | None = None,
        name: str = "arrow-spark",
        num_executors: int | None = None,
        status_poll_interval: int = 1,
        application_args: list[Any] | None = None,
        env_vars: dict[str, Any] | None = None,
        verbose: bool = False,
        spark_binary: str | None = "spark-submit",
        properties_file: str | None = None,
        yarn_queue: str | None = None,
        deploy_mode: str | None = None,
        use_krb5ccache: bool = False,
        openlineage_inject_parent_job_info: bool | None = None,
        openlineage_inject_transport_info: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.application = application
        self.conf = conf
        self.files = files
        self.py_files = py_files
        self.driver_class_path = driver_class_path
        self.jars = jars
        self.packages = packages
        self.exclude_packages = exclude_packages
        self.keytab = keytab
        self.principal = principal
        self.proxy_user = proxy_user
        self.name = name
        self.application_args = application_args
        self.env_vars = env_vars
        self.properties_file = properties_file
        self._conn_id = conn_id
        # SparkSubmitHook's other arguments, as SparkSubmitOperator passes them
        self._hook_args: dict[str, Any] = {
            "archives": archives,
            "java_class": java_class,
            "repositories": repositories,
            "total_executor_cores": total_executor_cores,
            "executor_cores": executor_cores,
            "executor_memory": executor_memory,
            "driver_memory": driver_memory,
            "num_executors": num_executors,
            "status_poll_interval": status_poll_interval,
            "verbose": verbose,
            "spark_binary": spark_binary,
            "yarn_queue": yarn_queue,
            "deploy_mode": deploy_mode,
            "use_krb5ccache": use_krb5ccache,
        }
        # None: as [openlineage] spark_inject_parent_job_info / _transport_info say when it runs
        self._openlineage_inject_parent_job_info = openlineage_inject_parent_job_info
        self._openlineage_inject_transport_info = openlineage_inject_transport_info
        self._hook: SparkSubmitHook | None = None

    def _get_hook(self) -> SparkSubmitHook:
        """The provider's hook for the fields as they are now (``prepare`` sets them)."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        return SparkSubmitHook(
            conf=self.conf,
            conn_id=self._conn_id,
            files=self.files,
            py_files=self.py_files,
            driver_class_path=self.driver_class_path,
            jars=self.jars,
            packages=self.packages,
            exclude_packages=self.exclude_packages,
            keytab=self.keytab,
            principal=self.principal,
            proxy_user=self.proxy_user,
            name=self.name,
            application_args=self.application_args,
            env_vars=self.env_vars,
            properties_file=self.properties_file,
            **self._hook_args,
        )

    def _openlineage_conf(self, context: Any) -> None:
        """Add OpenLineage's parent job and transport to the Spark ``conf`` when configured,
        as ``SparkSubmitOperator.execute`` does (the OpenLineage provider imported only then)."""
        from airflow.sdk.configuration import conf

        def wanted(flag: bool | None, what: str) -> bool:
            if flag is not None:
                return flag
            return conf.getboolean("openlineage", f"spark_inject_{what}_info", fallback=False)

        parent = wanted(self._openlineage_inject_parent_job_info, "parent_job")
        transport = wanted(self._openlineage_inject_transport_info, "transport")
        if not (parent or transport):
            return
        from airflow.providers.common.compat.openlineage.utils.spark import (
            inject_parent_job_information_into_spark_properties,
            inject_transport_information_into_spark_properties,
        )

        properties = self.conf or {}
        if parent:
            self.log.debug("Injecting OpenLineage parent job information into Spark properties.")
            properties = inject_parent_job_information_into_spark_properties(properties, context)
        if transport:
            self.log.debug("Injecting OpenLineage transport information into Spark properties.")
            properties = inject_transport_information_into_spark_properties(properties, context)
        self.conf = properties

    def submit(self, context: Any) -> None:
        """spark-submit ``application`` (``SparkSubmitOperator.execute``); ``AirflowException``
        when it fails."""
        self.conf = self.conf or {}
        self._openlineage_conf(context)
        if self._hook is None:
            self._hook = self._get_hook()
        self._hook.submit(self.application)

    def execute(self, context: Any) -> Any:
        self.submit(context)

    def on_kill(self) -> None:
        if self._hook is None:
            self._hook = self._get_hook()
        self._hook.on_kill()

    job_result: dict[str, Any] | None = None  # the last result, for lineage
    lineage_admin_url: str | None = None

    def lineage(self, result: dict[str, Any], cluster: Any) -> Any:
        """The job's OpenLineage datasets (``lineage.OperatorLineage``) from its result; none by default."""
        return None

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Called by Airflow's OpenLineage provider, only when a transport is configured."""
        from airflow.providers.openlineage.extractors import OperatorLineage

        from icefall_airflow.broker_client import BrokerClient

        if not self.job_result or not self.lineage_admin_url:
            return OperatorLineage()
        cluster = BrokerClient(self.lineage_admin_url).cluster()
        return self.lineage(self.job_result, cluster) or OperatorLineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self.get_openlineage_facets_on_complete(task_instance)

    def prepare(self, admin_url: str, args: list[str], result_path: str) -> None:
        """Set what spark-submit gets for ``script`` with ``args`` plus ``--result result_path``:
        the application, the jars, the project's code for a cluster's executors
        (``py_files``), the driver's environment. ``run_job`` submits it; tests build the same
        command line from it."""
        from icefall_airflow.py_files import py_files_for
        from spark_jobs.jars import iceberg_jars

        ensure_spark_connection(self._conn_id)
        self.application = self.application or job_script(self.script)
        self.jars = self.jars or ",".join(iceberg_jars())
        self.application_args = [*args, "--result", result_path]
        # the connection's master decides whether executors need the code shipped
        self.py_files = self.py_files or py_files_for(spark_master(self._conn_id))
        python = sys.executable
        jvm = (
            {"SPARK_SUBMIT_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", self.driver_jvm_opts)}
            if self.driver_jvm_opts
            else {}
        )
        self.env_vars = {
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": python,
            "PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
            **jvm,
            **self.job_env(admin_url),
        }
        self._hook = None  # built from the fields set above

    def job_env(self, admin_url: str) -> dict[str, str]:
        """What the job's process gets on top of this task's environment, whichever way it runs:
        the broker's admin URL, the operator's ``env_vars``, and the registry's, catalog's and
        admin API's credentials from the ``icefall_registry`` / ``icefall_catalog`` /
        ``icefall_admin`` connections, looked up now (not at parse time)."""
        from icefall_airflow import credentials

        return {"ICEFALL_ADMIN_URL": admin_url, **(self.env_vars or {}), **credentials.job_env()}

    def run_job(self, context: Any, admin_url: str, args: list[str], label: str) -> dict[str, Any]:
        """spark-submit ``script`` with ``args`` plus ``--result``; the result JSON it wrote
        (``label``: what the log lines and errors call this run)."""
        from airflow.exceptions import AirflowException

        with tempfile.TemporaryDirectory(prefix="icefall-job-") as tmp:
            result_path = os.path.join(tmp, "result.json")
            self.prepare(admin_url, args, result_path)
            self.lineage_admin_url = admin_url
            try:
                self.submit(context)
            except AirflowException as exc:
                result = read_result(result_path)
                self.job_result = result
                if result is None:
                    raise
                self.log.info("%s: %s", label, json.dumps(result, sort_keys=True))
                raise SparkJobFailed(f"{label} failed: {result.get('message')}") from exc
            result = read_result(result_path)
            if result is None:
                raise SparkJobFailed(
                    f"{self.application} exited 0 but wrote no result to {result_path}"
                )
        self.job_result = result
        self.log.info("%s: %s", label, json.dumps(result, sort_keys=True))
        return result


class TableJobOperator(SparkJobOperator):
    """A job on one table topic's table that a disabled topic (table-topic flag off) skips."""

    when_disabled = "nothing to do"  # the skip message's end

    def __init__(
        self, *, topic: str, topic_enabled: bool = True, admin_url: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.topic_enabled = topic_enabled
        self.admin_url = admin_url

    def admin_url_or_skip(self) -> str:
        """The broker's admin URL; skips the task while the topic is not a table topic."""
        from airflow.sdk.exceptions import AirflowSkipException

        from icefall_airflow import manifest

        if not self.topic_enabled:
            raise AirflowSkipException(
                f"topic {self.topic} is not a table topic now "
                f"({ENABLE}=false): {self.when_disabled}"
            )
        return self.admin_url or manifest.admin_url()
