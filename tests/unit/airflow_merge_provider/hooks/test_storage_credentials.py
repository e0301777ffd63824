"""S3 credentials from an Airflow connection (``aws_conn_id``), without a JVM: the hook, the merge of
credentials into storage options, and MergeIntoOperator carrying them to spark-submit in a private file only.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import json
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_merge_provider.errors import MergeArgumentError, MergeJobFailedError
from airflow_merge_provider.hooks import storage_credentials
from airflow_merge_provider.hooks.merge_into import MergeSubmitHook
from airflow_merge_provider.hooks.storage_credentials import (
    StorageCredentialsHook,
    secret_option_keys,
    with_credentials,
)
from airflow_merge_provider.operators import merge_into
from airflow_merge_provider.spec_credentials import with_connection_credentials
from tests.support.airflow_fixtures import ContextFactory
from tests.unit.airflow_merge_provider.operators.test_merge_into import JOB_METRICS, _operator

ACCESS_KEY = "AKIATESTCONNECTION01"
SECRET = "conn-secret-5b0c7e1f9d2a"
TOKEN = "conn-session-token-77aa"


def _define(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "aws", **fields}))


def test_a_generic_connection_gives_keys_region_and_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_credentials, "amazon_provider_installed", lambda: False)
    _define(monkeypatch, "lake", login=ACCESS_KEY, password=SECRET,
            extra={"region_name": "eu-west-3", "endpoint_url": "http://127.0.0.1:9000"})  # fmt: skip

    options = StorageCredentialsHook(aws_conn_id="lake").storage_options()

    assert options == {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "eu-west-3",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
    }  # fmt: skip


def test_a_session_token_and_a_per_service_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_credentials, "amazon_provider_installed", lambda: False)
    _define(monkeypatch, "lake", login=ACCESS_KEY, password=SECRET,
            extra={"aws_session_token": TOKEN, "service_config": {"s3": {"endpoint_url": "https://s3.internal"}}})

    options = StorageCredentialsHook(aws_conn_id="lake").storage_options()

    assert options == {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN,
        "AWS_ENDPOINT_URL": "https://s3.internal",
    }  # fmt: skip


def test_an_unknown_connection_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_LAKE", raising=False)

    with pytest.raises(MergeArgumentError, match="'no_such_lake'") as caught:
        StorageCredentialsHook(aws_conn_id="no_such_lake").storage_options()

    assert "AIRFLOW_CONN_NO_SUCH_LAKE" in str(caught.value)


def test_the_async_read_for_triggers_gives_the_same_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_credentials, "amazon_provider_installed", lambda: False)
    _define(monkeypatch, "lake", login=ACCESS_KEY, password=SECRET,
            extra={"aws_session_token": TOKEN, "region_name": "eu-west-3", "endpoint_url": "http://h:9000"})
    hook = StorageCredentialsHook(aws_conn_id="lake")

    options = asyncio.run(hook.astorage_options())

    assert options == hook.storage_options()
    assert (options["AWS_SECRET_ACCESS_KEY"], options["AWS_SESSION_TOKEN"]) == (SECRET, TOKEN)
    monkeypatch.delenv("AIRFLOW_CONN_LAKE")
    with pytest.raises(MergeArgumentError, match="AIRFLOW_CONN_LAKE"):
        asyncio.run(hook.astorage_options())


def test_secret_options_are_found_by_the_words_the_job_masks() -> None:
    options = {"AWS_SECRET_ACCESS_KEY": "s", "aws_session_token": "t", "AZURE_STORAGE_SAS_KEY": "k",
               "azure_storage_account_key": "a", "AWS_ACCESS_KEY_ID": "i", "AWS_ENDPOINT_URL": "e",
               "AWS_REGION": "r", "AWS_ALLOW_HTTP": "true"}  # fmt: skip
    assert secret_option_keys(options) == [
        "AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_SAS_KEY", "aws_session_token", "azure_storage_account_key"
    ]  # fmt: skip


def test_a_connection_without_a_secret_is_an_error_that_does_not_quote_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(storage_credentials, "amazon_provider_installed", lambda: False)
    _define(monkeypatch, "half", login=ACCESS_KEY, extra={"region_name": "eu-west-3"})

    with pytest.raises(MergeArgumentError, match="'half'") as caught:
        StorageCredentialsHook(aws_conn_id="half").storage_options()

    assert ACCESS_KEY not in str(caught.value)


def test_with_the_amazon_provider_its_hook_resolves_the_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in module of the same name plays AwsBaseHook, so the branch's own logic (what it asks the
    # provider, how it maps the answer) runs without STS;
    # tests/integration/object_storage/test_s3_amazon_provider.py runs the real provider against moto.
    asked: list[str] = []

    class FakeAwsBaseHook:
        region_name = "ap-south-1"

        def __init__(self, *, aws_conn_id: str) -> None:
            asked.append(aws_conn_id)

        def get_credentials(self) -> Any:
            return SimpleNamespace(access_key="AKIAROLE", secret_key="role-secret", token="role-token")

    names = ["airflow.providers.amazon", "airflow.providers.amazon.aws", "airflow.providers.amazon.aws.hooks",
             "airflow.providers.amazon.aws.hooks.base_aws"]  # fmt: skip
    for name in names:
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys.modules[names[-1]], "AwsBaseHook", FakeAwsBaseHook, raising=False)
    _define(monkeypatch, "role", extra={"role_arn": "arn:aws:iam::1:role/x", "endpoint_url": "https://s3.x"})

    assert storage_credentials.amazon_provider_installed()
    options = StorageCredentialsHook(aws_conn_id="role").storage_options()

    assert asked == ["role"]
    assert options == {
        "AWS_ACCESS_KEY_ID": "AKIAROLE", "AWS_SECRET_ACCESS_KEY": "role-secret",
        "AWS_SESSION_TOKEN": "role-token", "AWS_REGION": "ap-south-1", "AWS_ENDPOINT_URL": "https://s3.x",
    }  # fmt: skip


CREDENTIALS = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN,
               "AWS_REGION": "eu-west-3", "AWS_ENDPOINT_URL": "http://minio:9000"}  # fmt: skip


def test_explicit_storage_options_win_and_a_key_is_never_mixed() -> None:
    explicit = {"aws_region": "us-east-1", "AWS_ENDPOINT": "http://other:9000",
                "AWS_ACCESS_KEY_ID": "AKIAMINE", "AWS_SECRET_ACCESS_KEY": "mine"}  # fmt: skip

    merged = with_credentials(CREDENTIALS, explicit, uri="s3://bucket/table")

    # Region and endpoint given under other spellings win; the explicit key comes without the connection's
    # session token (a token belongs to its own key).
    assert merged == explicit
    only_region = with_credentials(CREDENTIALS, {"AWS_REGION": "us-east-1"}, uri="s3a://bucket/table")
    assert only_region == {**CREDENTIALS, "AWS_REGION": "us-east-1"}


def test_credentials_go_only_to_s3_uris() -> None:
    assert with_credentials(CREDENTIALS, {}, uri="/local/table") == {}
    assert with_credentials(CREDENTIALS, {"x": "y"}, uri="gs://bucket/t") == {"x": "y"}
    assert with_credentials(CREDENTIALS, {}, uri=None) == {}
    assert with_credentials(CREDENTIALS, {}, uri="S3://bucket/t") == CREDENTIALS


def test_the_connection_is_named_as_the_credentials_source_only_where_its_keys_are_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_jobs.delta_merge.contract import MergeSpec

    monkeypatch.setattr(storage_credentials, "amazon_provider_installed", lambda: False)
    _define(monkeypatch, "lake", login=ACCESS_KEY, password=SECRET, extra={"region_name": "eu-west-3"})
    spec = MergeSpec.from_dict({
        "target": {"uri": "s3://bucket/t"},
        "source": {"uri": "s3://bucket/s", "storage_options": {"AWS_ACCESS_KEY_ID": "AKIAMINE",
                                                              "AWS_SECRET_ACCESS_KEY": "mine"}},
        "merge_sql": "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE",
    })  # fmt: skip

    quiet = SimpleNamespace(info=lambda *args: None)
    completed = with_connection_credentials(spec, aws_conn_id="lake", log=quiet)

    assert completed.target.storage_options["AWS_SECRET_ACCESS_KEY"] == SECRET
    assert completed.target.credentials_from == "aws_conn_id='lake'"
    # The source's own key wins, and is named as its own.
    assert completed.source.storage_options["AWS_SECRET_ACCESS_KEY"] == "mine"
    assert completed.source.credentials_from is None


# -- MergeIntoOperator -------------------------------------------------------------------------------------


def test_the_operator_puts_connection_credentials_in_the_private_spec_file_only(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(storage_credentials, "amazon_provider_installed", lambda: False)
    _define(monkeypatch, "lake", login=ACCESS_KEY, password=SECRET,
            extra={"region_name": "eu-west-3", "endpoint_url": "http://127.0.0.1:9"})  # fmt: skip
    checked: list[dict[str, str]] = []

    def no_commit_yet(uri: str, **kwargs: Any) -> None:  # the idempotency check, without an S3 server
        checked.append(dict(kwargs["storage_options"]))

    monkeypatch.setattr(merge_into, "find_merge_commit", no_commit_yet)
    seen: list[tuple[str, int, dict[str, Any]]] = []
    original = MergeSubmitHook.submit_job

    def spy(hook: MergeSubmitHook, application: str, args: list[str]) -> None:
        path = Path(args[1])
        seen.append((args[0], path.stat().st_mode & 0o777, json.loads(path.read_text(encoding="utf-8"))))
        original(hook, application, args)

    monkeypatch.setattr(MergeSubmitHook, "submit_job", spy)
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    target = {"uri": "s3://lake/orders", "storage_options": {"AWS_REGION": "us-east-1"}}
    source = "s3://lake/incoming/{{ ds }}"
    op = _operator(tmp_path, fake_spark_submit, target=target, source=source, aws_conn_id="lake")
    context = make_context()
    op.render_template_fields(context)

    result = op.execute(context)

    ((flag, mode, spec),) = seen
    assert (flag, mode) == ("--spec", 0o600)
    expected = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true"}  # fmt: skip
    assert spec["target"]["storage_options"] == {**expected, "AWS_REGION": "us-east-1"}  # explicit wins
    assert spec["source"]["uri"] == "s3://lake/incoming/2024-01-02"
    assert spec["source"]["storage_options"] == {**expected, "AWS_REGION": "eu-west-3"}
    assert checked == [spec["target"]["storage_options"]]
    (argv,) = fake_spark_submit.calls()
    assert SECRET not in " ".join(argv)
    assert not Path(argv[argv.index("--spec") + 1]).exists()
    # The task log (Airflow's structlog writes to the process's streams): the run was logged, not the keys.
    captured = capfd.readouterr()
    log = captured.out + captured.err
    assert "from aws_conn_id='lake' (keys: AWS_ACCESS_KEY_ID" in log
    assert "MERGE into s3://lake/orders" in log
    assert SECRET not in log
    assert ACCESS_KEY not in log
    assert SECRET not in json.dumps(result)
    # The rendered fields (what the UI shows) keep only what the DAG gave.
    rendered = {name: getattr(op, name) for name in op.template_fields}
    assert SECRET not in json.dumps(rendered, default=str)
    assert op.target == target
    assert spec["run"]["app_id"] == result["appId"]


def test_an_unknown_aws_conn_id_fails_before_spark_submit(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_MISSING_LAKE", raising=False)
    monkeypatch.setattr(merge_into, "find_merge_commit", lambda *a, **k: None)
    fake_spark_submit.mode("ok", metrics=JOB_METRICS)
    op = _operator(tmp_path, fake_spark_submit, target="s3://lake/orders", aws_conn_id="missing_lake")

    with pytest.raises(MergeArgumentError, match="'missing_lake'"):
        op.execute(make_context())

    assert fake_spark_submit.calls() == []


CLUSTER_CONN = json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:7077",
                           "extra": {"deploy-mode": "cluster"}})  # fmt: skip


@pytest.mark.parametrize("deployment", ["detached client mode", "cluster mode"])
def test_aws_conn_id_refuses_a_submit_that_would_put_the_spec_on_the_command_line(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
    deployment: str,
) -> None:
    monkeypatch.setattr(storage_credentials, "amazon_provider_installed", lambda: False)
    _define(monkeypatch, "lake", login=ACCESS_KEY, password=SECRET)
    kwargs = _command_line_deployment(deployment, monkeypatch)
    found = ("deploy mode 'cluster', wait_for_completion=True" if deployment == "cluster mode"
             else "deploy mode 'client', wait_for_completion=False")  # fmt: skip
    op = _operator(tmp_path, fake_spark_submit, target="s3://lake/orders", aws_conn_id="lake", **kwargs)

    with pytest.raises(MergeArgumentError, match="command line") as caught:
        op.execute(make_context())

    assert found in str(caught.value)
    assert SECRET not in str(caught.value)
    assert fake_spark_submit.calls() == []


def _command_line_deployment(deployment: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The operator's arguments for a deployment whose spec goes on spark-submit's command line: detached
    (wait_for_completion=False) or cluster mode; no earlier commit of the merge is found."""
    monkeypatch.setattr(merge_into, "find_merge_commit", lambda *a, **k: None)
    if deployment == "cluster mode":
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", CLUSTER_CONN)
        return {"conn_id": "spark_cluster"}
    return {"wait_for_completion": False}


def _refusal(op: Any, make_context: ContextFactory) -> str:
    with pytest.raises(MergeArgumentError) as caught:
        op.execute(make_context())
    return str(caught.value)


@pytest.mark.parametrize("deployment", ["detached", "cluster mode"])
def test_secret_storage_options_are_refused_where_the_spec_would_be_on_the_command_line(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
    deployment: str,
) -> None:
    kwargs = _command_line_deployment(deployment, monkeypatch)
    target = {"uri": "s3://lake/orders", "storage_options": {"AWS_SECRET_ACCESS_KEY": SECRET}}
    op = _operator(tmp_path, fake_spark_submit, target=target, **kwargs)

    with pytest.raises(MergeArgumentError, match="credentials in storage_options or a storage connection"):
        op.execute(make_context())

    assert "storage_options ['AWS_SECRET_ACCESS_KEY']" in str(op_error := _refusal(op, make_context))
    assert SECRET not in op_error
    assert fake_spark_submit.calls() == []


@pytest.mark.parametrize("deployment", ["detached", "cluster mode"])
def test_storage_options_without_secrets_travel_in_any_deploy_mode(
    tmp_path: Path,
    make_context: ContextFactory,
    fake_spark_submit: SimpleNamespace,
    spark_local: str,
    monkeypatch: pytest.MonkeyPatch,
    deployment: str,
) -> None:
    # An endpoint and a region, the credentials coming from the driver's environment or role.
    kwargs = _command_line_deployment(deployment, monkeypatch)
    options = {"AWS_ENDPOINT_URL": "https://s3.eu-west-1.amazonaws.com", "AWS_REGION": "eu-west-1"}
    target = {"uri": "s3://lake/orders", "storage_options": options}
    op = _operator(tmp_path, fake_spark_submit, target=target, **kwargs)

    if deployment == "cluster mode":
        # The stand-in spark-submit reports no cluster driver id, so the run fails after submitting.
        with pytest.raises(MergeJobFailedError):
            op.execute(make_context())
    else:
        op.execute(make_context())

    deadline = time.monotonic() + 30  # a detached submit is not waited for
    while not fake_spark_submit.calls() and time.monotonic() < deadline:
        time.sleep(0.1)
    (argv,) = fake_spark_submit.calls()
    assert "eu-west-1" in " ".join(argv)
