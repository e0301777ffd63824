"""Count a DataFrame's rows in whatever pass reads it, instead of with a separate scan."""

from __future__ import annotations

from collections.abc import Callable

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

__all__ = ["counted"]


def counted(df: DataFrame, name: str) -> tuple[DataFrame, Callable[[], int]]:
    """``df`` with a row counter attached, and a function giving the count after the first action.

    When Spark's optimizer prunes the counted branch away (an empty side of a join, for example) no
    count is observed; the function then counts ``df`` directly, which is cheap in exactly those cases.
    """
    observation = Observation(name)
    observed = df.observe(observation, F.count(F.lit(1)).alias("rows"))

    def rows() -> int:
        try:
            return int(observation.get["rows"])
        except (Py4JError, AssertionError, KeyError):
            return df.count()

    return observed, rows
