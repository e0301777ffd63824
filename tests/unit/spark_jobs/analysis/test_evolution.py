"""Schema evolution's type rule, as Delta's mergeSchemas applies it to MERGE (implicit conversions
allowed, the target's type kept): a source type merges into a target column only by one of Spark's
implicit casts; anything else is refused before a file is read. Pure logic: the merges themselves are in
test_error_classes.py and test_pipeline.py."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.delta_merge.analysis.evolution import evolve_schema
from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.statement.merge_sql import parse_merge_sql

UPSERT = parse_merge_sql(
    "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
)


def _schema(data_type: DataType) -> StructType:
    return StructType([StructField("id", LongType()), StructField("c", data_type)])


@pytest.mark.parametrize(
    ("target", "source"),
    [
        (LongType(), IntegerType()), (IntegerType(), LongType()), (DecimalType(10, 2), DecimalType(20, 4)),
        (DecimalType(10, 2), IntegerType()), (IntegerType(), StringType()), (DateType(), StringType()),
        (TimestampType(), DateType()), (StringType(), BooleanType()), (StringType(), DateType()),
        (ArrayType(LongType()), ArrayType(IntegerType())),
    ],
)  # fmt: skip
def test_an_implicit_cast_merges_and_keeps_the_target_type(target: DataType, source: DataType) -> None:
    evolved = evolve_schema(UPSERT, _schema(target), _schema(source), enabled=True)
    assert evolved == _schema(target)


@pytest.mark.parametrize(
    ("target", "source", "names"),
    [
        (BooleanType(), StringType(), "BooleanType and StringType"),
        (IntegerType(), BooleanType(), "IntegerType and BooleanType"),
        (DateType(), IntegerType(), "DateType and IntegerType"),
        (ArrayType(BooleanType()), ArrayType(StringType()), "BooleanType and StringType"),
        (StringType(), ArrayType(StringType()), "StringType and array<string>"),
    ],
)  # fmt: skip
def test_a_type_without_an_implicit_cast_is_refused_as_delta_refuses_it(
    target: DataType, source: DataType, names: str
) -> None:
    with pytest.raises(MergeAnalysisError) as refused:
        evolve_schema(UPSERT, _schema(target), _schema(source), enabled=True)
    assert refused.value.error_class == "DELTA_FAILED_TO_MERGE_FIELDS"
    assert str(refused.value) == (
        "[DELTA_FAILED_TO_MERGE_FIELDS] Failed to merge fields 'c' and 'c'. Failed to merge incompatible "
        f"data types {names}"
    )


def test_without_evolution_the_types_are_store_assignments_business() -> None:
    # Without schema evolution the target schema stays; the write's store assignment casts or refuses.
    assert evolve_schema(UPSERT, _schema(BooleanType()), _schema(StringType()), enabled=False) == _schema(
        BooleanType()
    )
