"""Provider metadata that Airflow reads through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any

from airflow_merge_provider import __version__

__all__ = ["INTEGRATION_NAME", "PACKAGE_NAME", "get_provider_info"]

PACKAGE_NAME = "airflow-merge-provider"
INTEGRATION_NAME = "Delta Lake MERGE on Spark"

# Modules Airflow lists for this provider, by kind. Name a module here only once it exists: Airflow imports
# each one when it builds its lists (tests/unit/test_packaging.py imports them all, without Spark).
_OPERATOR_MODULES: tuple[str, ...] = (
    "airflow_merge_provider.operators.merge_into",
    "airflow_merge_provider.operators.merge_metrics_branch",
)
_SENSOR_MODULES: tuple[str, ...] = ("airflow_merge_provider.sensors.merge_commit",)
_HOOK_MODULES: tuple[str, ...] = (
    "airflow_merge_provider.hooks.merge_commit",
    "airflow_merge_provider.hooks.merge_into",
    "airflow_merge_provider.hooks.storage_credentials",
)
_TRIGGER_MODULES: tuple[str, ...] = ("airflow_merge_provider.triggers.merge_commit",)
# Operator links by class path: Airflow imports them to show their buttons (MergeIntoOperator's).
_EXTRA_LINKS: tuple[str, ...] = (
    "airflow_merge_provider.links.SparkApplicationUiLink",
    "airflow_merge_provider.links.SparkDriverLogLink",
)


def _by_integration(modules: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"integration-name": INTEGRATION_NAME, "python-modules": list(modules)}] if modules else []


def get_provider_info() -> dict[str, Any]:
    """Describe the provider as Airflow's ``provider_info.schema.json`` expects.

    Kinds with no module yet are left out rather than listed empty.
    """
    info: dict[str, Any] = {
        "package-name": PACKAGE_NAME,
        "name": "Delta Lake MERGE",
        "description": (
            "Runs Delta Lake ``MERGE INTO`` on Spark through a packaged PySpark job, and waits for merge "
            "commits in a table's Delta log."
        ),
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION_NAME,
                "external-doc-url": "https://docs.delta.io/latest/delta-update.html",
                "tags": ["software"],
            }
        ],
    }
    for key, modules in (
        ("operators", _OPERATOR_MODULES),
        ("sensors", _SENSOR_MODULES),
        ("hooks", _HOOK_MODULES),
        ("triggers", _TRIGGER_MODULES),
    ):
        listed = _by_integration(modules)
        if listed:
            info[key] = listed
    info["extra-links"] = list(_EXTRA_LINKS)
    return info
