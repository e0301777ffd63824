"""MergeIntoOperator: run one Delta Lake MERGE INTO on Spark, idempotently, and push its metrics."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from airflow_merge_provider.assets import default_outlet, record_merge_event
from airflow_merge_provider.errors import (
    MergeArgumentError,
    MergeMetricsNotFoundError,
    MergeProviderError,
    MergeSpecInvalidError,
    job_failed_error,
)
from airflow_merge_provider.hooks.merge_commit import MergeCommit, find_merge_commit
from airflow_merge_provider.hooks.merge_into import MergeSubmitHook, job_arguments
from airflow_merge_provider.metrics import format_metrics_table, format_summary, to_xcom

if TYPE_CHECKING:
    from spark_jobs.delta_merge.contract import MergeSpec

__all__ = ["MergeIntoOperator", "default_app_id"]

_CLAUSE_KINDS = ("matched", "not_matched", "not_matched_by_source")


def default_app_id(dag_id: str, task_id: str, run_id: str, map_index: int | None = None) -> str:
    """``airflow:<dag_id>.<task_id>:<run_id>[:<map_index>]``: one id per task of one DAG run."""
    app_id = f"airflow:{dag_id}.{task_id}:{run_id}"
    return app_id if map_index is None or map_index < 0 else f"{app_id}:{map_index}"


class MergeIntoOperator(BaseOperator):
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

    :param target: the Delta table: a path or URI, or ``{"uri", "storage_options"}``. (templated)
    :param source: a Parquet path or URI, or the contract's ``{"uri", "format", "options",
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
    :param dry_run: compute the metrics without writing or committing (None: as ``options`` say).
    :param commit_metadata: JSON values recorded in the commit's ``commitInfo`` (next to the task's ids
        under ``"airflow"``).
    :param conn_id: the Spark connection (a missing one is an error, not a silent fall back to yarn).
    :param spark_conf: extra ``--conf`` pairs. (templated)
    :param executor_memory: as SparkSubmitHook.
    :param driver_memory: as SparkSubmitHook.
    :param executor_cores: as SparkSubmitHook.
    :param num_executors: as SparkSubmitHook.
    :param total_executor_cores: as SparkSubmitHook.
    :param env_vars: environment of spark-submit; on a ``local`` master ``PYSPARK_PYTHON`` and
        ``PYSPARK_DRIVER_PYTHON`` default to the worker's Python, which has the job's dependencies.
    :param spark_binary: the spark-submit command (default: the connection's, else ``spark-submit``).
    :param aws_conn_id: an Airflow connection whose AWS credentials (and extras ``region_name``,
        ``endpoint_url``) complete the storage options of an S3 target and S3 source for this run only;
        keys given in ``storage_options`` win. Resolved at execute time (with the Amazon provider when it
        is installed, else login = access key id, password = secret, extra ``aws_session_token``); the
        credentials never reach the log, XCom or rendered fields. Needs client deploy mode and
        ``wait_for_completion`` (the spec then travels in a private file). Not templated.
    :param app_id: override the idempotency key's application id (templated: ``"accounts.{{ ds }}"``
        makes the merge apply once per logical date, whichever run or clear runs it).
    :param app_version: override the idempotency key's version (default: the DAG run's clear number).
    :param wait_for_completion: wait for the merge (default). False: start spark-submit and return its
        ``appId``/``appVersion`` at once (fire and forget; wait with MergeCommitSensor). The task then
        has no default outlet: give the sensor the table's asset instead.
    """

    template_fields: Sequence[str] = (
        "target", "source", "merge_sql", "condition", "when_matched", "when_not_matched",
        "when_not_matched_by_source", "options", "spark_conf", "app_id",
    )  # fmt: skip
    template_ext: Sequence[str] = (".sql",)
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "merge_sql": "sql", "condition": "sql", "source": "json", "when_matched": "json",
        "when_not_matched": "json", "when_not_matched_by_source": "json", "options": "json",
        "spark_conf": "json",
    }  # fmt: skip
    ui_color = "#00add4"

    def __init__(
        self,
        *,
        target: str | Mapping[str, Any],
        source: str | Mapping[str, Any],
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
        app_id: str | None = None,
        app_version: int | None = None,
        wait_for_completion: bool = True,
        **kwargs: Any,
    ) -> None:
        clause_lists = (when_matched, when_not_matched, when_not_matched_by_source)
        structural = condition is not None or any(clause_lists)
        if (merge_sql is None) == (not structural):
            found = "both" if merge_sql is not None else "neither"
            raise ValueError(
                f"MergeIntoOperator: give either merge_sql or condition with when_* clauses, found {found}"
            )
        super().__init__(**kwargs)
        self.target = target
        self.source = source
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
        self.app_id = app_id
        self.app_version = app_version
        self.wait_for_completion = wait_for_completion
        self._hook: MergeSubmitHook | None = None
        self._result: dict[str, Any] | None = None
        self._spec: MergeSpec | None = None
        dry = dry_run if dry_run is not None else bool(self.options.get("dry_run"))
        if "outlets" not in kwargs and wait_for_completion and not dry:
            dag = self.get_dag()
            dag_id = dag.dag_id if dag is not None else None
            self.outlets = [default_outlet(_target_uri(target), task_id=self.task_id, dag_id=dag_id)]

    # -- spec ------------------------------------------------------------------------------------------

    def build_spec(self, context: Context) -> MergeSpec:
        """The merge spec from the rendered fields, validated.

        :raises MergeSpecInvalidError: naming the field, what was expected and what was found.
        """
        from spark_jobs.delta_merge.contract import MergeSpec, MergeSpecError

        try:
            spec = MergeSpec.from_dict(self._spec_dict(context))
            spec.validate()
        except MergeSpecError as error:
            raise MergeSpecInvalidError(f"Invalid merge spec for task {self.task_id}: {error}") from error
        return spec

    def _spec_dict(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        app_id = self.app_id or default_app_id(ti.dag_id, ti.task_id, ti.run_id, ti.map_index)
        app_version = self.app_version
        if app_version is None:
            app_version = getattr(context["dag_run"], "clear_number", None) or 0
        airflow_ids = {
            "dagId": ti.dag_id, "taskId": ti.task_id, "runId": ti.run_id, "mapIndex": ti.map_index,
            "tryNumber": ti.try_number,
        }  # fmt: skip
        options = dict(self.options)
        if self.dry_run_merge is not None:
            options["dry_run"] = self.dry_run_merge
        spec: dict[str, Any] = {
            "target": dict(self.target) if isinstance(self.target, Mapping) else {"uri": self.target},
            "source": dict(self.source) if isinstance(self.source, Mapping) else {
                "uri": self.source, "format": "parquet"
            },
            "options": options,
            "run": {
                "app_id": app_id, "app_version": app_version,
                "commit_metadata": {**self.commit_metadata, "airflow": airflow_ids},
            },
            "expected_metrics": self.expected_metrics,
        }  # fmt: skip
        if self.merge_sql is not None:
            spec["merge_sql"] = self.merge_sql
            return spec
        aliases = {"target_alias": self.target_alias, "source_alias": self.source_alias}
        spec |= {key: value for key, value in aliases.items() if value is not None}
        spec["condition"] = self.condition
        spec["clauses"] = self._clauses()
        return spec

    def _clauses(self) -> list[dict[str, Any]]:
        lists = (self.when_matched, self.when_not_matched, self.when_not_matched_by_source)
        clauses = []
        for when, items in zip(_CLAUSE_KINDS, lists, strict=True):
            for index, item in enumerate(items):
                where = f"when_{when}[{index}]"
                if not isinstance(item, Mapping):
                    raise MergeSpecInvalidError(f"{where}: expected a clause dict, found {item!r}")
                if item.get("when", when) != when:
                    raise MergeSpecInvalidError(f"{where}.when: expected {when!r}, found {item['when']!r}")
                clauses.append({**item, "when": when})
        return clauses

    # -- execution -------------------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        spec = self.build_spec(context)
        self._spec = spec
        target, app_id, app_version = spec.target.uri, spec.run.app_id, spec.run.app_version
        self.log.info("Merge spec:\n%s", _redacted(spec).to_json(indent=2))
        # From here on the spec may hold the connection's credentials: it stays local to this call.
        spec = self._with_connection_credentials(spec)
        if not spec.options.dry_run:
            committed = self._committed(spec)
            if committed is not None:
                self.log.info(
                    "The merge %s (version %s) already committed %s version %d: not applying it again",
                    app_id, app_version, target, committed.version,
                )  # fmt: skip
                return self._finish(context, spec, committed.metrics(skipped=True))
        hook = self._make_hook(spec)
        from airflow_merge_provider.hooks.storage_credentials import secret_option_keys

        secret_keys = sorted({*secret_option_keys(spec.target.storage_options),
                              *secret_option_keys(spec.source.storage_options)})  # fmt: skip
        if (self.aws_conn_id is not None or secret_keys) and (
            hook.deploy_mode == "cluster" or not self.wait_for_completion
        ):
            # Only a waiting client-mode driver reads the spec from a private file on this machine; any
            # other driver would get it on spark-submit's command line, credentials included. Options
            # without secrets (endpoint, region) may travel there.
            given = f"storage_options {secret_keys}" if secret_keys else "aws_conn_id"
            raise MergeArgumentError(
                f"{given}: credentials in storage_options and aws_conn_id need client deploy mode and "
                f"wait_for_completion=True (found deploy mode {hook.deploy_mode!r}, "
                f"wait_for_completion={self.wait_for_completion}): otherwise they would be on spark-submit's "
                "command line. Give cluster-mode or detached drivers credentials through their environment "
                "(spark.yarn.appMasterEnv.*, spark.kubernetes.driver.secretKeyRef.*) or instance roles, and "
                "keep only options without secrets (endpoint, region) in storage_options."
            )
        if spec.options.dry_run and hook.deploy_mode == "cluster":
            raise MergeSpecInvalidError(
                "dry_run needs client deploy mode: in cluster mode the driver's output (the only place a dry "
                "run's metrics go) does not reach spark-submit"
            )
        if not self.wait_for_completion:
            return self._submit_detached(hook, spec)
        return self._finish(context, spec, self._submit(hook, spec))

    def _with_connection_credentials(self, spec: MergeSpec) -> MergeSpec:
        """The spec with ``aws_conn_id``'s credentials in its S3 target's and source's storage options."""
        if self.aws_conn_id is None:
            return spec
        from dataclasses import replace

        from airflow_merge_provider.hooks.storage_credentials import StorageCredentialsHook, with_credentials

        credentials = StorageCredentialsHook(aws_conn_id=self.aws_conn_id).storage_options()
        self.log.info("Storage credentials from connection %r (keys: %s)", self.aws_conn_id,
                      ", ".join(sorted(credentials)))  # fmt: skip
        target = replace(spec.target, storage_options=with_credentials(
            credentials, spec.target.storage_options, uri=spec.target.uri))  # fmt: skip
        source = replace(spec.source, storage_options=with_credentials(
            credentials, spec.source.storage_options, uri=spec.source.uri))  # fmt: skip
        return replace(spec, target=target, source=source)

    def _committed(self, spec: MergeSpec) -> MergeCommit | None:
        return find_merge_commit(
            spec.target.uri, app_id=spec.run.app_id, app_version=spec.run.app_version,
            storage_options=spec.target.storage_options,
        )  # fmt: skip

    def _make_hook(self, spec: MergeSpec) -> MergeSubmitHook:
        self._hook = MergeSubmitHook.for_merge(
            conn_id=self.conn_id, name=f"delta-merge {spec.run.app_id}", spark_conf=self.spark_conf,
            env_vars=self.env_vars, detached=not self.wait_for_completion, spark_binary=self.spark_binary,
            executor_memory=self.executor_memory, driver_memory=self.driver_memory,
            executor_cores=self.executor_cores, num_executors=self.num_executors,
            total_executor_cores=self.total_executor_cores,
        )  # fmt: skip
        return self._hook

    def _submit(self, hook: MergeSubmitHook, spec: MergeSpec) -> dict[str, Any]:
        from airflow_merge_provider.job_package import job_application

        # A file keeps storage options off the command line; only a client-mode driver can read it.
        secrets = bool(spec.target.storage_options or spec.source.storage_options)
        in_file = hook.deploy_mode == "client" and secrets
        with job_arguments(spec.to_json(), in_file=in_file) as args:
            try:
                hook.submit_job(job_application(), args)
            except MergeProviderError:
                raise
            except AirflowException as error:
                # Success is never decided from an exit code alone: the commit may have landed.
                committed = None if spec.options.dry_run else self._committed(spec)
                if committed is None:
                    failure = hook.failure
                    raise job_failed_error(
                        spec.target.uri, None if failure is None else failure.kind,
                        None if failure is None else failure.message,
                    ) from error  # fmt: skip
                self.log.warning(
                    "spark-submit failed, but the merge committed version %d: reporting that commit",
                    committed.version,
                )
                return committed.metrics()
        if hook.metrics is not None:
            return to_xcom(hook.metrics, app_id=spec.run.app_id, app_version=spec.run.app_version)
        committed = None if spec.options.dry_run else self._committed(spec)
        if committed is None:
            raise MergeMetricsNotFoundError(
                f"spark-submit succeeded but printed no metrics line, and {spec.target.uri} holds no commit "
                f"of {spec.run.app_id} (version {spec.run.app_version}). Check the driver's log."
            )
        return committed.metrics()

    def _submit_detached(self, hook: MergeSubmitHook, spec: MergeSpec) -> dict[str, Any]:
        from airflow_merge_provider.job_package import job_application

        args = ["--spec-json", spec.to_json()]
        result: dict[str, Any] = {
            "appId": spec.run.app_id, "appVersion": spec.run.app_version, "target": spec.target.uri,
            "skipped": False, "submitted": True,
        }  # fmt: skip
        if hook.deploy_mode == "cluster":
            hook.submit_job(job_application(), args)
            self.log.info(
                "Submitted merge %s to %s; wait for its commit with MergeCommitSensor",
                spec.run.app_id, hook.master,
            )  # fmt: skip
            return result
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(spec.run.app_id))[:150]
        log_path = Path(tempfile.gettempdir()) / "airflow-merge-provider" / "detached" / f"{name}.log"
        result["pid"] = hook.submit_detached(job_application(), args, log_path=str(log_path))
        result["driverLog"] = str(log_path)
        self.log.info(
            "Started spark-submit (pid %d, driver output in %s) for merge %s; wait for its commit with "
            "MergeCommitSensor", result["pid"], log_path, spec.run.app_id,
        )  # fmt: skip
        return result

    def _finish(self, context: Context, spec: MergeSpec, metrics: dict[str, Any]) -> dict[str, Any]:
        self.log.info("%s", format_summary(spec.target.uri, metrics))
        self.log.info("Merge %s (version %s) metrics:\n%s", metrics.get("appId"), metrics.get("appVersion"),
                      format_metrics_table(metrics))  # fmt: skip
        if not metrics.get("dryRun"):
            record_merge_event(context, self.outlets, target=spec.target.uri, metrics=metrics)
        self._result = metrics
        return metrics

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.on_kill()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Source as input, target as output with row and byte statistics; None without the openlineage
        provider."""
        from airflow_merge_provider.lineage import merge_lineage

        return None if self._spec is None else merge_lineage(self._spec, self._result or {})


def _target_uri(target: str | Mapping[str, Any]) -> str:
    return str(target.get("uri", "")) if isinstance(target, Mapping) else target


def _redacted(spec: MergeSpec) -> MergeSpec:
    """The spec with storage option values hidden, for the log."""
    from dataclasses import replace

    target = replace(spec.target, storage_options=dict.fromkeys(spec.target.storage_options, "***"))
    source = replace(spec.source, storage_options=dict.fromkeys(spec.source.storage_options, "***"))
    return replace(spec, target=target, source=source)
