"""A Delta table as an Airflow Asset, and the asset event that carries a merge's metrics."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import Asset, AssetAlias, Context

__all__ = ["default_outlet", "record_merge_event", "table_asset", "table_asset_uri"]


def table_asset_uri(uri: str) -> str:
    """The asset URI of a table: ``file://`` + the absolute path for a local path, other URIs unchanged."""
    if urlsplit(uri).scheme:
        return uri
    return "file://" + os.path.abspath(uri)


def table_asset(uri: str) -> Asset:
    """The Asset standing for the Delta table at ``uri`` (schedule downstream DAGs on it)."""
    return Asset(uri=table_asset_uri(uri))


def default_outlet(target: str, *, task_id: str, dag_id: str | None) -> Asset | AssetAlias:
    """The table as an Asset, or, for a target only known once templated, an alias the task resolves."""
    if "{{" in target or "{%" in target:
        owner = f"{dag_id}.{task_id}" if dag_id else task_id
        return AssetAlias(name=f"delta-merge:{owner}")
    return table_asset(target)


def record_merge_event(
    context: Context, outlets: Iterable[Any], *, target: str, metrics: Mapping[str, Any]
) -> None:
    """Attach ``metrics`` as the extra of the table's asset event (through an alias where one is used).

    Outlets naming other assets are left alone: their events carry no merge metrics.
    """
    table = table_asset(target)
    extra: dict[str, Any] = dict(metrics)
    for outlet in outlets:
        if isinstance(outlet, Asset) and outlet.uri == table.uri:
            context["outlet_events"][outlet].extra = extra
        elif isinstance(outlet, AssetAlias) and outlet.name.startswith("delta-merge:"):
            context["outlet_events"][outlet].add(table, extra=extra)
