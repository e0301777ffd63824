"""MergeIntoOperator: run one Delta Lake MERGE INTO on Spark, idempotently, and push its metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from airflow.sdk import BaseOperator, Context, ResumableJobMixin
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowTaskTimeout

from airflow_merge_provider.argument_check import reject_unknown_arguments
from airflow_merge_provider.assets import default_outlet, record_merge_event
from airflow_merge_provider.driver_output import SparkApplication
from airflow_merge_provider.driver_process import DriverRef, driver_state, remove_spec_file, stop_driver
from airflow_merge_provider.errors import (
    MergeArgumentError,
    MergeJobFailedError,
    MergeProviderError,
    MergeSpecInvalidError,
    one_clear_message,
)
from airflow_merge_provider.hooks.merge_commit import MergeCommit, find_merge_commit
from airflow_merge_provider.hooks.merge_connect import (
    MergeConnectHook,
    is_connect_connection,
    server_unreachable,
)
from airflow_merge_provider.hooks.merge_driver import MergeDriverHook
from airflow_merge_provider.lineage import with_openlineage_conf
from airflow_merge_provider.links import (
    SparkApplicationUiLink,
    SparkDriverLogLink,
    application_links,
    push_links,
)
from airflow_merge_provider.merge_run import MergeRun
from airflow_merge_provider.merge_spec import default_app_id, option_names, redacted, spec_dict
from airflow_merge_provider.metrics import format_metrics_table, format_summary, to_xcom
from airflow_merge_provider.spec_credentials import (
    refuse_credentials_on_the_command_line,
    with_connection_credentials,
)
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger

if TYPE_CHECKING:
    from pydantic import JsonValue
    from pyspark.sql import SparkSession as ClassicSession

    from spark_jobs.delta_merge.contract import JobFailure, MergeSpec

__all__ = ["ARGUMENT_MEANINGS", "MergeIntoOperator", "default_app_id"]

_OWN_JOB = (
    "the operator submits its own packaged merge job and builds spark-submit's application and arguments "
    "itself: Spark settings go in spark_conf, the merge's in options and merge_sql"
)
_STORAGE = (
    "storage options belong to the table they open: target={'uri': ..., 'storage_options': {...}} (and "
    "source likewise), or credentials from a connection with aws_conn_id (S3), azure_conn_id (Azure) or "
    "gcp_conn_id (GCS)"
)
# The names SparkSubmitOperator, the Spark Connect, Databricks and SQL operators, and Delta give the same
# settings, and what this operator calls them (reject_unknown_arguments matches them ignoring case and "_").
ARGUMENT_MEANINGS: dict[str, str] = {
    **dict.fromkeys(("spark_conn_id", "conn", "connection", "connection_id", "spark_connection",
                     "spark_connect_conn_id", "databricks_conn_id", "livy_conn_id"), "conn_id"),
    **dict.fromkeys(("target_table", "table", "table_name", "target_path", "target_uri", "path",
                     "delta_table", "delta_path", "destination", "destination_table", "into"), "target"),
    **dict.fromkeys(("source_table", "source_path", "source_uri", "source_query", "source_sql",
                     "using"), "source"),
    **dict.fromkeys(("sql", "merge_query", "merge_statement", "statement", "sql_statement", "merge"),
                    "merge_sql"),
    # A SELECT a user brings as query= is the source more often than the statement.
    "query": "did you mean merge_sql='MERGE INTO ...'? A source query goes in source={'query': 'SELECT ...'}",
    **dict.fromkeys(("on", "merge_condition", "join_condition", "predicate", "merge_on"), "condition"),
    **dict.fromkeys(("keys", "merge_keys", "primary_keys", "key_columns"),
                    "the keys go in the ON condition: merge_sql='MERGE INTO ... ON t.id = s.id ...', or "
                    "condition='t.id = s.id' with when_matched/when_not_matched"),
    **dict.fromkeys(("retry", "max_retries", "num_retries", "retry_count"), "retries"),
    **dict.fromkeys(("retry_delay_seconds", "retry_interval"), "retry_delay"),
    **dict.fromkeys(("conf", "spark_config", "spark_confs", "spark_configuration", "config",
                     "spark_settings"), "spark_conf"),
    **dict.fromkeys(("wait", "wait_for_termination", "wait_for_finish"), "wait_for_completion"),
    **dict.fromkeys(("polling_period_seconds", "poke_interval", "check_interval"), "poll_interval"),
    **dict.fromkeys(("aws_conn", "s3_conn_id", "aws_connection_id", "aws_connection"), "aws_conn_id"),
    **dict.fromkeys(("azure_conn", "wasb_conn_id", "adls_conn_id", "azure_data_lake_conn_id",
                     "azure_connection_id", "abfs_conn_id"), "azure_conn_id"),
    **dict.fromkeys(("google_cloud_storage_conn_id", "gcs_conn_id", "google_conn_id", "gcp_conn",
                     "google_cloud_conn_id", "bigquery_conn_id"), "gcp_conn_id"),
    **dict.fromkeys(("idempotency_key", "txn_app_id", "application_id"), "app_id"),
    **dict.fromkeys(("txn_version", "idempotency_version", "batch_id"), "app_version"),
    **dict.fromkeys(("env", "environment", "environment_variables"), "env_vars"),
    **dict.fromkeys(("timeout", "execution_timeout_seconds"), "execution_timeout"),
    **dict.fromkeys(("application", "application_args", "py_files", "jars", "packages", "files",
                     "archives", "java_class", "main_class", "python_file", "spark_python_task",
                     "spark_jar_task", "notebook_task"), _OWN_JOB),
    **dict.fromkeys(("storage_options", "credentials", "aws_access_key_id", "aws_secret_access_key"),
                    _STORAGE),
    **dict.fromkeys(("merge_schema", "auto_merge", "schema_auto_merge", "allow_schema_evolution",
                     "evolve_schema"),
                    "schema evolution is an option: pass options={'schema_evolution': True}"),
    **dict.fromkeys(("partition_by", "partition_columns", "partitioned_by"),
                    "a merge writes with the target table's own partitioning: partition the table when "
                    "you create it"),
}


class MergeIntoOperator(ResumableJobMixin, BaseOperator):
    """Run a Delta Lake ``MERGE INTO`` with the packaged Spark job, once per DAG run, and push its metrics.

    The merge is given either as ``merge_sql`` or structurally (``condition`` and the ``when_*`` clause
    lists). After templating, the operator builds the merge spec and validates it before launching
    anything; an invalid spec fails the task without retries.

    The merge is idempotent: it records ``(app_id, app_version)`` in its Delta commit, ``app_id`` being
    derived from the DAG run and task (:func:`default_app_id`) and ``app_version`` from the run's clear
    number. A retry after the merge committed does not apply it again: it returns the committed merge's
    metrics with ``skipped=True``. Clearing the task (or a backfill re-running it) applies it again.

    The XCom return value is one dict: every metric of Delta's MERGE (ints), ``numOutputRows``,
    ``materializeSourceReason``, ``readVersion``, ``tableVersion``, ``skipped``, ``dryRun``, ``appId``
    and ``appVersion``. The table is the task's default outlet; its asset event carries the same dict.
    The task's extra links lead to the Spark application's UI and the driver's log where the connection
    and the driver's log give them an address (:mod:`airflow_merge_provider.links`).

    How the task waits, in client deploy mode (the driver runs on the worker):

    - attached (``durable=False``, or no task state store in the context): spark-submit is the task's
      child and its output comes through a pipe, as with ``SparkSubmitOperator``.
    - durable (the default where Airflow gives the task a ``task_state_store``, as Airflow 3.3's task
      runner does): spark-submit starts in its own session with its output in a log file under
      ``<tempdir>/airflow-merge-provider/detached/``, and the spec in a private file (mode 0600, removed
      once the driver has exited); the task records the driver's :class:`DriverRef` (host, pid, start
      time, log file) in the task state store, then follows the log file into the task log until the
      driver exits (and removes it). A worker that dies leaves the driver running: the retry, on the
      same host, finds it by its ref and follows it to its end instead of starting a second Spark
      application, and on any host finds its commit if it has landed (``skipped``). A retry on another
      host, which cannot see the process, submits again; the idempotency key still applies the merge
      once. This is ``ResumableJobMixin``'s reconnect-on-retry; the mixin's status is the driver
      process's (``RUNNING``, ``EXITED``, ``ON_ANOTHER_HOST``, ``OTHER_MERGE``).
    - deferrable: spark-submit starts detached (as above, without a spec file: the spec travels on the
      command line, so credentials are refused) and the task defers to :class:`MergeCommitTrigger`,
      which reads the driver's log and watches its process (on the same host) and the Delta log, so a
      failed job ends the wait; ``execute_complete`` replays the driver's log into the task log (on the
      driver's host) and turns the one event into the same XCom as a waiting run (the job's metrics line
      where the log was readable, else the commit's ``operationMetrics``) or the same error. The trigger
      gives up at ``execution_timeout`` (the task then stops the driver, on its host). A task marked
      failed while deferred leaves its driver running, as the driver has no task process to stop it.

    In cluster deploy mode a waiting task runs spark-submit attached (it waits for the application); a
    deferrable one lets spark-submit return once the application is accepted and the trigger waits for
    the commit until ``execution_timeout``: the driver's log is on the cluster, so a failed application
    is seen only by its missing commit (set ``execution_timeout``).

    :param target: (required) the Delta table: a path or URI, or ``{"uri", "storage_options"}``. (templated)
    :param source: (required) a Parquet path or URI, or the contract's ``{"uri", "format", "options",
        "storage_options"}`` or ``{"query"}``. (templated)
    :param merge_sql: a ``MERGE INTO target t USING source s ...`` statement, or a ``.sql`` file.
        (templated)
    :param condition: the ON condition of the structural form. (templated)
    :param when_matched: WHEN MATCHED clauses, in order: ``{"condition"?, "action", "set"?}``, action
        ``update``, ``update_all`` or ``delete``. (templated)
    :param when_not_matched: WHEN NOT MATCHED clauses: ``{"condition"?, "action", "values"?}``, action
        ``insert`` or ``insert_all``. (templated)
    :param when_not_matched_by_source: WHEN NOT MATCHED BY SOURCE clauses, as ``when_matched``.
        (templated)
    :param target_alias: alias of the target in the structural form's expressions (contract default).
    :param source_alias: alias of the source in the structural form's expressions (contract default).
    :param options: the contract's options (``materialize_source``, ``schema_evolution``, ...).
        (templated)
    :param expected_metrics: checks the job applies before committing, e.g.
        ``{"numTargetRowsDeleted": {"leq_to": 100}}``; a failed check fails the task without retries.
        (templated)
    :param dry_run: compute the metrics without writing or committing (None: as ``options`` say).
    :param commit_metadata: JSON values recorded in the commit's ``commitInfo`` (next to the task's ids
        under ``"airflow"``). (templated)
    :param conn_id: the Spark connection (a missing one is an error, not a silent fall back to yarn). A
        ``spark_connect`` connection merges on that Spark Connect server: the driver logic runs in the task,
        the Spark work on the server, and ``deferrable``, ``wait_for_completion=False`` and ``durable=True``
        are refused (they need a driver process); the spark-submit arguments do not apply.
    :param spark_conf: extra ``--conf`` pairs. (templated)
    :param executor_memory: as SparkSubmitHook.
    :param driver_memory: as SparkSubmitHook.
    :param executor_cores: as SparkSubmitHook.
    :param num_executors: as SparkSubmitHook.
    :param total_executor_cores: as SparkSubmitHook.
    :param env_vars: environment of spark-submit; on a ``local`` master ``PYSPARK_PYTHON`` and
        ``PYSPARK_DRIVER_PYTHON`` default to the worker's Python, which has the job's dependencies.
        (templated)
    :param spark_binary: the spark-submit command (default: the connection's, else ``spark-submit``).
    :param aws_conn_id: an Airflow connection whose AWS credentials (and extras ``region_name``,
        ``endpoint_url``) complete the storage options of an S3 target and S3 source for this run only;
        keys given in ``storage_options`` win. Resolved at execute time (with the Amazon provider when it
        is installed, else login = access key id, password = secret, extra ``aws_session_token``); the
        credentials never reach the log, XCom or rendered fields. Needs client deploy mode and a waiting
        task (not ``deferrable``, ``wait_for_completion``): the spec then travels in a private file. Not
        templated.
    :param azure_conn_id: likewise for an Azure Blob Storage / ADLS Gen2 target and source (``abfss://``,
        ``az://``, ...): a ``wasb``, ``adls`` or generic connection whose login is the storage account and
        password its key (or extras ``sas_token``, ``connection_string``, or ``tenant_id`` with login and
        password as a service principal's client id and secret; host an account URL or an emulator's
        endpoint). Read field by field, the Microsoft Azure provider need not be installed. Not templated.
    :param gcp_conn_id: likewise for a GCS target and source (``gs://``): a ``google_cloud_platform`` (or
        generic) connection whose extra ``keyfile_dict`` holds a service account key, or ``key_path`` names
        a key file every driver and executor can read; without either, the environment's credentials
        apply. Read field by field, the Google provider need not be installed. Not templated.
    :param app_id: override the idempotency key's application id (templated: ``"accounts.{{ ds }}"``
        makes the merge apply once per logical date, whichever run or clear runs it).
    :param app_version: override the idempotency key's version (default: the DAG run's clear number): an
        int, or a template rendering to one (``"{{ ds_nodash }}"``). (templated)
    :param wait_for_completion: wait for the merge (default). False: start spark-submit and return its
        ``appId``/``appVersion`` at once (fire and forget; wait with MergeCommitSensor; ``deferrable`` and
        ``durable`` do not apply). The task then has no default outlet: give the sensor the table's asset.
    :param deferrable: wait in the triggerer rather than in a worker slot (default: ``[operators]
        default_deferrable``). Refuses credentials (``aws_conn_id``, ``azure_conn_id``, ``gcp_conn_id``,
        secret ``storage_options``).
    :param poll_interval: seconds between two looks of the trigger at the driver and the Delta log.
    :param durable: record the driver in the task state store so that a retry after a worker crash
        follows the running driver rather than starting another (default True, ``ResumableJobMixin``'s).
    :param openlineage_inject_parent_job_info: add the task's OpenLineage parent job to the Spark conf
        (``spark.openlineage.parent*``), for the OpenLineage Spark listener if the application has it
        (default: ``[openlineage] spark_inject_parent_job_info``).
    :param openlineage_inject_transport_info: add the OpenLineage transport to the Spark conf (default:
        ``[openlineage] spark_inject_transport_info``). It lands on spark-submit's command line, as with
        ``SparkSubmitOperator``: keep API keys out of such a transport.
    :param engine: ``"native"`` (default): the packaged job does Delta's MERGE itself, on any Spark 4.
        ``"delta"``: Delta Lake's own ``MERGE INTO`` runs the same statement and source, with the same
        XCom (from the commit's ``operationMetrics``), idempotency key (Delta's ``txnAppId``/``txnVersion``),
        asset event, lineage, sensor and branching. Through spark-submit the operator adds Delta's package
        and SQL extension, unless the connection's extra ``delta_package`` is ``"cluster"`` (or names another
        coordinate); on Spark Connect the server must have Delta. ``dry_run``, ``expected_metrics``,
        ``options['target_file_size']``, a target's ``storage_options``, ``aws_conn_id``, ``azure_conn_id``
        and ``gcp_conn_id`` are native-only and refused when the operator is built. See the "Which engine"
        page.
    """

    template_fields: Sequence[str] = (
        "target", "source", "merge_sql", "condition", "when_matched", "when_not_matched",
        "when_not_matched_by_source", "options", "spark_conf", "app_id", "app_version", "expected_metrics",
        "commit_metadata", "env_vars",
    )  # fmt: skip
    template_ext: Sequence[str] = (".sql",)
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "merge_sql": "sql", "condition": "sql", "source": "json", "when_matched": "json",
        "when_not_matched": "json", "when_not_matched_by_source": "json", "options": "json",
        "spark_conf": "json", "expected_metrics": "json", "commit_metadata": "json", "env_vars": "json",
    }  # fmt: skip
    operator_extra_links = (SparkApplicationUiLink(), SparkDriverLogLink())
    ui_color = "#00add4"
    # The task state store key of the driver's DriverRef (renaming it breaks in-flight retries).
    external_id_key = "merge_driver"

    def __init__(
        self,
        *,
        # Required: None only so that a misnamed one gets its hint first (reject_unknown_arguments).
        target: str | Mapping[str, Any] | None = None,
        source: str | Mapping[str, Any] | None = None,
        merge_sql: str | None = None,
        condition: str | None = None,
        when_matched: Sequence[Mapping[str, Any]] | None = None,
        when_not_matched: Sequence[Mapping[str, Any]] | None = None,
        when_not_matched_by_source: Sequence[Mapping[str, Any]] | None = None,
        target_alias: str | None = None,
        source_alias: str | None = None,
        options: Mapping[str, Any] | None = None,
        expected_metrics: Mapping[str, Mapping[str, float]] | None = None,
        dry_run: bool | None = None,
        commit_metadata: Mapping[str, Any] | None = None,
        conn_id: str = "spark_default",
        spark_conf: Mapping[str, Any] | None = None,
        executor_memory: str | None = None,
        driver_memory: str | None = None,
        executor_cores: int | None = None,
        num_executors: int | None = None,
        total_executor_cores: int | None = None,
        env_vars: Mapping[str, str] | None = None,
        spark_binary: str | None = None,
        aws_conn_id: str | None = None,
        azure_conn_id: str | None = None,
        gcp_conn_id: str | None = None,
        app_id: str | None = None,
        app_version: int | str | None = None,
        wait_for_completion: bool = True,
        deferrable: bool | None = None,
        poll_interval: float = 10.0,
        durable: bool | None = None,
        openlineage_inject_parent_job_info: bool | None = None,
        openlineage_inject_transport_info: bool | None = None,
        engine: str = "native",
        **kwargs: Any,
    ) -> None:
        reject_unknown_arguments(
            type(self), kwargs, options=option_names, meanings=ARGUMENT_MEANINGS,
            required={"target": target, "source": source},
        )
        clause_lists = (when_matched, when_not_matched, when_not_matched_by_source)
        structural = condition is not None or any(clause_lists)
        if (merge_sql is None) == (not structural):
            found = "both" if merge_sql is not None else "neither"
            raise ValueError(
                f"MergeIntoOperator: give either merge_sql or condition with when_* clauses, found {found}"
            )
        _check_engine(
            engine, options=options or {}, dry_run=dry_run, expected_metrics=expected_metrics, target=target,
            storage_connections={"aws_conn_id": aws_conn_id, "azure_conn_id": azure_conn_id,
                                 "gcp_conn_id": gcp_conn_id},
        )  # fmt: skip
        if durable is not None:
            kwargs["durable"] = durable  # else the mixin's default, or default_args'
        super().__init__(**kwargs)
        if isinstance(merge_sql, str) and not _is_template(merge_sql, self.template_ext):
            _check_literal_merge_sql(merge_sql, task_id=self.task_id)
        self.target = cast("str | Mapping[str, Any]", target)  # given: checked above
        self.source = cast("str | Mapping[str, Any]", source)
        self.merge_sql = merge_sql
        self.condition = condition
        self.when_matched = list(when_matched or [])
        self.when_not_matched = list(when_not_matched or [])
        self.when_not_matched_by_source = list(when_not_matched_by_source or [])
        self.target_alias = target_alias
        self.source_alias = source_alias
        self.options = dict(options or {})
        self.expected_metrics = dict(expected_metrics or {})
        self.dry_run_merge = dry_run
        self.commit_metadata = dict(commit_metadata or {})
        self.conn_id = conn_id
        self.spark_conf = dict(spark_conf or {})
        self.executor_memory = executor_memory
        self.driver_memory = driver_memory
        self.executor_cores = executor_cores
        self.num_executors = num_executors
        self.total_executor_cores = total_executor_cores
        self.env_vars = dict(env_vars or {})
        self.spark_binary = spark_binary
        self.aws_conn_id = aws_conn_id
        self.azure_conn_id = azure_conn_id
        self.gcp_conn_id = gcp_conn_id
        self.app_id = app_id
        self.app_version = app_version
        self.wait_for_completion = wait_for_completion
        self.deferrable = (
            conf.getboolean("operators", "default_deferrable", fallback=False) if deferrable is None
            else deferrable
        )  # fmt: skip
        self.poll_interval = poll_interval
        self.engine = engine
        self.openlineage_inject_parent_job_info = _conf_default(
            openlineage_inject_parent_job_info, "spark_inject_parent_job_info"
        )
        self.openlineage_inject_transport_info = _conf_default(
            openlineage_inject_transport_info, "spark_inject_transport_info"
        )
        self._hook: MergeDriverHook | None = None
        self._connect_hook: MergeConnectHook | None = None
        self._durable_requested = durable
        self._result: dict[str, Any] | None = None
        self._spec: MergeSpec | None = None
        self._job_result: dict[str, Any] | None = None
        self._run: MergeRun
        # The extra links' URLs this task pushed, by XCom key (read back by the links in the worker).
        self.pushed_links: dict[str, str] = {}
        dry = dry_run if dry_run is not None else bool(self.options.get("dry_run"))
        if "outlets" not in kwargs and wait_for_completion and not dry:
            dag = self.get_dag()
            dag_id = dag.dag_id if dag is not None else None
            self.outlets = [default_outlet(_target_uri(self.target), task_id=self.task_id, dag_id=dag_id)]

    # -- spec ------------------------------------------------------------------------------------------

    def build_spec(self, context: Context) -> MergeSpec:
        """The merge spec from the rendered fields, validated.

        :raises MergeSpecInvalidError: naming the field, what was expected and what was found.
        """
        from spark_jobs.delta_merge.contract import MergeSpec, MergeSpecError

        ti = context["ti"]
        names = ("target", "source", "merge_sql", "condition", "when_matched", "when_not_matched",
                 "when_not_matched_by_source", "target_alias", "source_alias", "options", "expected_metrics",
                 "commit_metadata", "app_id", "app_version")  # fmt: skip
        fields = {name: getattr(self, name) for name in names} | {"dry_run": self.dry_run_merge}
        if self.engine != "native":
            options = fields["options"]
            if isinstance(options, Mapping):
                fields["options"] = {**options, "engine": self.engine}
        clear_number = getattr(context["dag_run"], "clear_number", None) or 0
        data = spec_dict(
            fields=fields, dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=ti.map_index,
            try_number=ti.try_number, clear_number=clear_number,
        )  # fmt: skip
        try:
            spec = MergeSpec.from_dict(data)
            spec.validate()
        except MergeSpecError as error:
            raise MergeSpecInvalidError(f"Invalid merge spec for task {self.task_id}: {error}") from error
        return spec

    # -- execution -------------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        with one_clear_message(self.log):
            return self._execute(context)

    def _execute(self, context: Context) -> dict[str, Any]:
        spec = self.build_spec(context)
        self._spec = spec
        on_connect = is_connect_connection(self.conn_id)
        if on_connect:
            self._refuse_modes_connect_cannot_run()
        self.log.info("Merge spec:\n%s", redacted(spec).to_json(indent=2))
        # From here on the spec may hold the connection's credentials: it stays local to this call.
        spec = with_connection_credentials(
            spec, aws_conn_id=self.aws_conn_id, azure_conn_id=self.azure_conn_id,
            gcp_conn_id=self.gcp_conn_id, log=self.log,
        )  # fmt: skip
        committed = self._committed(spec)
        if committed is not None:
            self.log.info(
                "The merge %s (version %s) already committed %s version %d: not applying it again",
                spec.run.app_id, spec.run.app_version, spec.target.uri, committed.version,
            )  # fmt: skip
            return self._finish(context, spec, committed.metrics(skipped=True))
        if on_connect:
            return self._finish(context, spec, self._merge_on_connect(spec))
        deferred = self.deferrable and self.wait_for_completion
        hook = self._make_hook(spec, context, detached=deferred or not self.wait_for_completion)
        refuse_credentials_on_the_command_line(
            spec, connections=self._storage_connections(), deploy_mode=hook.deploy_mode,
            private_file=hook.deploy_mode == "client" and self.wait_for_completion and not deferred,
            how=f"wait_for_completion={self.wait_for_completion}, deferrable={self.deferrable}",
        )  # fmt: skip
        if spec.options.dry_run and hook.deploy_mode == "cluster":
            raise MergeSpecInvalidError(
                "dry_run needs client deploy mode: in cluster mode the driver's output (the only place a dry "
                "run's metrics go) does not reach spark-submit"
            )
        hook.on_application = lambda application: self._push_links(context, hook, application, live=True)
        self._run = run = MergeRun(spec, hook, self.log, lambda: self._committed(spec))
        if not self.wait_for_completion:
            return self._submit_detached(run)
        if deferred:
            self._submit_and_defer(context, run)
        try:
            if self.durable and hook.deploy_mode == "client" and context.get("task_state_store") is not None:
                self.execute_resumable(context)
                assert self._job_result is not None
                result = self._job_result
            else:
                result = run.run_attached()
        finally:
            # The driver's own UI died with it: its link would lead nowhere.
            self._push_links(context, hook, hook.application, live=False)
        return self._finish(context, spec, result)

    # -- Spark Connect ---------------------------------------------------------------------------------

    def _refuse_modes_connect_cannot_run(self) -> None:
        """Deferring, fire and forget, and an explicit ``durable=True`` need a driver process to watch or
        to reconnect to; on Spark Connect the driver logic is the task itself."""
        asked = [
            name for name, on in (("deferrable=True", self.deferrable and self.wait_for_completion),
                                  ("wait_for_completion=False", not self.wait_for_completion),
                                  ("durable=True", self._durable_requested is True)) if on
        ]  # fmt: skip
        if asked:
            raise MergeSpecInvalidError(
                f"MergeIntoOperator {self.task_id}: {' and '.join(asked)} cannot run on the Spark Connect "
                f"connection {self.conn_id!r}: there the merge's driver logic runs in the task itself, with "
                "no driver process for a trigger to watch or a retry to reconnect to. Leave them unset (a "
                "retry after a crash finds the commit or merges once more, by the idempotency key), or use a "
                "spark connection (spark-submit) for those modes."
            )

    def _merge_on_connect(self, spec: MergeSpec) -> dict[str, Any]:
        """Run the merge's driver logic here, its Spark work on the connection's Spark Connect server."""
        from spark_jobs.delta_merge.contract import (
            MergeJobError,
            failure_line,
            metrics_line,
            parse_failure_line,
            parse_metrics_line,
            run_merge,
            spark_failure,
        )

        hook = self._connect_hook = MergeConnectHook(self.conn_id)
        run = MergeRun(spec, None, self.log, lambda: self._committed(spec))
        self.log.info("Merging into %s on the Spark Connect server %s", spec.target.uri, hook.server)
        with hook.session() as spark:
            try:
                metrics = run_merge(cast("ClassicSession", spark), spec)
            except MergeJobError as error:
                failure = parse_failure_line(failure_line(error))
                return run.outcome(metrics=None, failure=failure, failed=True, cause=error)
            except Exception as error:
                if server_unreachable(error) or not hook.listening():
                    committed = self._committed(spec)
                    if committed is not None:
                        self.log.warning("The Spark Connect server went away after the merge committed "
                                         "version %d: reporting that commit", committed.version)  # fmt: skip
                        return committed.metrics()
                    raise MergeJobFailedError(
                        f"MERGE into {spec.target.uri} failed: {hook.unreachable(error, doing='merging')} "
                        "Nothing was committed; a retry (the task's retries, or clearing it) runs the merge "
                        "again."
                    ) from None
                failure = parse_failure_line(failure_line(spark_failure(error) or error))
                return run.outcome(metrics=None, failure=failure, failed=True, cause=error)
        # Through the metrics line, as a spark-submit run's metrics come: the same XCom either way.
        printed = parse_metrics_line(metrics_line(metrics.to_dict()))
        return run.outcome(metrics=printed, failure=None, failed=False)

    def _committed(self, spec: MergeSpec) -> MergeCommit | None:
        """The merge's commit, if the target's log holds it (never for a dry run)."""
        if spec.options.dry_run:
            return None
        return find_merge_commit(
            spec.target.uri, app_id=spec.run.app_id, app_version=spec.run.app_version,
            storage_options=spec.target.storage_options, credentials_from=spec.target.credentials_from,
        )  # fmt: skip

    def _storage_connections(self) -> list[str]:
        """The storage connections given, by parameter name (for messages)."""
        given = {"aws_conn_id": self.aws_conn_id, "azure_conn_id": self.azure_conn_id,
                 "gcp_conn_id": self.gcp_conn_id}  # fmt: skip
        return [name for name, conn_id in given.items() if conn_id is not None]

    def _make_hook(self, spec: MergeSpec, context: Context | None, *, detached: bool) -> MergeDriverHook:
        hook = MergeDriverHook.for_merge(
            conn_id=self.conn_id, name=f"delta-merge {spec.run.app_id}",
            spark_conf=self.spark_conf if context is None else with_openlineage_conf(
                self.spark_conf, context, parent_job=self.openlineage_inject_parent_job_info,
                transport=self.openlineage_inject_transport_info,
            ),
            env_vars=self.env_vars, detached=detached, spark_binary=self.spark_binary,
            delta=self.engine == "delta",
            executor_memory=self.executor_memory, driver_memory=self.driver_memory,
            executor_cores=self.executor_cores, num_executors=self.num_executors,
            total_executor_cores=self.total_executor_cores,
        )  # fmt: skip
        self._hook = cast("MergeDriverHook", hook)
        return self._hook

    def _submit_detached(self, run: MergeRun) -> dict[str, Any]:
        """Fire and forget: start spark-submit and return the merge's identity."""
        spec = run.spec
        result: dict[str, Any] = {
            "appId": spec.run.app_id, "appVersion": spec.run.app_version, "target": spec.target.uri,
            "skipped": False, "submitted": True,
        }  # fmt: skip
        driver = run.start(spec_in_file=False)
        if driver is not None:
            result |= {"pid": driver.pid, "driverLog": driver.driver_log}
        self.log.info("Submitted merge %s to %s; wait for its commit with MergeCommitSensor", spec.run.app_id,
                      run.driver_hook.master)  # fmt: skip
        return result

    # -- durable: ResumableJobMixin --------------------------------------------------------------------
    # execute_resumable() records the DriverRef that submit_job returns in the task state store before it
    # follows the driver; a retry that finds its driver RUNNING follows it instead of submitting again.

    def submit_job(self, context: Context) -> JsonValue:
        driver = self._run.start(spec_in_file=True)
        assert driver is not None  # durable runs are client-mode only
        return cast("JsonValue", driver.to_dict())

    def get_job_status(self, external_id: JsonValue, context: Context) -> str:
        spec = self._run.spec
        try:
            driver = DriverRef.from_dict(cast("Mapping[str, Any]", external_id))
        except (ValueError, TypeError) as error:
            self.log.warning("Ignoring the task state store's %s: %s", self.external_id_key, error)
            return "UNKNOWN"
        if not driver.is_for(spec.run.app_id, spec.run.app_version):
            return "OTHER_MERGE"  # a ref from before the task was cleared
        state = driver_state(driver)
        if state == "running":
            return "RUNNING"
        if state == "elsewhere":
            self.log.warning(
                "The previous try's driver (pid %d) was started on host %s, where this worker cannot look: "
                "submitting the merge again (the idempotency key still applies it once)", driver.pid,
                driver.host,
            )  # fmt: skip
            return "ON_ANOTHER_HOST"
        remove_spec_file(driver)
        return "EXITED"

    def is_job_active(self, status: str) -> bool:
        return status == "RUNNING"

    def is_job_succeeded(self, status: str) -> bool:
        return False  # a merge that committed was already reported as skipped before this decision

    def poll_until_complete(self, external_id: JsonValue, context: Context) -> None:
        self._job_result = self._run.follow(DriverRef.from_dict(cast("Mapping[str, Any]", external_id)))

    def get_job_result(self, external_id: JsonValue, context: Context) -> dict[str, Any] | None:
        return self._job_result

    # -- deferrable ------------------------------------------------------------------------------------

    def _submit_and_defer(self, context: Context, run: MergeRun) -> None:
        """Start the job without waiting (or find the previous try's driver still running), then defer."""
        store = context.get("task_state_store") if self.durable else None
        stored = None if store is None else store.get(self.external_id_key)
        driver: DriverRef | None
        if stored and self.is_job_active(self.get_job_status(stored, context)):
            driver = DriverRef.from_dict(cast("Mapping[str, Any]", stored))
            self.log.info("The previous try's driver (pid %d) still runs: deferring on it", driver.pid)
        else:
            driver = run.start(spec_in_file=False)
            if driver is not None and store is not None:
                store.set(self.external_id_key, cast("JsonValue", driver.to_dict()))
        spec, timeout = run.spec, self.execution_timeout
        deadline = None if timeout is None else time.time() + timeout.total_seconds()
        if driver is None and timeout is None:
            self.log.warning("Deferring on a cluster-mode application without execution_timeout: a "
                             "failed application is seen only by its missing commit")  # fmt: skip
        dry = spec.options.dry_run
        ref = None if driver is None else driver.to_dict()
        trigger = MergeCommitTrigger(
            target=spec.target.uri, app_id=None if dry else spec.run.app_id,
            app_version=None if dry else spec.run.app_version, storage_options=spec.target.storage_options,
            poll_interval=self.poll_interval, deadline=deadline, driver=ref,
        )  # fmt: skip
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, Any]:
        """Resume after the trigger's one event: the same XCom, asset event and task log as a waiting run,
        or the same error."""
        with one_clear_message(self.log):
            return self._execute_complete(context, event)

    def _execute_complete(self, context: Context, event: Mapping[str, Any]) -> dict[str, Any]:
        """The body of :meth:`execute_complete`."""
        spec = self.build_spec(context)
        self._spec = spec
        run = MergeRun(
            spec, self._make_hook(spec, None, detached=True), self.log, lambda: self._committed(spec)
        )
        ref = None if event.get("driver") is None else DriverRef.from_dict(event["driver"])
        if ref is not None and not run.driver_hook.replay(ref):
            self.log.info("The driver's output is on host %s, in %s", ref.host, ref.driver_log)
        if event.get("status") == "success":
            metrics = event.get("metrics")
            if metrics is not None:
                result = to_xcom(metrics, app_id=spec.run.app_id, app_version=spec.run.app_version)
            else:
                result = MergeCommit.from_dict(event["commit"]).metrics()
        elif event.get("timed_out"):
            if ref is not None and stop_driver(ref):
                self.log.warning("Stopped the driver (pid %d): the task timed out", ref.pid)
            raise AirflowTaskTimeout(str(event.get("message")))
        elif event.get("failure") is not None or event.get("exited"):
            failure = None if event.get("failure") is None else _job_failure(event["failure"])
            result = run.outcome(metrics=None, failure=failure, failed=True)
        else:
            raise MergeProviderError(f"Waiting for the merge into {spec.target.uri}: {event.get('message')}")
        self._push_links(context, run.driver_hook, run.driver_hook.application, live=False)
        return self._finish(context, spec, result)

    # -- results ---------------------------------------------------------------------------------------

    def _finish(self, context: Context, spec: MergeSpec, metrics: dict[str, Any]) -> dict[str, Any]:
        self.log.info("%s", format_summary(spec.target.uri, metrics))
        self.log.info("Merge %s (version %s) metrics:\n%s", metrics.get("appId"), metrics.get("appVersion"),
                      format_metrics_table(metrics))  # fmt: skip
        if not metrics.get("dryRun"):
            record_merge_event(context, self.outlets, target=spec.target.uri, metrics=metrics)
        self._result = metrics
        return metrics

    def _push_links(
        self, context: Context, hook: MergeDriverHook, application: SparkApplication, *, live: bool
    ) -> None:
        if not self.do_xcom_push:
            return
        rm_url = None
        if hook.master.startswith("yarn"):
            rm_url = hook.get_connection(self.conn_id).extra_dejson.get("yarn_resourcemanager_webapp_address")
        urls = application_links(application, master=hook.master, deploy_mode=hook.deploy_mode,
                                 yarn_rm_url=rm_url, live=live)  # fmt: skip
        push_links(context, urls, self.pushed_links, log=self.log)

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()
        if self._connect_hook is not None:
            self._connect_hook.interrupt()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Source as input, target as output with row and byte statistics; None without the openlineage
        provider."""
        from airflow_merge_provider.lineage import merge_lineage

        return None if self._spec is None else merge_lineage(self._spec, self._result or {})


def _check_engine(
    engine: str, *, options: Mapping[str, Any], dry_run: bool | None,
    expected_metrics: Mapping[str, Any] | None, target: object, storage_connections: Mapping[str, str | None],
) -> None:
    """Refuse an unknown engine, and for ``delta`` every argument only the native job honours, naming it.

    :raises MergeArgumentError: when the operator is built (a DAG import error), before anything runs.
    """
    from spark_jobs.delta_merge.contract import ENGINES, NATIVE_ONLY_OPTIONS

    if engine not in ENGINES:
        raise MergeArgumentError(
            f"MergeIntoOperator: engine must be one of {', '.join(ENGINES)}, found {engine!r}"
        )
    given_engine = options.get("engine") if isinstance(options, Mapping) else None
    if given_engine is not None and given_engine != engine:
        raise MergeArgumentError(
            f"MergeIntoOperator: options['engine'] is {given_engine!r} but engine is {engine!r}: give the "
            "engine once, as engine="
        )
    if engine != "delta":
        return
    storage = isinstance(target, Mapping) and bool(target.get("storage_options"))
    file_size = options.get("target_file_size") is not None
    connections = {name: ("target.storage_options", conn_id is not None)
                   for name, conn_id in storage_connections.items()}  # fmt: skip
    asked = {
        "dry_run": ("options.dry_run", dry_run or (dry_run is None and options.get("dry_run") is True)),
        "expected_metrics": ("expected_metrics", bool(expected_metrics)),
        "options['target_file_size']": ("options.target_file_size", file_size),
        "target's storage_options": ("target.storage_options", storage),
        **connections,
    }
    refused = [(name, field) for name, (field, given) in asked.items() if given]
    if refused:
        reasons = "; ".join(f"{name}: {NATIVE_ONLY_OPTIONS[field]}" for name, field in refused)
        raise MergeArgumentError(
            f"MergeIntoOperator: engine='delta' cannot honour {', '.join(name for name, _ in refused)} "
            f"({reasons}). Leave them out, or keep the native engine (the default), which does."
        )


def _conf_default(value: bool | None, key: str) -> bool:
    return conf.getboolean("openlineage", key, fallback=False) if value is None else value


def _job_failure(data: Mapping[str, Any]) -> JobFailure:
    from spark_jobs.delta_merge.contract import JobFailure

    return JobFailure(str(data["kind"]), str(data["message"]))


def _target_uri(target: str | Mapping[str, Any]) -> str:
    return str(target.get("uri", "")) if isinstance(target, Mapping) else target


def _is_template(text: str, template_ext: Sequence[str]) -> bool:
    """Whether Airflow renders ``text`` before the task runs: Jinja markup, or a file it reads by its
    extension (``.sql``)."""
    return any(mark in text for mark in ("{{", "{%", "{#")) or text.strip().endswith(tuple(template_ext))


def _check_literal_merge_sql(merge_sql: str, *, task_id: str) -> None:
    """A statement known when the DAG file is parsed is checked then (a DAG import error naming its line
    and column), as the rendered one is checked before anything is submitted (``build_spec``)."""
    from spark_jobs.delta_merge.contract import MergeSpecError, check_merge_sql

    try:
        check_merge_sql(merge_sql)
    except MergeSpecError as error:
        raise MergeSpecInvalidError(f"Invalid merge_sql for task {task_id}: {error}") from None
