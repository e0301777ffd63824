"""Credentials in a merge spec: an AWS connection's added at execute time, and where a spec may carry them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_merge_provider.errors import MergeArgumentError

if TYPE_CHECKING:
    from spark_jobs.delta_merge.contract import MergeSpec

__all__ = ["refuse_credentials_on_the_command_line", "with_connection_credentials"]


def with_connection_credentials(spec: MergeSpec, aws_conn_id: str | None, *, log: Any) -> MergeSpec:
    """``spec`` with ``aws_conn_id``'s credentials in its S3 target's and source's storage options (keys
    given there win); ``spec`` itself without a connection. Log only the keys' names."""
    if aws_conn_id is None:
        return spec
    from airflow_merge_provider.hooks.storage_credentials import StorageCredentialsHook, with_credentials

    credentials = StorageCredentialsHook(aws_conn_id=aws_conn_id).storage_options()
    log.info("Storage credentials from connection %r (keys: %s)", aws_conn_id, ", ".join(sorted(credentials)))
    target = replace(spec.target, storage_options=with_credentials(
        credentials, spec.target.storage_options, uri=spec.target.uri))  # fmt: skip
    source = replace(spec.source, storage_options=with_credentials(
        credentials, spec.source.storage_options, uri=spec.source.uri))  # fmt: skip
    return replace(spec, target=target, source=source)


def refuse_credentials_on_the_command_line(
    spec: MergeSpec, *, aws_conn_id: str | None, deploy_mode: str, private_file: bool, how: str
) -> None:
    """Refuse a spec with credentials (``aws_conn_id``, secret storage options) unless it travels in a
    private file: only a waiting client-mode driver reads the spec from a file on this machine; any other
    driver would get it on spark-submit's command line. Options without secrets (endpoint, region) may.

    :param private_file: whether this run passes the spec in a private file.
    :param how: how the task runs, for the message (``"deferrable=True"``, ...).
    :raises MergeArgumentError: naming the keys and what to do instead.
    """
    from airflow_merge_provider.hooks.storage_credentials import secret_option_keys

    secret_keys = sorted({*secret_option_keys(spec.target.storage_options),
                          *secret_option_keys(spec.source.storage_options)})  # fmt: skip
    if private_file or not (aws_conn_id is not None or secret_keys):
        return
    given = f"storage_options {secret_keys}" if secret_keys else "aws_conn_id"
    raise MergeArgumentError(
        f"{given}: credentials in storage_options and aws_conn_id need client deploy mode and a waiting task "
        f"(found deploy mode {deploy_mode!r}, {how}): otherwise they would be on spark-submit's command "
        "line. Give cluster-mode, deferred or detached drivers credentials through their environment "
        "(spark.yarn.appMasterEnv.*, spark.kubernetes.driver.secretKeyRef.*) or instance roles, and keep "
        "only options without secrets (endpoint, region) in storage_options."
    )
