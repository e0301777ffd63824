"""MergeMetricsBranchOperator: follow one set of tasks or another depending on a merge's metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow.sdk import BaseBranchOperator, Context

from airflow_merge_provider.argument_check import reject_unknown_arguments
from airflow_merge_provider.errors import MergeArgumentError
from spark_jobs.delta_merge.contract import failed_expectations

__all__ = ["BRANCH_ARGUMENT_MEANINGS", "MergeMetricsBranchOperator"]

# The names other branch operators give these settings (reject_unknown_arguments' hints).
BRANCH_ARGUMENT_MEANINGS: dict[str, str] = {
    **dict.fromkeys(("merge_task", "upstream_task_id", "metrics_task_id", "xcom_task_id"), "merge_task_id"),
    **dict.fromkeys(("map_index", "merge_map_idx"), "merge_map_index"),
    **dict.fromkeys(("checks", "expected_metrics", "metrics_condition", "python_callable"), "condition"),
    **dict.fromkeys(("true_branch", "if_true", "branch_true"), "follow_task_ids_if_true"),
    **dict.fromkeys(("false_branch", "if_false", "branch_false"), "follow_task_ids_if_false"),
}

MetricsCondition = Callable[[Mapping[str, Any]], bool]


class MergeMetricsBranchOperator(BaseBranchOperator):
    """Branch on the metrics an upstream MergeIntoOperator (or MergeCommitSensor) pushed to XCom.

    ``condition`` is a callable taking the metrics dict, e.g.
    ``lambda m: m["numTargetRowsDeleted"] > 0``, or checks in the merge contract's form, all of which must
    hold: ``{"numTargetRowsDeleted": {"greater_than": 0}}`` (``equal_to``, ``greater_than``,
    ``less_than``, ``geq_to``, ``leq_to``, ``tolerance``).

    :param merge_task_id: (required) the task whose XCom return value holds the metrics.
    :param condition: (required) a callable or comparator checks, as above.
    :param follow_task_ids_if_true: (required) task or group ids to follow when the condition holds.
    :param follow_task_ids_if_false: (required) task or group ids to follow otherwise.
    :param merge_map_index: the map index of a mapped merge task (None: unmapped).
    """

    def __init__(
        self,
        *,
        # Required: None only so that a misnamed one gets its hint first (reject_unknown_arguments).
        merge_task_id: str | None = None,
        condition: MetricsCondition | Mapping[str, Mapping[str, float]] | None = None,
        follow_task_ids_if_true: str | Iterable[str] | None = None,
        follow_task_ids_if_false: str | Iterable[str] | None = None,
        merge_map_index: int | None = None,
        **kwargs: Any,
    ) -> None:
        reject_unknown_arguments(type(self), kwargs, meanings=BRANCH_ARGUMENT_MEANINGS, required={
            "merge_task_id": merge_task_id, "condition": condition,
            "follow_task_ids_if_true": follow_task_ids_if_true,
            "follow_task_ids_if_false": follow_task_ids_if_false,
        })  # fmt: skip
        if not callable(condition) and not isinstance(condition, Mapping):
            raise TypeError(f"condition must be a callable or a mapping of checks, found {condition!r}")
        super().__init__(**kwargs)
        self.merge_task_id: str = merge_task_id or ""  # given: checked above
        self.condition = condition
        self.follow_task_ids_if_true = _ids(follow_task_ids_if_true or ())
        self.follow_task_ids_if_false = _ids(follow_task_ids_if_false or ())
        self.merge_map_index = merge_map_index

    def choose_branch(self, context: Context) -> list[str]:
        metrics = self._metrics(context)
        holds = self._holds(metrics)
        chosen = self.follow_task_ids_if_true if holds else self.follow_task_ids_if_false
        self.log.info("Condition on %s's metrics is %s: following %s", self.merge_task_id, holds, chosen)
        return chosen

    def _metrics(self, context: Context) -> Mapping[str, Any]:
        ti = context["ti"]
        if self.merge_map_index is None:
            value = ti.xcom_pull(task_ids=self.merge_task_id)
        else:
            value = ti.xcom_pull(task_ids=self.merge_task_id, map_indexes=self.merge_map_index)
        if not isinstance(value, Mapping):
            raise MergeArgumentError(
                f"{self.merge_task_id} pushed no merge metrics (XCom return value: {value!r}). Point "
                "merge_task_id at a MergeIntoOperator that waits for completion, or a MergeCommitSensor."
            )
        return value

    def _holds(self, metrics: Mapping[str, Any]) -> bool:
        if callable(self.condition):
            return bool(self.condition(metrics))
        failures = failed_expectations(metrics, self.condition)
        for failure in failures:
            self.log.info("Check does not hold: %s", failure)
        return not failures


def _ids(ids: str | Iterable[str]) -> list[str]:
    return [ids] if isinstance(ids, str) else list(ids)
