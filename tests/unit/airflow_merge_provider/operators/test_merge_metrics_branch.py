"""MergeMetricsBranchOperator: a condition over an upstream merge's metrics picks the branch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_merge_provider.errors import MergeArgumentError
from airflow_merge_provider.operators.merge_metrics_branch import MergeMetricsBranchOperator
from tests.support.airflow_fixtures import ContextFactory

DELETED = {"numTargetRowsDeleted": 3, "numTargetRowsInserted": 0}
NOTHING_DELETED = {"numTargetRowsDeleted": 0, "numTargetRowsInserted": 5}


def _branch(condition: Any) -> MergeMetricsBranchOperator:
    with DAG("dag", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")):
        return MergeMetricsBranchOperator(
            task_id="branch", merge_task_id="merge", condition=condition,
            follow_task_ids_if_true=["audit"], follow_task_ids_if_false="done",
        )  # fmt: skip


@pytest.mark.parametrize(
    "condition",
    [lambda m: m["numTargetRowsDeleted"] > 0, {"numTargetRowsDeleted": {"greater_than": 0}}],
    ids=["callable", "checks"],
)
@pytest.mark.parametrize(("metrics", "chosen"), [(DELETED, ["audit"]), (NOTHING_DELETED, ["done"])])
def test_the_condition_picks_the_branch(
    make_context: ContextFactory,
    condition: Any,
    metrics: Mapping[str, int],
    chosen: list[str],
) -> None:
    context = make_context(xcoms={"merge": metrics})
    assert _branch(condition).choose_branch(context) == chosen


def test_a_check_on_an_unknown_metric_does_not_hold(make_context: ContextFactory) -> None:
    context = make_context(xcoms={"merge": DELETED})
    assert _branch({"numRowsVanished": {"equal_to": 0}}).choose_branch(context) == ["done"]


def test_no_metrics_upstream_is_an_error(make_context: ContextFactory) -> None:
    with pytest.raises(MergeArgumentError, match="pushed no merge metrics"):
        _branch(lambda m: True).choose_branch(make_context(xcoms={}))


def test_the_condition_must_be_callable_or_checks() -> None:
    with pytest.raises(TypeError, match="callable or a mapping"):
        _branch("numTargetRowsDeleted > 0")


def test_a_misspelt_argument_names_the_one_meant() -> None:
    with (
        DAG("dag", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")),
        pytest.raises(TypeError, match=r"unknown argument 'merge_map_idx'; did you mean 'merge_map_index'\?"),
    ):
        MergeMetricsBranchOperator(
            task_id="branch", merge_task_id="merge", merge_map_idx=0, condition=lambda m: True,
            follow_task_ids_if_true="audit", follow_task_ids_if_false="done",
        )  # fmt: skip
