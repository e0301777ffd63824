"""MergeIntoOperator(engine="delta") when it is built and when it submits: what only the native job does is
refused at construction, naming the argument; spark-submit gets Delta's package and SQL extension unless
the connection says the cluster has Delta."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_merge_provider.errors import MergeArgumentError
from airflow_merge_provider.hooks.merge_into import DELTA_PACKAGE, MergeSubmitHook, with_delta
from tests.support.airflow_fixtures import ContextFactory
from tests.support.operator_helpers import merge_operator

EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"dry_run": True}, "dry_run"),
        ({"options": {"dry_run": True}}, "dry_run"),
        ({"expected_metrics": {"numTargetRowsDeleted": {"equal_to": 0}}}, "expected_metrics"),
        ({"options": {"target_file_size": 1024}}, "options['target_file_size']"),
        ({"aws_conn_id": "aws_default"}, "aws_conn_id"),
        ({"azure_conn_id": "wasb_default"}, "azure_conn_id"),
        ({"target": {"uri": "s3://b/t", "storage_options": {"AWS_REGION": "x"}}}, "target's storage_options"),
    ],
)
def test_what_only_the_native_job_does_is_refused_when_the_operator_is_built(
    tmp_path: Path, arguments: dict[str, Any], named: str
) -> None:
    with pytest.raises(MergeArgumentError) as refused:
        merge_operator(tmp_path, engine="delta", **arguments)

    assert str(refused.value).startswith(f"MergeIntoOperator: engine='delta' cannot honour {named} (")
    assert "keep the native engine (the default)" in str(refused.value)
    merge_operator(tmp_path, **arguments)  # the native engine takes them


def test_an_unknown_engine_or_a_second_one_in_options_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MergeArgumentError, match=r"engine must be one of native, delta, found 'spark'"):
        merge_operator(tmp_path, engine="spark")
    with pytest.raises(MergeArgumentError, match=r"options\['engine'\] is 'native' but engine is 'delta'"):
        merge_operator(tmp_path, engine="delta", options={"engine": "native"})


def test_the_engine_reaches_the_spec(tmp_path: Path, make_context: ContextFactory, spark_local: str) -> None:
    for engine in ("native", "delta"):
        operator = merge_operator(tmp_path, engine=engine)
        context = make_context()
        operator.render_template_fields(context)

        assert operator.build_spec(context).options.engine == engine


def test_delta_s_package_and_extension_join_the_confs_given() -> None:
    assert with_delta({}, None) == (
        {"spark.sql.extensions": EXTENSION, "spark.sql.catalog.spark_catalog": CATALOG}, DELTA_PACKAGE
    )
    confs, package = with_delta(
        {"spark.sql.extensions": "com.example.Ext", "spark.sql.catalog.spark_catalog": "com.example.Cat"},
        "io.delta:delta-spark_4.2_2.13:4.3.0",
    )
    assert confs == {"spark.sql.extensions": f"com.example.Ext,{EXTENSION}",
                     "spark.sql.catalog.spark_catalog": "com.example.Cat"}  # fmt: skip
    assert package == "io.delta:delta-spark_4.2_2.13:4.3.0"
    assert with_delta({"spark.sql.extensions": EXTENSION}, None)[0]["spark.sql.extensions"] == EXTENSION
    # The cluster loads Delta itself: nothing added.
    assert with_delta({"spark.executor.cores": "2"}, "cluster") == ({"spark.executor.cores": "2"}, None)
    with pytest.raises(MergeArgumentError, match=r"extra delta_package must be Delta's Maven coordinate"):
        with_delta({}, "delta-spark")


@pytest.mark.parametrize(("extra", "packages"), [({}, DELTA_PACKAGE), ({"delta_package": "cluster"}, None)])
def test_spark_submit_s_command_line_loads_delta_as_the_connection_says(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, str], packages: str | None
) -> None:
    connection = {"conn_type": "spark", "host": "local[2]", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DELTA", json.dumps(connection))

    hook = MergeSubmitHook.for_merge(conn_id="spark_delta", name="merge", delta=True)
    command = hook._build_spark_submit_command("job.py")

    given = [command[i + 1] for i, arg in enumerate(command) if arg == "--packages"]
    assert given == ([packages] if packages else [])
    assert (f"spark.sql.extensions={EXTENSION}" in command) == (packages is not None)
    native_hook = MergeSubmitHook.for_merge(conn_id="spark_delta", name="merge")
    native = native_hook._build_spark_submit_command("job.py")
    assert "--packages" not in native
    assert not any(EXTENSION in arg for arg in native)
