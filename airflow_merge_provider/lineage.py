"""OpenLineage for a merge: the source read, the target written with row and byte statistics; the task's
parent job and transport handed to the Spark application's conf."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_merge_provider.assets import table_asset_uri

if TYPE_CHECKING:
    from airflow.sdk import Context

    from spark_jobs.delta_merge.contract import MergeSpec

__all__ = ["dataset_name", "merge_lineage", "with_openlineage_conf"]


def dataset_name(uri: str) -> tuple[str, str]:
    """OpenLineage (namespace, name): ``file`` and the path, or ``scheme://authority`` and the key."""
    parts = urlsplit(table_asset_uri(uri))
    if parts.scheme == "file":
        return "file", parts.path
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/")


def merge_lineage(spec: MergeSpec, metrics: Mapping[str, Any]) -> Any:
    """An ``OperatorLineage``, or None when the openlineage provider is not installed."""
    try:
        from airflow.providers.common.compat.openlineage.facet import (
            Dataset,
            OutputDataset,
            OutputStatisticsOutputDatasetFacet,
        )
        from airflow.providers.openlineage.extractors import (  # type: ignore[import-not-found,unused-ignore]
            OperatorLineage,
        )
    except ImportError:
        return None
    stats = OutputStatisticsOutputDatasetFacet(
        rowCount=int(metrics.get("numOutputRows", 0)), size=int(metrics.get("numTargetBytesAdded", 0))
    )
    # A query source names no dataset of its own.
    inputs = [] if spec.source.uri is None else [Dataset(*dataset_name(spec.source.uri))]
    namespace, name = dataset_name(spec.target.uri)
    output = OutputDataset(namespace, name, outputFacets={"outputStatistics": stats})
    return OperatorLineage(inputs=inputs, outputs=[output])


def with_openlineage_conf(
    spark_conf: Mapping[str, Any], context: Context, *, parent_job: bool, transport: bool
) -> dict[str, Any]:
    """``spark_conf`` with the task's OpenLineage parent job (``spark.openlineage.parent*``) and transport
    (``spark.openlineage.transport.*``) as SparkSubmitOperator adds them, for the OpenLineage Spark listener
    when the application has it; without the openlineage provider the conf is left as it is (with a
    warning from Airflow's compat layer)."""
    conf = dict(spark_conf)
    if not (parent_job or transport):
        return conf
    from airflow.providers.common.compat.openlineage.utils.spark import (
        inject_parent_job_information_into_spark_properties,
        inject_transport_information_into_spark_properties,
    )

    if parent_job:
        conf = inject_parent_job_information_into_spark_properties(conf, context)
    if transport:
        conf = inject_transport_information_into_spark_properties(conf, context)
    return conf
