"""GCS credentials from an Airflow connection (``gcp_conn_id``), read as the Google provider's
``google_cloud_platform`` connection type defines its extras, and how the job's pyarrow side opens a GCS
table with them; without a JVM. No GCS emulator installable here serves object_store's GCS client (see
docs/object-storage.md), so the files' path through obstore's fsspec store is shown on the S3 API server:
tests/integration/object_storage/test_gcs_files.py."""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace
from typing import Any

import pyarrow.fs as pafs
import pytest

from airflow_merge_provider.errors import MergeArgumentError
from airflow_merge_provider.hooks.storage_credentials import (
    GcsStorageCredentialsHook,
    connection_storage_options,
    secret_option_keys,
    with_credentials,
)
from airflow_merge_provider.operators.merge_into import MergeIntoOperator
from airflow_merge_provider.sensors.merge_commit import MergeCommitSensor
from airflow_merge_provider.spec_credentials import with_connection_credentials
from airflow_merge_provider.triggers.merge_commit import MergeCommitTrigger
from spark_jobs.delta_merge.contract import MergeSpec
from spark_jobs.delta_merge.storage.arrow_store import arrow_filesystem

PRIVATE_KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvgIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
KEY = {"type": "service_account", "project_id": "lake", "private_key_id": "k1", "private_key": PRIVATE_KEY,
       "client_email": "merger@lake.iam.gserviceaccount.com"}  # fmt: skip
NOT_A_KEY = "the extra keyfile_dict is not a service account key"
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"


def _define(monkeypatch: pytest.MonkeyPatch, conn_id: str, extra: dict[str, Any]) -> None:
    connection = {"conn_type": "google_cloud_platform", "extra": extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # the key itself, as JSON text or as an object, with or without the provider's old prefix
        ({"keyfile_dict": json.dumps(KEY)}, {"google_service_account_key": json.dumps(KEY)}),
        ({"keyfile_dict": KEY, "project": "lake"}, {"google_service_account_key": json.dumps(KEY)}),
        ({"extra__google_cloud_platform__keyfile_dict": json.dumps(KEY)},
         {"google_service_account_key": json.dumps(KEY)}),
        # a key file the driver and executors read
        ({"key_path": "/secrets/lake-merger.json"}, {"google_service_account": "/secrets/lake-merger.json"}),
        # no key: the environment's credentials apply, as the provider falls back to Application Default
        ({"project": "lake", "scope": "https://www.googleapis.com/auth/devstorage.read_write"}, {}),
    ],
)  # fmt: skip
def test_the_connection_extras_become_the_jobs_storage_options(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], expected: dict[str, str]
) -> None:
    _define(monkeypatch, "lake_gcs", extra)
    assert GcsStorageCredentialsHook(gcp_conn_id="lake_gcs").storage_options() == expected
    assert asyncio.run(GcsStorageCredentialsHook(gcp_conn_id="lake_gcs").astorage_options()) == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"key_secret_name": "merger-key"}, "key_secret_name (a key in Secret Manager)"),
        ({"credential_config_file": "/etc/wif.json"},
         "credential_config_file (workload identity federation)"),
        ({"keyfile_dict": json.dumps(KEY), "impersonation_chain": "a@b"},
         "impersonation_chain (service account impersonation)"),
        ({"keyfile_dict": "not json " + PRIVATE_KEY}, NOT_A_KEY),
        ({"keyfile_dict": {"private_key": PRIVATE_KEY}}, NOT_A_KEY),
    ],
)  # fmt: skip
def test_credentials_the_job_cannot_use_are_refused_by_name_without_the_key(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], message: str
) -> None:
    _define(monkeypatch, "lake_gcs", extra)
    with pytest.raises(MergeArgumentError, match=re.escape(message)) as refused:
        GcsStorageCredentialsHook(gcp_conn_id="lake_gcs").storage_options()
    assert "Google Cloud connection 'lake_gcs' (gcp_conn_id)" in str(refused.value)
    assert "BEGIN PRIVATE KEY" not in str(refused.value)
    assert "MIIEvg" not in str(refused.value)


def test_an_undefined_connection_says_how_to_define_one() -> None:
    undefined = r"'no_such_gcs' \(gcp_conn_id\) is not defined.*google_cloud_platform.*keyfile_dict"
    with pytest.raises(MergeArgumentError, match=undefined):
        GcsStorageCredentialsHook(gcp_conn_id="no_such_gcs").storage_options()


def test_the_key_is_a_secret_option_and_explicit_credentials_win() -> None:
    credentials = {"google_service_account_key": json.dumps(KEY)}
    assert secret_option_keys(credentials) == ["google_service_account_key"]
    assert with_credentials(credentials, {}, uri="gs://lake/orders") == credentials
    assert with_credentials(credentials, {}, uri="s3://lake/orders") == {}
    assert with_credentials(credentials, {}, uri="az://lake/orders") == {}
    # A key file named explicitly is used alone: never beside the connection's key.
    explicit = {"GOOGLE_SERVICE_ACCOUNT_PATH": "/mine.json", "google_base_url": "https://gcs.internal"}
    assert with_credentials(credentials, explicit, uri="gs://lake/orders") == explicit


def test_only_the_connection_of_the_uris_store_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    _define(monkeypatch, "lake_gcs", {"keyfile_dict": KEY})
    options, named = connection_storage_options(
        {}, uri="gs://lake/orders", aws_conn_id="undefined_aws", azure_conn_id="undefined_azure",
        gcp_conn_id="lake_gcs",
    )  # fmt: skip
    assert (options, named) == ({"google_service_account_key": json.dumps(KEY)}, "gcp_conn_id='lake_gcs'")
    # Not read for another store (an undefined one would fail).
    assert connection_storage_options({}, uri="s3://b/t", gcp_conn_id="undefined_gcs") == ({}, None)
    # A connection without a key adds nothing: storage errors then name the environment.
    _define(monkeypatch, "adc_gcs", {"project": "lake"})
    assert connection_storage_options({}, uri="gs://lake/orders", gcp_conn_id="adc_gcs") == ({}, None)


def test_the_spec_gets_the_connections_key_named_as_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    _define(monkeypatch, "lake_gcs", {"keyfile_dict": KEY})
    spec = MergeSpec.from_dict({
        "target": {"uri": "gs://lake/tables/orders"},
        "source": {"uri": "gs://lake/landing/orders", "format": "parquet"},
        "merge_sql": UPSERT,
        "run": {"app_id": "orders.2024-06-01", "app_version": 1},
    })  # fmt: skip
    logged: list[str] = []
    log = SimpleNamespace(info=lambda message, *args: logged.append(message % args))
    completed = with_connection_credentials(spec, aws_conn_id=None, gcp_conn_id="lake_gcs", log=log)
    for part in (completed.target, completed.source):
        assert part.storage_options == {"google_service_account_key": json.dumps(KEY)}
        assert part.credentials_from == "gcp_conn_id='lake_gcs'"
    assert logged
    assert all("google_service_account_key" in line and "MIIEvg" not in line for line in logged)


def test_the_operator_sensor_and_trigger_take_gcp_conn_id() -> None:
    operator = MergeIntoOperator(task_id="upsert_orders_gcs", target="gs://lake/tables/orders",
                                 source="gs://lake/landing/orders", merge_sql=UPSERT,
                                 gcp_conn_id="lake_gcs")  # fmt: skip
    assert operator.gcp_conn_id == "lake_gcs"
    assert operator._storage_connections() == ["gcp_conn_id"]
    with pytest.raises(TypeError, match=r"unknown argument 'gcs_conn_id'; did you mean 'gcp_conn_id'\?"):
        MergeIntoOperator(task_id="t", target="gs://l/t", source="gs://l/s", merge_sql=UPSERT,
                          gcs_conn_id="lake_gcs")  # fmt: skip
    with pytest.raises(MergeArgumentError, match="gcp_conn_id"):
        MergeIntoOperator(task_id="t", target="gs://l/t", source="gs://l/s", merge_sql=UPSERT,
                          gcp_conn_id="lake_gcs", engine="delta")  # fmt: skip
    sensor = MergeCommitSensor(task_id="wait", target="gs://lake/tables/orders", app_id="a",
                               gcp_conn_id="lake_gcs", deferrable=True)  # fmt: skip
    assert sensor.gcp_conn_id == "lake_gcs"
    trigger = MergeCommitTrigger(target="gs://lake/tables/orders", app_id="a", gcp_conn_id="lake_gcs")
    _, kwargs = trigger.serialize()
    assert kwargs["gcp_conn_id"] == "lake_gcs"
    assert MergeCommitTrigger(**kwargs).gcp_conn_id == "lake_gcs"


def test_google_options_open_the_files_through_the_logs_object_store_client() -> None:
    # pyarrow's GcsFileSystem takes no service account key: with google_* options the files go through
    # obstore's fsspec store, which takes them as the log store does (nothing is contacted here).
    options = {"google_service_account_key": json.dumps(KEY), "google_base_url": "http://127.0.0.1:1"}
    fs, base = arrow_filesystem("gs://lake/tables/my%20orders", options)
    assert isinstance(fs, pafs.PyFileSystem)
    assert base == "lake/tables/my orders"
    store = fs.handler.fs
    assert store.protocol == "gs"
    assert store._config == options
    # Without google_* options, pyarrow's own GCS file system reads the environment's credentials.
    fs, base = arrow_filesystem("gs://lake/tables/orders", {})
    assert fs.type_name == "gcs"
    assert base == "lake/tables/orders"
