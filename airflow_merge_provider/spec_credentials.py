"""Credentials in a merge spec: storage connections' added at execute time, and where a spec may carry
them."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_merge_provider.errors import MergeArgumentError

if TYPE_CHECKING:
    from spark_jobs.delta_merge.contract import MergeSpec, SourceSpec, TargetSpec

_Part = TypeVar("_Part", "TargetSpec", "SourceSpec")

__all__ = ["refuse_credentials_on_the_command_line", "with_connection_credentials"]


def with_connection_credentials(
    spec: MergeSpec, *, aws_conn_id: str | None, azure_conn_id: str | None = None,
    gcp_conn_id: str | None = None, log: Any,
) -> MergeSpec:  # fmt: skip
    """``spec`` with the connections' credentials in its target's and source's storage options, each from
    the connection for its store (S3: ``aws_conn_id``, Azure: ``azure_conn_id``, GCS: ``gcp_conn_id``; keys
    given there win) and named as their source for the job's storage errors; ``spec`` itself without
    connections. Logs only the keys' names."""
    connections = {"aws_conn_id": aws_conn_id, "azure_conn_id": azure_conn_id, "gcp_conn_id": gcp_conn_id}
    if all(conn_id is None for conn_id in connections.values()):
        return spec
    return replace(spec, target=_with_connection(spec.target, connections, log),
                   source=_with_connection(spec.source, connections, log))  # fmt: skip


def _with_connection(part: _Part, connections: dict[str, str | None], log: Any) -> _Part:
    """The spec's target or source with its store's connection credentials, named as their source."""
    from airflow_merge_provider.hooks.storage_credentials import connection_storage_options

    options, named = connection_storage_options(part.storage_options, uri=part.uri, **connections)
    if named is not None:
        log.info("Storage credentials of %s from %s (keys: %s)", part.uri, named,
                 ", ".join(sorted(set(options) - set(part.storage_options))))  # fmt: skip
    return replace(part, storage_options=options, credentials_from=named or part.credentials_from)


def refuse_credentials_on_the_command_line(
    spec: MergeSpec, *, connections: list[str], deploy_mode: str, private_file: bool, how: str
) -> None:
    """Refuse a spec with credentials (storage connections, secret storage options) unless it travels in a
    private file: only a waiting client-mode driver reads the spec from a file on this machine; any other
    driver would get it on spark-submit's command line. Options without secrets (endpoint, region) may.

    :param connections: the storage connections given (``"aws_conn_id"``, ``"azure_conn_id"``,
        ``"gcp_conn_id"``).
    :param private_file: whether this run passes the spec in a private file.
    :param how: how the task runs, for the message (``"deferrable=True"``, ...).
    :raises MergeArgumentError: naming the keys and what to do instead.
    """
    from airflow_merge_provider.hooks.storage_credentials import secret_option_keys

    secret_keys = sorted({*secret_option_keys(spec.target.storage_options),
                          *secret_option_keys(spec.source.storage_options)})  # fmt: skip
    if private_file or not (connections or secret_keys):
        return
    given = f"storage_options {secret_keys}" if secret_keys else " and ".join(connections)
    raise MergeArgumentError(
        f"{given}: credentials in storage_options or a storage connection need client deploy mode and a "
        f"waiting task (found deploy mode {deploy_mode!r}, {how}): otherwise they would be on spark-submit's "
        "command line. Give cluster-mode, deferred or detached drivers credentials through their environment "
        "(spark.yarn.appMasterEnv.*, spark.kubernetes.driver.secretKeyRef.*) or instance roles, and keep "
        "only options without secrets (endpoint, region) in storage_options."
    )
