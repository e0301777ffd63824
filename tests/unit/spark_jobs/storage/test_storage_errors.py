"""The kind of a failed store request, read off the store's answer as deltalake, obstore and pyarrow quote
it (messages recorded from moto, Azurite and the stores' documented error bodies), and the one-paragraph
message each kind gets. The same classes on real servers: tests/integration/object_storage."""

from __future__ import annotations

import pytest
from obstore.exceptions import GenericError, PermissionDeniedError, UnauthenticatedError

from spark_jobs.delta_merge.errors import (
    DETERMINISTIC_ERRORS,
    StorageAuthenticationError,
    StorageContainerNotFoundError,
    StorageNetworkError,
    StoragePermissionError,
    StorageThrottledError,
    TableStorageError,
)
from spark_jobs.delta_merge.storage.storage_errors import (
    credentials_named,
    storage_failure,
    storage_fault,
    task_storage_fault,
)

ARROW = "\x1b[31m↳\x1b[0m"  # deltalake's cause chain, coloured
S3_SIGNATURE = (
    "Kernel error -> The operation lacked the necessary privileges to complete for path "
    f"t/_delta_log/_last_checkpoint\n  {ARROW} Error performing GET http://127.0.0.1:47169/bkt/t/_delta_log/"
    f"_last_checkpoint in 7.1ms - Server returned non-2xx status code\n  {ARROW} 403 Forbidden\n  {ARROW} "
    '<?xml version="1.0" encoding="utf-8"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>The request '
    "signature we calculated does not match the signature you provided.</Message></Error>"
)
S3_ACCESS_DENIED = (
    "The operation lacked the necessary privileges to complete for path t/x: Error performing PUT "
    "http://127.0.0.1:47169/bkt/t/x in 7.6ms - Server returned non-2xx status code: 403 Forbidden: "
    '<?xml version="1.0" encoding="utf-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
    "</Error>"
)
S3_NO_SUCH_BUCKET = (
    f"Kernel error -> Generic S3 error\n  {ARROW} Error performing list request\n  {ARROW} Error performing "
    "GET http://127.0.0.1:47169/nobucket-x?list-type=2 in 3.1ms - Server returned non-2xx status code\n  "
    f"{ARROW} 404 Not Found\n  {ARROW} <Error><Code>NoSuchBucket</Code><Message>The specified bucket does "
    "not exist</Message></Error>"
)
S3_REFUSED = (
    f"Kernel error -> Generic S3 error\n  {ARROW} Error performing GET http://127.0.0.1:1/bkt/t/_delta_log/"
    f"_last_checkpoint in 1.5s, after 10 retries, max_retries\n  {ARROW} 10, retry_timeout\n  {ARROW} 180s  "
    f"- HTTP error\n  {ARROW} error sending request\n  {ARROW} client error (Connect)\n  {ARROW} tcp connect "
    f"error\n  {ARROW} Connection refused (os error 111)\n"
)
S3_DNS = (
    "Generic S3 error: Error performing GET http://no-such-host.invalid:9000/bkt/t in 5.1ms - HTTP error: "
    "error sending request\n\nDebug source:\nGeneric {\n inner: Http(HttpError { kind: Connect, source: "
    "dns error: failed to lookup address information: Name or service not known"
)
S3_SLOW_DOWN = (
    "Generic S3 error: Error performing PUT http://s3.amazonaws.com/b/t/x in 12.1s, after 10 retries, "
    "max_retries: 10, retry_timeout: 180s - Server returned non-2xx status code: 503 Service Unavailable: "
    "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
)
AZURE_AUTHENTICATION = (
    "The operation lacked the necessary privileges to complete for path t/_delta_log/x.json: Error "
    "performing GET http://127.0.0.1:10000/devstoreaccount1/c/t in 2ms - Server returned non-2xx status "
    "code: 403 Server failed to authenticate the request. Make sure the value of the Authorization header "
    "is formed correctly including the signature.: <?xml version=\"1.0\"?><Error><Code>AuthenticationFailed"
    "</Code></Error>"
)
AZURE_NO_CONTAINER = (
    "Object at location t/x not found: Error performing GET http://127.0.0.1:10000/devstoreaccount1/gone/t "
    "in 2ms - Server returned non-2xx status code: 404 The specified container does not exist.: "
    "<Error><Code>ContainerNotFound</Code></Error>"
)
AZURE_SERVER_BUSY = (
    "Generic MicrosoftAzure error: Error performing PUT https://acct.blob.core.windows.net/c/t/x, after 10 "
    "retries - Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>ServerBusy</Code>"
    "<Message>Ingress is over the account limit.</Message></Error>"
)
GCS_RATE_LIMIT = (
    "Generic GCS error: Error performing POST https://storage.googleapis.com/upload/b in 9s - Server "
    'returned non-2xx status code: 429 Too Many Requests: {"error": {"code": 429, "errors": '
    '[{"reason": "rateLimitExceeded"}]}}'
)
GCS_BUCKET = (
    "Object at location t/x not found: Error performing GET https://storage.googleapis.com/gone/t/x - "
    "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code><Message>The "
    "specified bucket does not exist.</Message></Error>"
)
ARROW_HEAD_DENIED = (
    "When getting information for key 't/x' in bucket 'bkt': AWS Error ACCESS_DENIED during HeadObject "
    "operation: No response body."
)
AZURITE_WRONG_KEY = (
    "Kernel error -> The operation lacked the necessary privileges to complete for path t/_delta_log/"
    f"_last_checkpoint\n  {ARROW} 403 Forbidden\n  {ARROW} <Error>\n  <Code>AuthorizationFailure</Code>\n  "
    "<Message>Server failed to authenticate the request. Make sure the value of the Authorization header is "
    "formed correctly including the signature.</Message>\n</Error>"
)
ARROW_HEAD_403 = (
    "When getting information for key 't/part-0.parquet' in bucket 'bkt': AWS Error UNKNOWN (HTTP status "
    "403) during HeadObject operation: No response body."
)
ARROW_PUT_DENIED = (
    "When uploading part for key 't/part-1.parquet' in bucket 'bkt': AWS Error ACCESS_DENIED during "
    "PutObject operation: Access Denied"
)
ARROW_UNREACHABLE = (
    "When reading information for key 't/x' in bucket 'bkt': AWS Error NETWORK_CONNECTION during HeadObject "
    "operation: curlCode: 7, Couldn't connect to server"
)
ARROW_UNKNOWN_KEY = (
    "When listing objects under key 't' in bucket 'bkt': AWS Error INVALID_ACCESS_KEY_ID during "
    "ListObjectsV2 operation: The AWS Access Key Id you provided does not exist in our records."
)
MISSING_OBJECT = (
    "Object at location t/_delta_log/00000000000000000007.json not found: Error performing GET "
    "http://h/b/t/_delta_log/00000000000000000007.json in 2ms, after 0 retries, retry_timeout: 180s - "
    "Server returned non-2xx status code: 404 Not Found: <Error><Code>NoSuchKey</Code></Error>"
)


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (OSError(S3_SIGNATURE), "authentication"),
        (PermissionDeniedError(S3_SIGNATURE.removeprefix("Kernel error -> ")), "authentication"),
        (OSError(ARROW_UNKNOWN_KEY), "authentication"),
        (OSError(AZURE_AUTHENTICATION), "authentication"),
        (OSError(AZURITE_WRONG_KEY), "authentication"),
        (UnauthenticatedError("Unauthenticated: the request carries no valid credentials"), "authentication"),
        (PermissionDeniedError(S3_ACCESS_DENIED), "permission"),
        (OSError(ARROW_PUT_DENIED), "permission"),
        (OSError(ARROW_HEAD_403), "permission"),
        (PermissionError(13, "Permission denied", "/data/t/_delta_log"), "permission"),
        (OSError(S3_NO_SUCH_BUCKET), "missing container"),
        (FileNotFoundError(AZURE_NO_CONTAINER), "missing container"),
        (FileNotFoundError(GCS_BUCKET), "missing container"),
        (GenericError(S3_SLOW_DOWN), "throttled"),
        (GenericError(AZURE_SERVER_BUSY), "throttled"),
        (GenericError(GCS_RATE_LIMIT), "throttled"),
        (OSError(S3_REFUSED), "network"),
        (GenericError(S3_DNS), "network"),
        (OSError(ARROW_UNREACHABLE), "network"),
        (OSError("Server returned non-2xx status code: 500 Internal Server Error: <Code>InternalError"
                 "</Code>"), "network"),
        (FileNotFoundError(MISSING_OBJECT), None),
        (OSError("No space left on device"), None),
    ],
)  # fmt: skip
def test_the_kind_of_failure_comes_from_the_stores_answer(error: BaseException, fault: str | None) -> None:
    assert storage_fault(error) == fault


def test_refusals_are_deterministic_and_faults_of_the_way_are_retried() -> None:
    refusals = {StorageAuthenticationError, StoragePermissionError, StorageContainerNotFoundError}
    assert {kind.__name__ for kind in refusals} <= DETERMINISTIC_ERRORS
    for retried in (StorageThrottledError, StorageNetworkError, TableStorageError):
        assert retried.__name__ not in DETERMINISTIC_ERRORS
        assert issubclass(retried, TableStorageError)


S3_OPTIONS = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value-never-shown"}


def test_an_authentication_failure_names_the_connection_the_credentials_came_from() -> None:
    with credentials_named({"s3://bkt/t": "aws_conn_id='lake_s3'", "s3://bkt/src": None}):
        error = storage_failure("s3a://bkt/t/", "reading the Delta log", OSError(S3_SIGNATURE), S3_OPTIONS)
        source = storage_failure("s3://bkt/src", "listing the source", OSError(S3_SIGNATURE), S3_OPTIONS)
    outside = storage_failure("s3://bkt/t", "reading the Delta log", OSError(S3_SIGNATURE), S3_OPTIONS)

    assert type(error) is StorageAuthenticationError
    assert str(error) == (
        "Reading the Delta log of table s3a://bkt/t/ failed: the store did not accept the credentials (403 "
        "Forbidden, SignatureDoesNotMatch). They came from aws_conn_id='lake_s3': check the access key id "
        "and secret access key (and the session token of temporary credentials)."
    )
    assert "They came from storage_options (AWS_SECRET_ACCESS_KEY)" in str(source)
    assert "They came from storage_options (AWS_SECRET_ACCESS_KEY)" in str(outside)


@pytest.mark.parametrize(
    ("uri", "options", "source"),
    [
        ("s3://b/t", {"AWS_REGION": "eu-west-1"},
         "the environment of the driver and executors (AWS_ACCESS_KEY_ID"),
        ("az://c/t", {"azure_storage_account_name": "acct"}, "(AZURE_STORAGE_*) or their managed identity"),
        ("gs://b/t", {}, "(GOOGLE_APPLICATION_CREDENTIALS) or their service account"),
        ("abfss://c@acct.dfs.core.windows.net/t", {"azure_storage_sas_token": "sv=1&sig=abc"},
         "storage_options (azure_storage_sas_token)"),
    ],
)  # fmt: skip
def test_without_keys_the_credentials_came_from_the_environment(
    uri: str, options: dict[str, str], source: str
) -> None:
    error = storage_failure(uri, "reading the Delta log", PermissionDeniedError(S3_ACCESS_DENIED), options)
    assert source in str(error)


def test_each_kind_says_what_to_check() -> None:
    cases = [
        (PermissionDeniedError(S3_ACCESS_DENIED), StoragePermissionError,
         "the store refused the request (403 Forbidden, AccessDenied): the credentials from storage_options "
         "(AWS_SECRET_ACCESS_KEY) may not do this. Check that they may list, read and write"),
        (OSError(ARROW_HEAD_403), StoragePermissionError, "are wrong or may not do this"),
        (OSError(ARROW_HEAD_DENIED), StoragePermissionError, "(AWS_SECRET_ACCESS_KEY) are wrong or may not"),
        (OSError(S3_NO_SUCH_BUCKET), StorageContainerNotFoundError,
         "the bucket 'bkt' does not exist (404 Not Found, NoSuchBucket)"),
        (GenericError(S3_SLOW_DOWN), StorageThrottledError,
         "the store is throttling requests (503 Service Unavailable, SlowDown), after the client's own "
         "retries"),
        (OSError(S3_REFUSED), StorageNetworkError,
         "the store could not be reached or failed (connection refused) at the region's default S3 endpoint"),
    ]  # fmt: skip
    for cause, kind, expected in cases:
        error = storage_failure("s3://bkt/t", "writing commit 1", cause, S3_OPTIONS)
        assert type(error) is kind
        assert expected in str(error)
        assert str(error).startswith("Writing commit 1 of table s3://bkt/t failed: ")
        assert "_last_checkpoint" not in str(error)
    container = storage_failure("abfss://gone@acct.dfs.core.windows.net/t", "reading the Delta log",
                                FileNotFoundError(AZURE_NO_CONTAINER), {})  # fmt: skip
    assert "the container 'gone' does not exist (HTTP 404, ContainerNotFound)" in str(container)


def test_an_endpoint_in_the_options_is_named_for_a_network_fault() -> None:
    options = {**S3_OPTIONS, "AWS_ENDPOINT_URL": "http://minio.internal:9000"}
    error = storage_failure("s3://bkt/t", "reading the Delta log", OSError(S3_REFUSED), options)
    assert "at http://minio.internal:9000, after the client's own retries" in str(error)


def test_a_failure_of_no_known_kind_keeps_its_cause() -> None:
    error = storage_failure("s3://bkt/t", "reading commit 7", FileNotFoundError(MISSING_OBJECT), S3_OPTIONS,
                            note="The table was vacuumed?")  # fmt: skip
    assert type(error) is TableStorageError
    assert str(error).startswith(
        "Reading commit 7 of table s3://bkt/t failed. Check that the bucket (or container) and the table "
        "path exist. The credentials came from storage_options (AWS_SECRET_ACCESS_KEY). Cause: "
        "FileNotFoundError: Object at location t/_delta_log/00000000000000000007.json not found"
    )
    assert str(error).endswith(" The table was vacuumed?")


def test_secrets_quoted_by_a_cause_are_masked_in_every_kind() -> None:
    for text in (S3_SIGNATURE, S3_REFUSED, MISSING_OBJECT):
        cause = OSError(f"signed with s3cr3t-value-never-shown: {text}")
        error = storage_failure("s3://bkt/t", "reading the Delta log", cause, S3_OPTIONS)
        assert "s3cr3t-value-never-shown" not in str(error)


@pytest.mark.parametrize(
    ("task_error", "fault"),
    [
        (f"Job aborted due to stage failure: Task 0 failed\nOSError: {ARROW_PUT_DENIED}", "permission"),
        ("pyspark.errors.PythonException: OSError: GetFileInfo() failed. Azure Error: [AuthenticationFailed] "
         "403 Server failed to authenticate the request.", "authentication"),
        ("OSError: google::cloud::Status(PERMISSION_DENIED: Permission 'storage.objects.create' denied)",
         "permission"),
        ("OSError: google::cloud::Status(RESOURCE_EXHAUSTED: rate limit)", "throttled"),
        ("org.apache.spark.SparkException: Futures timed out after [120 seconds]", None),
        ("java.io.IOException: Connection reset by peer (fetching a shuffle block)", None),
    ],
)  # fmt: skip
def test_a_failed_spark_task_is_classified_only_by_what_its_store_client_said(
    task_error: str, fault: str | None
) -> None:
    assert task_storage_fault(Exception(task_error)) == fault
