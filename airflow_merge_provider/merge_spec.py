"""The merge spec from MergeIntoOperator's rendered fields: idempotency key, clauses, a redacted copy."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from airflow_merge_provider.errors import MergeSpecInvalidError

if TYPE_CHECKING:
    from spark_jobs.delta_merge.contract import MergeSpec

__all__ = ["app_version_value", "default_app_id", "option_names", "redacted", "spec_dict"]

CLAUSE_KINDS = ("matched", "not_matched", "not_matched_by_source")


def default_app_id(dag_id: str, task_id: str, run_id: str, map_index: int | None = None) -> str:
    """``airflow:<dag_id>.<task_id>:<run_id>[:<map_index>]``: one id per task of one DAG run."""
    app_id = f"airflow:{dag_id}.{task_id}:{run_id}"
    return app_id if map_index is None or map_index < 0 else f"{app_id}:{map_index}"


def app_version_value(value: object) -> int | None:
    """``app_version`` as rendered: an int, or the text of one (a template renders to text).

    :raises MergeSpecInvalidError: anything else, naming what was found.
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        return int(value.strip())
    raise MergeSpecInvalidError(
        f"app_version: expected a non-negative integer (or a template rendering to one, e.g. "
        f"'{{{{ ds_nodash }}}}'), found {value!r}"
    )


def spec_dict(
    *,
    fields: Mapping[str, Any],
    dag_id: str,
    task_id: str,
    run_id: str,
    map_index: int | None,
    try_number: int,
    clear_number: int,
) -> dict[str, Any]:
    """The spec's JSON form from the operator's rendered ``fields`` (its attribute names: ``target``,
    ``source``, ``merge_sql``, ``condition``, ``when_*``, ``target_alias``, ``source_alias``, ``options``,
    ``dry_run``, ``expected_metrics``, ``commit_metadata``, ``app_id``, ``app_version``) and the task
    instance it runs as.

    :raises MergeSpecInvalidError: a clause or ``app_version`` has the wrong shape.
    """
    app_id = fields["app_id"] or default_app_id(dag_id, task_id, run_id, map_index)
    app_version = app_version_value(fields["app_version"])
    if app_version is None:
        app_version = clear_number
    airflow_ids = {"dagId": dag_id, "taskId": task_id, "runId": run_id, "mapIndex": map_index,
                   "tryNumber": try_number}  # fmt: skip
    options = dict(fields["options"])
    if fields["dry_run"] is not None:
        options["dry_run"] = fields["dry_run"]
    target, source = fields["target"], fields["source"]
    spec: dict[str, Any] = {
        "target": dict(target) if isinstance(target, Mapping) else {"uri": target},
        "source": dict(source) if isinstance(source, Mapping) else {"uri": source, "format": "parquet"},
        "options": options,
        "run": {
            "app_id": app_id, "app_version": app_version,
            "commit_metadata": {**fields["commit_metadata"], "airflow": airflow_ids},
        },
        "expected_metrics": _numbers(fields["expected_metrics"]),
    }  # fmt: skip
    if fields["merge_sql"] is not None:
        spec["merge_sql"] = fields["merge_sql"]
        return spec
    aliases = {"target_alias": fields["target_alias"], "source_alias": fields["source_alias"]}
    spec |= {key: value for key, value in aliases.items() if value is not None}
    spec["condition"] = fields["condition"]
    spec["clauses"] = _clauses([fields[f"when_{when}"] for when in CLAUSE_KINDS])
    return spec


def _numbers(expected_metrics: Any) -> Any:
    """``expected_metrics`` with thresholds rendered from templates (text) as numbers; anything else is
    left for the spec's validation to name."""
    if not isinstance(expected_metrics, Mapping):
        return expected_metrics
    return {
        metric: {key: _number(value) for key, value in checks.items()}
        if isinstance(checks, Mapping)
        else checks
        for metric, checks in expected_metrics.items()
    }


def _number(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value.strip())
        except ValueError:
            pass
    return value


def _clauses(lists: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    clauses = []
    for when, items in zip(CLAUSE_KINDS, lists, strict=True):
        for index, item in enumerate(items):
            where = f"when_{when}[{index}]"
            if not isinstance(item, Mapping):
                raise MergeSpecInvalidError(f"{where}: expected a clause dict, found {item!r}")
            if item.get("when", when) != when:
                raise MergeSpecInvalidError(f"{where}.when: expected {when!r}, found {item['when']!r}")
            clauses.append({**item, "when": when})
    return clauses


def redacted(spec: MergeSpec) -> MergeSpec:
    """The spec with storage option values hidden, for the log."""
    target = replace(spec.target, storage_options=dict.fromkeys(spec.target.storage_options, "***"))
    source = replace(spec.source, storage_options=dict.fromkeys(spec.source.storage_options, "***"))
    return replace(spec, target=target, source=source)


def option_names() -> list[str]:
    """The spec's option names (``schema_evolution``, ``dry_run``, ...); loads the contract's MergeSpec."""
    from dataclasses import fields

    from spark_jobs.delta_merge.contract import MergeSpec

    (options,) = [field for field in fields(MergeSpec) if field.name == "options"]
    default = cast("Callable[[], Any]", options.default_factory)()
    return [field.name for field in fields(default)]
