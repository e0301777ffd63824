"""MergeIntoOperator without a JVM: spec building after templating, idempotency, XCom, errors, assets.

spark-submit is replaced by a fake binary (conftest.py) that prints what the job would print.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG, Asset, AssetAlias
from airflow.sdk.exceptions import AirflowFailException

from airflow_merge_provider.errors import (
    MergeArgumentError,
    MergeJobFailedError,
    MergeJobRejectedError,
    MergeSpecInvalidError,
)
from airflow_merge_provider.hooks.merge_commit import find_merge_commit
from airflow_merge_provider.hooks.merge_into import MergeSubmitHook
from airflow_merge_provider.job_package import job_application
from airflow_merge_provider.operators.merge_into import MergeIntoOperator, default_app_id
from spark_jobs.delta_merge.metrics import DELTA_METRIC_NAMES, MergeMetrics
from tests.support.airflow_fixtures import ContextFactory
from tests.support.delta_tables import UPSERT_METRICS, commit_merge, create_table

RUN_ID = "scheduled__2024-01-02T00:00:00+00:00"
APP_ID = f"airflow:dag.merge:{RUN_ID}"
UPSERT_SQL = "MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
UPSERT_SQL += "WHEN NOT MATCHED THEN INSERT *"
JOB_METRICS = {
    **UPSERT_METRICS, "materializeSourceReason": "NON_DETERMINISTIC_SOURCE_NON_DELTA", "readVersion": 0,
    "tableVersion": 1, "skipped": False, "dryRun": False,
}  # fmt: skip


def _dag(**kwargs: Any) -> DAG:
    return DAG("dag", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), **kwargs)


def _operator(tmp_path: Path, fake: SimpleNamespace | None = None, **kwargs: Any) -> MergeIntoOperator:
    defaults: dict[str, Any] = {
        "task_id": "merge", "target": str(tmp_path / "table"), "source": str(tmp_path / "source"),
        "merge_sql": UPSERT_SQL, "conn_id": "spark_local",
    }  # fmt: skip
    if fake is not None:
        defaults["spark_binary"] = fake.binary
    with _dag(template_searchpath=str(tmp_path)):
        return MergeIntoOperator(**{**defaults, **kwargs})


def _spec_arg(argv: list[str]) -> dict[str, Any]:
    if "--spec-json" in argv:
        return dict(json.loads(argv[argv.index("--spec-json") + 1]))
    return dict(json.loads(Path(argv[argv.index("--spec") + 1]).read_text(encoding="utf-8")))


# -- the spec, after templating ----------------------------------------------------------------------------


def test_structural_spec_is_built_from_rendered_fields(tmp_path: Path, make_context: ContextFactory) -> None:
    op = _operator(
        tmp_path,
        merge_sql=None,
        target="{{ var.value.get('tables', '/data') }}/accounts",
        source={"uri": "/landing/{{ ds }}", "format": "json", "options": {"multiLine": "{{ 'true' }}"}},
        target_alias="t",
        source_alias="s",
        condition="t.id = s.id AND t.day = '{{ ds }}'",
        when_matched=[
            {"condition": "s.op = 'D'", "action": "delete"},
            {"action": "update", "set": {"name": "s.name", "day": "'{{ ds_nodash }}'"}},
        ],
        when_not_matched=[{"action": "insert_all"}],
        when_not_matched_by_source=[
            {"condition": "t.day < '{{ macros.ds_add(ds, -7) }}'", "action": "delete"}
        ],
        options={"shuffle_partitions": 4, "materialize_source": "{{ 'none' }}"},
        expected_metrics={"numTargetRowsDeleted": {"leq_to": 10}},
        commit_metadata={"team": "ledger"},
    )
    context = make_context(clear_number=3, variables={"tables": "/warehouse"})
    op.render_template_fields(context)

    spec = op.build_spec(context).to_dict()

    assert spec["target"] == {"uri": "/warehouse/accounts", "storage_options": {}}
    assert spec["source"] == {
        "uri": "/landing/2024-01-02",
        "format": "json",
        "options": {"multiLine": "true"},
    }
    assert (spec["target_alias"], spec["source_alias"]) == ("t", "s")
    assert spec["condition"] == "t.id = s.id AND t.day = '2024-01-02'"
    assert spec["clauses"] == [
        {"when": "matched", "action": "delete", "condition": "s.op = 'D'"},
        {"when": "matched", "action": "update", "set": {"name": "s.name", "day": "'20240102'"}},
        {"when": "not_matched", "action": "insert_all"},
        {"when": "not_matched_by_source", "action": "delete", "condition": "t.day < '2023-12-26'"},
    ]
    assert spec["options"]["shuffle_partitions"] == 4
    assert spec["options"]["materialize_source"] == "none"
    assert spec["expected_metrics"] == {"numTargetRowsDeleted": {"leq_to": 10}}
    assert spec["run"] == {
        "app_id": APP_ID,
        "app_version": 3,
        "commit_metadata": {
            "team": "ledger",
            "airflow": {"dagId": "dag", "taskId": "merge", "runId": RUN_ID, "mapIndex": -1, "tryNumber": 1},
        },
    }


def test_merge_sql_can_be_a_sql_file(tmp_path: Path, make_context: ContextFactory) -> None:
    (tmp_path / "upsert.sql").write_text(
        "MERGE INTO target t USING source s ON t.id = s.id AND t.day = '{{ ds }}'\n"
        "WHEN MATCHED THEN UPDATE SET *\nWHEN NOT MATCHED THEN INSERT *\n",
        encoding="utf-8",
    )
    op = _operator(tmp_path, merge_sql="upsert.sql")
    context = make_context()
    op.render_template_fields(context)

    spec = op.build_spec(context)

    assert spec.merge_sql is not None
    assert "t.day = '2024-01-02'" in spec.merge_sql
    assert spec.source.to_dict() == {"uri": str(tmp_path / "source"), "format": "parquet", "options": {}}


def test_app_id_names_the_map_index_of_mapped_tasks() -> None:
    assert default_app_id("d", "t", "r") == "airflow:d.t:r"
    assert default_app_id("d", "t", "r", -1) == "airflow:d.t:r"
    assert default_app_id("d", "t", "r", 4) == "airflow:d.t:r:4"


def test_app_id_and_version_can_be_overridden(tmp_path: Path, make_context: ContextFactory) -> None:
    op = _operator(tmp_path, app_id="nightly-accounts", app_version=20240102)
    spec = op.build_spec(make_context(clear_number=5))
    assert (spec.run.app_id, spec.run.app_version) == ("nightly-accounts", 20240102)


def test_a_templated_app_id_keys_the_merge_on_the_logical_date(
    tmp_path: Path, make_context: ContextFactory
) -> None:
    first_run, cleared_run = make_context(clear_number=0), make_context(clear_number=4, run_id="manual__x")
    specs = []
    for context in (first_run, cleared_run):
        op = _operator(tmp_path, app_id="accounts.{{ ds }}", app_version=1)
        op.render_template_fields(context)
        specs.append(op.build_spec(context).run)
    # Every run of the date, cleared or not, carries the same key: the log applies it once.
    assert [(run.app_id, run.app_version) for run in specs] == [("accounts.2024-01-02", 1)] * 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (
            {"condition": "t.id = s.id AND t.id IN (SELECT id FROM {{ var.value.get('t', 'ids') }})"},
            "condition",
        ),
        (
            {"when_matched": [{"action": "update", "set": {"name": "(SELECT max(name) FROM x)"}}]},
            "clauses[0]",
        ),
        ({"when_matched": [{"action": "merge"}]}, "clauses[0].action"),
        ({"when_matched": ["delete"]}, "when_matched[0]"),
        ({"when_matched": [{"when": "not_matched", "action": "delete"}]}, "when_matched[0].when"),
    ],
)
def test_a_bad_rendered_spec_fails_without_retry_before_anything_is_launched(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    kwargs: dict[str, Any],
    field: str,
) -> None:
    structural = {
        "merge_sql": None, "condition": "t.id = s.id", "source_alias": "s", "target_alias": "t",
        "when_matched": [{"action": "update_all"}],
    }  # fmt: skip
    op = _operator(tmp_path, fake_spark_submit, **{**structural, **kwargs})
    context = make_context()
    op.render_template_fields(context)

    with pytest.raises(MergeSpecInvalidError, match=field.replace("[", r"\[").replace("]", r"\]")) as error:
        op.execute(context)

    assert isinstance(error.value, AirflowFailException)
    assert fake_spark_submit.calls() == []


def test_constructor_wants_exactly_one_form(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="found both"):
        _operator(tmp_path, condition="t.id = s.id")
    with pytest.raises(ValueError, match="found neither"):
        _operator(tmp_path, merge_sql=None)


def test_a_missing_spark_connection_is_an_error_not_yarn(
    tmp_path: Path, make_context: ContextFactory
) -> None:
    create_table(tmp_path / "table")
    op = _operator(tmp_path, conn_id="no_such_connection")
    with pytest.raises(MergeArgumentError, match=r"'no_such_connection' is not defined.*yarn"):
        op.execute(make_context())


def test_a_spark_submit_that_cannot_run_is_an_error_without_retry(
    tmp_path: Path, make_context: ContextFactory, spark_local: str
) -> None:
    create_table(tmp_path / "table")
    op = _operator(tmp_path, spark_binary=str(tmp_path / "no-spark-submit"))
    with pytest.raises(MergeArgumentError, match=r"Cannot run .*no-spark-submit.*spark_binary"):
        op.execute(make_context())


# -- running the job ---------------------------------------------------------------------------------------


def test_execute_submits_the_packaged_job_and_returns_its_metrics(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    table = create_table(tmp_path / "table")
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    op = _operator(tmp_path, fake_spark_submit, executor_memory="1g", spark_conf={"spark.ui.enabled": False})

    result = op.execute(make_context())

    (argv,) = fake_spark_submit.calls()
    assert argv[argv.index("--master") + 1] == "local[2]"
    assert argv[argv.index("--py-files") + 1].endswith("/spark_jobs.zip")
    assert argv[argv.index("--executor-memory") + 1] == "1g"
    assert "spark.ui.enabled=False" in argv
    assert argv[argv.index("--spec-json") - 1] == job_application()
    assert _spec_arg(argv)["run"]["app_id"] == APP_ID
    assert _spec_arg(argv)["target"]["uri"] == table
    # The XCom value: one dict, every metric as an int, plus the merge's identity.
    assert set(result) == set(MergeMetrics.__dataclass_fields__) | {"appId", "appVersion"}
    assert all(type(result[name]) is int for name in (*DELTA_METRIC_NAMES, "numOutputRows"))
    assert {name: result[name] for name in UPSERT_METRICS} == UPSERT_METRICS
    assert result["materializeSourceReason"] == "NON_DETERMINISTIC_SOURCE_NON_DELTA"
    assert (result["readVersion"], result["tableVersion"]) == (0, 1)
    assert (result["skipped"], result["dryRun"]) == (False, False)
    assert (result["appId"], result["appVersion"]) == (APP_ID, 0)
    json.dumps(result)  # XCom and asset extras are JSON


def test_the_table_is_the_default_outlet_and_its_event_carries_the_metrics(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    table = create_table(tmp_path / "table")
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    op = _operator(tmp_path, fake_spark_submit)
    assert op.outlets == [Asset(uri=f"file://{table}")]
    context = make_context()

    result = op.execute(context)

    assert context["outlet_events"][Asset(uri=f"file://{table}")].extra == result


def test_a_templated_target_is_an_alias_resolved_when_the_task_runs(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    table = create_table(tmp_path / "table")
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    op = _operator(tmp_path, fake_spark_submit, target="{{ var.value.get('t') }}")
    (alias,) = op.outlets
    assert alias == AssetAlias(name="delta-merge:dag.merge")
    context = make_context(variables={"t": table})
    op.render_template_fields(context)

    result = op.execute(context)

    (event,) = context["outlet_events"][alias].asset_alias_events
    assert event.dest_asset_key.uri == f"file://{table}"
    assert event.extra == result


def test_a_retry_after_the_commit_returns_that_commit_without_spark(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    table = create_table(tmp_path / "table")
    version = commit_merge(table, app_id=APP_ID, app_version=0)
    op = _operator(tmp_path, fake_spark_submit)
    context = make_context(try_number=2)

    result = op.execute(context)

    assert fake_spark_submit.calls() == []
    assert result["skipped"] is True
    assert {name: result[name] for name in UPSERT_METRICS} == UPSERT_METRICS
    assert (result["tableVersion"], result["readVersion"], result["appId"]) == (version, 0, APP_ID)
    assert context["outlet_events"][Asset(uri=f"file://{table}")].extra == result


def test_a_cleared_run_applies_the_merge_again(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    table = create_table(tmp_path / "table")
    commit_merge(table, app_id=APP_ID, app_version=0)
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)

    result = _operator(tmp_path, fake_spark_submit).execute(make_context(clear_number=1))

    (argv,) = fake_spark_submit.calls()
    assert _spec_arg(argv)["run"]["app_version"] == 1
    assert (result["skipped"], result["appVersion"]) == (False, 1)


@pytest.mark.parametrize(
    ("kind", "retried"),
    [
        ("ExpectationFailedError", False),
        ("MergeAnalysisError", False),
        ("MultipleSourceRowMatchesError", False),
        ("CastFailureError", False),
        ("ConstraintViolationError", False),
        ("UnsupportedTableFeatureError", False),
        ("ConcurrentModificationError", True),
        ("MergeExecutionError", True),
        ("Py4JJavaError", True),
    ],
)
def test_job_failures_are_classified_by_the_error_type_the_job_reports(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    kind: str,
    retried: bool,
) -> None:
    create_table(tmp_path / "table")
    fake_spark_submit.mode("fail", error=kind)

    with pytest.raises(MergeJobFailedError, match=f"failed: {kind}: something went wrong") as error:
        _operator(tmp_path, fake_spark_submit).execute(make_context())

    assert error.value.error_type == kind
    assert isinstance(error.value, MergeJobRejectedError) is not retried
    assert isinstance(error.value, AirflowFailException) is not retried


def test_a_failed_submit_whose_merge_committed_reports_the_commit(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    table = create_table(tmp_path / "table")
    fake_spark_submit.mode("commit_then_crash", metrics=UPSERT_METRICS)

    result = _operator(tmp_path, fake_spark_submit).execute(make_context())

    assert (result["tableVersion"], result["skipped"], result["appId"]) == (1, False, APP_ID)
    assert result["numTargetRowsUpdated"] == UPSERT_METRICS["numTargetRowsUpdated"]
    assert find_merge_commit(table, app_id=APP_ID, app_version=0) is not None


def test_without_the_metrics_line_the_metrics_come_from_the_commit(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    # As in cluster deploy mode, where the driver's stdout never reaches spark-submit.
    create_table(tmp_path / "table")
    fake_spark_submit.mode("commit_silently", metrics=UPSERT_METRICS)

    result = _operator(tmp_path, fake_spark_submit).execute(make_context())

    assert {name: result[name] for name in UPSERT_METRICS} == UPSERT_METRICS
    assert (result["tableVersion"], result["appId"]) == (1, APP_ID)


def test_dry_run_neither_checks_the_log_nor_emits_table_metrics(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    table = create_table(tmp_path / "table")
    commit_merge(table, app_id=APP_ID, app_version=0)
    fake_spark_submit.mode("ok", metrics={**JOB_METRICS, "dryRun": True, "tableVersion": 1})
    op = _operator(tmp_path, fake_spark_submit, dry_run=True)
    assert op.outlets == []

    result = op.execute(make_context())

    (argv,) = fake_spark_submit.calls()
    assert _spec_arg(argv)["options"]["dry_run"] is True
    assert (result["dryRun"], result["skipped"]) == (True, False)


@pytest.mark.parametrize("side", ["target", "source"])
def test_storage_options_travel_in_a_private_file_that_is_removed(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    side: str,
) -> None:
    table = create_table(tmp_path / "table")
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    seen: list[tuple[str, int]] = []
    original = MergeSubmitHook.submit_job

    def spy(hook: MergeSubmitHook, application: str, args: list[str]) -> None:
        path = Path(args[1])
        seen.append((args[0], path.stat().st_mode & 0o777))
        original(hook, application, args)

    monkeypatch.setattr(MergeSubmitHook, "submit_job", spy)
    secret = {"storage_options": {"key": "secret"}}
    if side == "target":
        op = _operator(tmp_path, fake_spark_submit, target={"uri": table, **secret})
    else:
        source = {"uri": str(tmp_path / "src"), "format": "delta", **secret}
        op = _operator(tmp_path, fake_spark_submit, source=source)

    op.execute(make_context())

    assert seen == [("--spec", 0o600)]
    (argv,) = fake_spark_submit.calls()
    assert "secret" not in " ".join(argv)
    # The task log goes to the process's output (Airflow's logging, not the logging module's records):
    # the spec is logged there, with the storage options masked.
    out, err = capfd.readouterr()
    assert "Merge spec" in out + err
    assert '"key": "***"' in out + err
    assert "secret" not in out + err
    assert not Path(argv[argv.index("--spec") + 1]).exists()


def test_fire_and_forget_returns_the_merge_identity_at_once(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
) -> None:
    create_table(tmp_path / "table")
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    op = _operator(tmp_path, fake_spark_submit, wait_for_completion=False)
    assert op.outlets == []

    result = op.execute(make_context())

    assert result["appId"] == APP_ID
    assert result["appVersion"] == 0
    assert result["submitted"] is True
    deadline = time.monotonic() + 30
    while not fake_spark_submit.calls() and time.monotonic() < deadline:
        time.sleep(0.1)
    (argv,) = fake_spark_submit.calls()
    assert "spark.yarn.submit.waitAppCompletion=false" in argv
    assert Path(result["driverLog"]).is_file()


def test_on_kill_stops_spark_submit(tmp_path: Path) -> None:
    op = _operator(tmp_path)
    killed: list[bool] = []
    op._hook = SimpleNamespace(on_kill=lambda: killed.append(True))  # type: ignore[assignment]
    op.on_kill()
    assert killed == [True]


def test_a_target_that_is_not_a_delta_table_fails_with_one_clear_message_first(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sys
    import traceback

    from airflow_merge_provider.errors import TargetTableNotFoundError

    missing = tmp_path / "not_a_table"
    op = _operator(tmp_path, fake_spark_submit, target=str(missing))
    context = make_context()
    op.render_template_fields(context)

    with pytest.raises(TargetTableNotFoundError) as raised:
        op.execute(context)

    message = (
        f"{missing} is not a Delta table (no _delta_log found). Check the target URI and that the table has "
        "been created."
    )
    assert str(raised.value) == message
    # The task log says it first, as one error line (before the traceback Airflow prints).
    errors = [line for line in capsys.readouterr().out.splitlines() if "[error" in line]
    assert len(errors) == 1, errors
    assert message in errors[0]
    printed = "".join(traceback.format_exception(raised.value))
    # One traceback, ending with the message; deltalake's and the job's errors below it, once each.
    assert printed.count("Traceback (most recent call last)") == 1
    assert "The above exception was the direct cause" not in printed
    if sys.version_info >= (3, 11):
        notes = getattr(raised.value, "__notes__", [])
        assert len(notes) == 1, notes
        assert notes[0].startswith(f"Caused by MergeAnalysisError: Cannot read the Delta log of {missing}: ")
        assert printed.rstrip().endswith(notes[0])
    assert fake_spark_submit.calls() == []
