"""One merge's Spark application: started attached or detached, followed to its end, and its outcome read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_merge_provider.driver_process import DriverRef
from airflow_merge_provider.errors import MergeMetricsNotFoundError, MergeProviderError, job_failed_error
from airflow_merge_provider.hooks.merge_into import job_arguments
from airflow_merge_provider.metrics import to_xcom

if TYPE_CHECKING:
    from airflow_merge_provider.hooks.merge_commit import MergeCommit
    from airflow_merge_provider.hooks.merge_driver import MergeDriverHook
    from spark_jobs.delta_merge.contract import JobFailure, MergeSpec

__all__ = ["MergeRun"]


@dataclass
class MergeRun:
    """The spec (credentials included: keep it out of logs and XCom) and the hook of one merge.

    :param log: the task's logger.
    :param committed: the merge's commit, if the target's log holds it (None for a dry run).
    """

    spec: MergeSpec
    hook: MergeDriverHook | None  # None on Spark Connect: the task runs the driver logic itself
    log: Any
    committed: Callable[[], MergeCommit | None]

    @property
    def driver_hook(self) -> MergeDriverHook:
        """The spark-submit hook of a merge run through spark-submit."""
        assert self.hook is not None, "a Spark Connect merge has no spark-submit driver"
        return self.hook

    def run_attached(self) -> dict[str, Any]:
        """Run spark-submit as a child, its output through a pipe, and wait for it; return the XCom."""
        from airflow_merge_provider.job_package import job_application

        hook, spec = self.driver_hook, self.spec
        # A file keeps storage options off the command line; only a client-mode driver can read it.
        secrets = bool(spec.target.storage_options or spec.source.storage_options)
        in_file = hook.deploy_mode == "client" and secrets
        with job_arguments(spec.to_json(), in_file=in_file) as args:
            try:
                hook.submit_job(job_application(), args)
            except MergeProviderError:
                raise
            except AirflowException as error:
                return self.outcome(metrics=None, failure=hook.failure, failed=True, cause=error)
        return self.outcome(metrics=hook.metrics, failure=hook.failure, failed=False)

    def start(self, *, spec_in_file: bool) -> DriverRef | None:
        """Start the job without waiting: a detached driver in client mode (its ref), or, in cluster mode,
        spark-submit until the cluster has accepted the application (None).

        :param spec_in_file: pass the spec in a private file, removed once the driver has exited.
        """
        from airflow_merge_provider.job_package import job_application

        spec, hook = self.spec, self.driver_hook
        if hook.deploy_mode == "cluster":
            hook.submit_job(job_application(), ["--spec-json", spec.to_json()])
            return None
        driver = hook.start_driver(
            job_application(), spec_json=spec.to_json(), app_id=str(spec.run.app_id),
            app_version=int(spec.run.app_version or 0), spec_in_file=spec_in_file,
        )  # fmt: skip
        self.log.info("Started spark-submit (pid %d on %s; its output goes to %s) for merge %s", driver.pid,
                      driver.host, driver.driver_log, spec.run.app_id)  # fmt: skip
        return driver

    def follow(self, driver: DriverRef) -> dict[str, Any]:
        """Follow a detached driver's log into the task log until it exits; return the XCom."""
        hook = self.driver_hook
        exit_code = hook.follow(driver)
        # Reconnected, this process cannot have the exit code: the job's own lines and the log decide.
        failed = hook.failure is not None or (hook.metrics is None if exit_code is None else exit_code != 0)
        return self.outcome(metrics=hook.metrics, failure=hook.failure, failed=failed)

    def outcome(
        self,
        *,
        metrics: Mapping[str, Any] | None,
        failure: JobFailure | None,
        failed: bool,
        cause: BaseException | None = None,
    ) -> dict[str, Any]:
        """The XCom of a driver that has ended, however it was waited for: its metrics line, else its
        commit; else the error its failure line (or its silence) says.

        Success is never decided from an exit code alone: a driver may die after its commit landed.

        :raises MergeJobFailedError: classified by the job's failure line (:func:`job_failed_error`).
        :raises MergeMetricsNotFoundError: the driver succeeded but left neither metrics nor a commit.
        """
        spec = self.spec
        if metrics is not None and not failed:
            return to_xcom(metrics, app_id=spec.run.app_id, app_version=spec.run.app_version)
        committed = self.committed()
        if committed is not None:
            if failed:
                self.log.warning("spark-submit failed, but the merge committed version %d: reporting that "
                                 "commit", committed.version)  # fmt: skip
            return committed.metrics()
        if failed:
            kind, message = (None, None) if failure is None else (failure.kind, failure.message)
            raise job_failed_error(spec.target.uri, kind, message) from cause
        raise MergeMetricsNotFoundError(
            f"spark-submit succeeded but printed no metrics line, and {spec.target.uri} holds no commit "
            f"of {spec.run.app_id} (version {spec.run.app_version}). Check the driver's log."
        )
