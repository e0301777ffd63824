"""MergeIntoOperator's parameters: templating, unknown arguments, OpenLineage in the Spark conf, links."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_merge_provider.errors import MergeSpecInvalidError
from airflow_merge_provider.get_provider_info import get_provider_info
from airflow_merge_provider.sensors.merge_commit import MergeCommitSensor
from tests.support.airflow_fixtures import ContextFactory
from tests.support.delta_tables import create_table
from tests.support.operator_helpers import JOB_METRICS, merge_operator, runtime_context


def test_app_version_expected_metrics_commit_metadata_and_env_vars_are_templated(
    tmp_path: Path, make_context: ContextFactory
) -> None:
    op = merge_operator(
        tmp_path,
        app_id="accounts.{{ ds }}",
        app_version="{{ ds_nodash }}",
        expected_metrics={"numTargetRowsDeleted": {"leq_to": "{{ 3 * 4 }}", "greater_than": "0.5"}},
        commit_metadata={"source_day": "{{ ds }}"},
        env_vars={"MERGE_DAY": "{{ ds }}"},
    )
    context = make_context()
    op.render_template_fields(context)

    spec = op.build_spec(context)

    assert (spec.run.app_id, spec.run.app_version) == ("accounts.2024-01-02", 20240102)
    assert spec.expected_metrics == {"numTargetRowsDeleted": {"leq_to": 12, "greater_than": 0.5}}
    assert spec.run.commit_metadata["source_day"] == "2024-01-02"
    assert op.env_vars == {"MERGE_DAY": "2024-01-02"}
    assert {"app_version", "expected_metrics", "commit_metadata", "env_vars"} <= set(op.template_fields)


@pytest.mark.parametrize("app_version", ["{{ ds }}", "v1", True, 1.5])
def test_an_app_version_that_is_not_an_integer_is_refused_naming_it(
    tmp_path: Path, make_context: ContextFactory, app_version: object
) -> None:
    op = merge_operator(tmp_path, app_version=app_version)
    context = make_context()
    op.render_template_fields(context)
    with pytest.raises(MergeSpecInvalidError, match="app_version: expected a non-negative integer"):
        op.build_spec(context)


def test_a_misspelt_argument_names_the_option_or_parameter_meant(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown argument 'schema_evoluton'; did you mean "
                                        r"options=\{'schema_evolution': \.\.\.\}\?"):  # fmt: skip
        merge_operator(tmp_path, schema_evoluton=True)
    with pytest.raises(TypeError, match=r"'schema_evolution' \(it is an option: pass options="
                                        r"\{'schema_evolution': True\}\), 'excutor_memory' \(did you mean "
                                        r"'executor_memory'\?\)"):  # fmt: skip
        merge_operator(tmp_path, schema_evolution=True, excutor_memory="1g")
    with pytest.raises(TypeError, match=r"unknown argument 'retires'; did you mean 'retries'\?"):
        merge_operator(tmp_path, retires=2)
    with pytest.raises(TypeError, match=r"^MergeIntoOperator: unknown argument 'xyzzy'$"):
        merge_operator(tmp_path, xyzzy=1)
    with pytest.raises(TypeError, match=r"MergeCommitSensor: unknown argument 'poke_intervall'; did you mean "
                                        r"'poke_interval'\?"):  # fmt: skip
        MergeCommitSensor(task_id="wait", target="/t", app_id="a", poke_intervall=5)


# What a newcomer brings from SparkSubmitOperator, the Databricks and SQL providers and Delta, and the hint.
BROUGHT_FROM_ELSEWHERE = [
    ("spark_conn_id", "did you mean 'conn_id'?"),
    ("conn", "did you mean 'conn_id'?"),
    ("databricks_conn_id", "did you mean 'conn_id'?"),
    ("target_table", "did you mean 'target'?"),
    ("table", "did you mean 'target'?"),
    ("targetTable", "did you mean 'target'?"),
    ("target_tabel", "did you mean 'target'?"),
    ("sql", "did you mean 'merge_sql'?"),
    ("query", "merge_sql='MERGE INTO ...'? A source query goes in source={'query': 'SELECT ...'}"),
    ("gcs_conn_id", "did you mean 'gcp_conn_id'?"),
    ("source_table", "did you mean 'source'?"),
    ("retry", "did you mean 'retries'?"),
    ("conf", "did you mean 'spark_conf'?"),
    ("wait_for_termination", "did you mean 'wait_for_completion'?"),
    ("application_args", "the operator submits its own packaged merge job"),
    ("py_files", "the operator submits its own packaged merge job"),
    ("storage_options", "target={'uri': ..., 'storage_options': {...}}"),
    ("mergeSchema", "pass options={'schema_evolution': True}"),
    ("merge_keys", "the keys go in the ON condition"),
    ("partition_by", "the target table's own partitioning"),
]


@pytest.mark.parametrize(("name", "hint"), BROUGHT_FROM_ELSEWHERE, ids=[n for n, _ in BROUGHT_FROM_ELSEWHERE])
def test_an_argument_named_as_other_operators_name_it_is_pointed_to_this_ones(
    tmp_path: Path, name: str, hint: str
) -> None:
    with pytest.raises(TypeError) as refused:
        merge_operator(tmp_path, **{name: "x"})
    prefix = f"MergeIntoOperator: unknown argument {name!r}; "
    assert str(refused.value).startswith(prefix)
    assert hint in str(refused.value).removeprefix(prefix)


@pytest.mark.parametrize(
    ("operator", "meanings"),
    [
        ("MergeIntoOperator", "ARGUMENT_MEANINGS"),
        ("MergeCommitSensor", "SENSOR_ARGUMENT_MEANINGS"),
        ("MergeMetricsBranchOperator", "BRANCH_ARGUMENT_MEANINGS"),
    ],
)
def test_every_meaning_names_a_parameter_the_operator_takes_or_says_where_the_setting_lives(
    operator: str, meanings: str
) -> None:
    import airflow_merge_provider.operators.merge_into as merge_into
    import airflow_merge_provider.operators.merge_metrics_branch as branch
    import airflow_merge_provider.sensors.merge_commit as sensor
    from airflow_merge_provider.argument_check import _parameters

    module = {"MergeIntoOperator": merge_into, "MergeCommitSensor": sensor,
              "MergeMetricsBranchOperator": branch}[operator]  # fmt: skip
    cls, table = getattr(module, operator), getattr(module, meanings)
    known = _parameters(cls)
    wrong = {alias: meant for alias, meant in table.items()
             if alias in known or (" " not in meant and meant not in known)}  # fmt: skip
    # An alias the operator takes would never reach the hint; a one-word meaning must be a parameter.
    assert wrong == {}


def test_the_sensor_and_the_branch_point_to_their_own_parameters() -> None:
    from airflow.sdk import DAG

    from airflow_merge_provider.operators.merge_metrics_branch import MergeMetricsBranchOperator

    with pytest.raises(TypeError, match=r"^MergeCommitSensor: unknown argument 'table'; did you mean "
                                        r"'target'\?$"):  # fmt: skip
        MergeCommitSensor(task_id="wait", table="/t", app_id="a")
    with pytest.raises(TypeError, match=r"^MergeCommitSensor: missing keyword argument 'target'$"):
        MergeCommitSensor(task_id="wait", app_id="a")
    with (
        DAG("dag", schedule=None),
        pytest.raises(TypeError, match=r"unknown argument 'true_branch'; did you mean "
                                       r"'follow_task_ids_if_true'\?"),  # fmt: skip
    ):
        MergeMetricsBranchOperator(
            task_id="branch", merge_task_id="merge", condition=lambda m: True, true_branch="audit",
            follow_task_ids_if_false="done",
        )  # fmt: skip


def test_default_args_and_airflow_parameters_still_pass(tmp_path: Path) -> None:
    op = merge_operator(tmp_path, retries=2, durable=False, default_args={"owner": "ledger", "durable": True})
    assert (op.retries, op.owner, op.durable) == (2, "ledger", False)
    assert merge_operator(tmp_path, task_id="m2", default_args={"durable": False}).durable is False
    assert merge_operator(tmp_path, task_id="m3").durable is True


def test_openlineage_parent_job_and_transport_reach_the_spark_conf(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.providers.common.compat.openlineage.utils import spark as openlineage_spark

    def parent(properties: dict[str, Any], context: Any) -> dict[str, Any]:
        return {
            **properties,
            "spark.openlineage.parentJobName": f"{context['ti'].dag_id}.{context['ti'].task_id}",
        }

    def transport(properties: dict[str, Any], context: Any) -> dict[str, Any]:
        return {**properties, "spark.openlineage.transport.type": "http"}

    monkeypatch.setattr(openlineage_spark, "inject_parent_job_information_into_spark_properties", parent)
    monkeypatch.setattr(openlineage_spark, "inject_transport_information_into_spark_properties", transport)
    create_table(tmp_path / "table")
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", "true")
    op = merge_operator(tmp_path, fake_spark_submit.binary, spark_conf={"spark.ui.enabled": "false"})
    assert (op.openlineage_inject_parent_job_info, op.openlineage_inject_transport_info) == (True, False)
    op.openlineage_inject_transport_info = True

    op.execute(make_context())

    (argv,) = fake_spark_submit.calls()
    confs = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"}
    assert {"spark.openlineage.parentJobName=dag.merge", "spark.openlineage.transport.type=http",
            "spark.ui.enabled=false"} <= confs  # fmt: skip
    assert op.spark_conf == {"spark.ui.enabled": "false"}  # the task's own field is left as rendered


def test_an_attached_run_pushes_the_drivers_ui_link_as_soon_as_its_log_names_it(
    tmp_path: Path, make_context: ContextFactory, spark_local: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.slow_driver import make_slow_spark_submit

    slow = make_slow_spark_submit(tmp_path, monkeypatch)
    create_table(tmp_path / "table")
    slow.mode("ok", metrics=JOB_METRICS)
    slow.release()
    context = runtime_context(make_context)  # no task state store: attached

    merge_operator(tmp_path, slow.binary).execute(context)

    # Pushed while the driver runs, emptied once it has exited (its UI died with it).
    assert context["ti"].pushes == [
        ("_link_SparkApplicationUiLink", "http://10.1.2.3:4041"),
        ("_link_SparkApplicationUiLink", ""),
    ]


def test_the_provider_registers_the_extra_links() -> None:
    info = get_provider_info()
    assert info["extra-links"] == [
        "airflow_merge_provider.links.SparkApplicationUiLink",
        "airflow_merge_provider.links.SparkDriverLogLink",
    ]
    json.dumps(info)
