"""Expected-metric checks (pure logic, no JVM)."""

from __future__ import annotations

import pytest

from spark_jobs.delta_merge.errors import ExpectationFailedError
from spark_jobs.delta_merge.expectations import check_expectations, failed_expectations

METRICS = {"numTargetRowsDeleted": 1500, "numTargetRowsUpdated": 0, "numSourceRows": 100}


@pytest.mark.parametrize(
    ("checks", "holds"),
    [
        ({"numTargetRowsDeleted": {"leq_to": 1000}}, False),
        ({"numTargetRowsDeleted": {"leq_to": 1500}}, True),
        ({"numTargetRowsDeleted": {"less_than": 1500}}, False),
        ({"numTargetRowsDeleted": {"geq_to": 1500, "greater_than": 1499}}, True),
        ({"numTargetRowsUpdated": {"greater_than": 0}}, False),
        ({"numSourceRows": {"equal_to": 100}}, True),
        ({"numSourceRows": {"equal_to": 95, "tolerance": 0.1}}, True),
        ({"numSourceRows": {"equal_to": 80, "tolerance": 0.1}}, False),
    ],
)
def test_comparators(checks: dict[str, dict[str, float]], holds: bool) -> None:
    assert (failed_expectations(METRICS, checks) == []) is holds


def test_every_failure_is_listed_with_its_actual_value() -> None:
    with pytest.raises(ExpectationFailedError) as raised:
        check_expectations(
            METRICS, {"numTargetRowsDeleted": {"leq_to": 1000}, "numTargetRowsUpdated": {"greater_than": 0}}
        )
    message = str(raised.value)
    assert "2 expected metric check(s) failed" in message
    assert "numTargetRowsDeleted leq_to 1000: actual 1500" in message
    assert "numTargetRowsUpdated greater_than 0: actual 0" in message


def test_unknown_metric_is_a_failure() -> None:
    assert failed_expectations(METRICS, {"numNothing": {"equal_to": 1}}) == ["numNothing: no such metric"]
    assert failed_expectations(METRICS, {"numTargetRowDeleted": {"equal_to": 1}}) == [
        "numTargetRowDeleted: no such metric; did you mean 'numTargetRowsDeleted'?"
    ]
