"""What a failed request to a table's store was, and the job's error for it: one paragraph naming the table,
the operation, what the store answered and where the credentials came from, never a secret.

Written by hand: neither obstore, deltalake nor pyarrow classify the store's answers beyond a few exception
types (a 403 is obstore's PermissionDeniedError whether the key is wrong or only lacks the permission;
deltalake re-raises every store error as OSError; pyarrow's are OSError too), so the error code and HTTP
status the store sent, as their messages quote them, decide the class:

- authentication (a wrong, unknown or malformed key), permission (the key may not do this) and a missing
  bucket or container are deterministic: a retry fails the same way until someone changes them;
- throttling and network faults are retried (the store clients have already retried a few times).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from urllib.parse import urlsplit

from spark_jobs.delta_merge.errors import (
    StorageAuthenticationError,
    StorageContainerNotFoundError,
    StorageNetworkError,
    StoragePermissionError,
    StorageThrottledError,
    TableStorageError,
)
from spark_jobs.delta_merge.storage.azure_options import AZURE_SCHEMES
from spark_jobs.delta_merge.storage.storage_secrets import is_secret_option, redacted

__all__ = ["credentials_named", "storage_errors", "storage_failure", "storage_fault", "task_storage_fault"]

# The store's error codes (S3's and GCS's XML <Code>, Azure's x-ms-error-code, pyarrow's AWS enum names),
# compared lowercased without underscores.
_AUTHENTICATION_CODES = frozenset({
    "signaturedoesnotmatch", "invalidaccesskeyid", "invalidclienttokenid", "invalidtoken",
    "unrecognizedclient", "missingsecurityheader", "authenticationfailed", "invalidauthenticationinfo",
    "noauthenticationinformation", "authenticationrequired", "invalidsecurity", "incompletesignature",
    "unauthenticated",
})  # fmt: skip
_PERMISSION_CODES = frozenset({
    "accessdenied", "allaccessdisabled", "authorizationfailure", "authorizationpermissionmismatch",
    "authorizationresourcetypemismatch", "authorizationsourceipmismatch", "authorizationprotocolmismatch",
    "insufficientaccountpermissions", "accountisdisabled", "forbidden", "userprojectaccessdenied",
    "permissiondenied",
})  # fmt: skip
_MISSING_CONTAINER_CODES = frozenset({
    "nosuchbucket", "containernotfound", "filesystemnotfound", "containerbeingdeleted", "bucketnotfound",
})  # fmt: skip
_THROTTLING_CODES = frozenset({
    "slowdown", "throttling", "throttlingexception", "toomanyrequests", "toomanyrequestsexception",
    "requestlimitexceeded", "serverbusy", "ratelimitexceeded", "serviceunavailable", "resourceexhausted",
})  # fmt: skip
_SERVER_FAULT_CODES = frozenset(
    {"internalerror", "internalservererror", "operationtimedout", "requesttimeout", "unavailable"}
)
# Phrases of connection failures in reqwest's (object_store), curl's and the AWS SDK's (pyarrow) messages.
# Not a bare "timeout": deltalake's messages quote the client's retry_timeout setting on every failure.
_NETWORK_PHRASES = (
    "connection refused", "dns error", "name or service not known", "failed to lookup address",
    "could not resolve host", "couldn't connect", "tcp connect error", "timed out", "connection reset",
    "connection closed", "broken pipe", "network_connection", "network is unreachable", "no route to host",
    "unexpected eof", "error sending request",
)  # fmt: skip
_CODE = re.compile(
    r"<Code>(\w+)</Code>|x-ms-error-code:\s*(\w+)|AWS Error (\w+)|ErrorCode:\s*(\w+)|\"reason\":\s*\"(\w+)\""
    r"|Azure Error: \[(\w+)\]|google::cloud::Status\((\w+)"
)
# What only a store client's message holds: a failed Spark task's text is classified only with one of these
# (its other lines may say "timed out" or "connection reset" of Spark's own RPCs).
_STORE_MESSAGE = re.compile(
    r"AWS Error|Azure Error|google::cloud|<Code>|Error performing (?:GET|PUT|HEAD|POST|DELETE)"
)
_STATUS = re.compile(
    r"\b(401|403|404|408|429|500|502|503|504) (?:Unauthorized|Forbidden|Not Found|Request Timeout|"
    r"Too Many Requests|Internal Server Error|Bad Gateway|Service Unavailable|Gateway Timeout)"
)
_HTTP_STATUS = re.compile(r"HTTP status (\d{3})|status code:? (\d{3})")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FAULTS = {
    "authentication": StorageAuthenticationError,
    "permission": StoragePermissionError,
    "missing container": StorageContainerNotFoundError,
    "throttled": StorageThrottledError,
    "network": StorageNetworkError,
}

# Where the credentials of a table's storage options came from, by table URI, when the caller knows it
# better than the options tell (the provider's aws_conn_id): set around a run by credentials_named.
_NAMED_CREDENTIALS: ContextVar[Mapping[str, str]] = ContextVar(
    "named_credentials", default=MappingProxyType({})
)


@contextmanager
def credentials_named(sources: Mapping[str, str | None]) -> Iterator[None]:
    """Within the block, storage errors of the tables under these URIs say their credentials came from
    the given description (``"aws_conn_id='lake_s3'"``), not from their storage options. None: no name."""
    named = {_uri_key(uri): text for uri, text in sources.items() if text}
    token = _NAMED_CREDENTIALS.set({**_NAMED_CREDENTIALS.get(), **named})
    try:
        yield
    finally:
        _NAMED_CREDENTIALS.reset(token)


def storage_fault(exc: BaseException) -> str | None:
    """What kind of failure ``exc`` is, from the store's answer it quotes: ``"authentication"``,
    ``"permission"``, ``"missing container"``, ``"throttled"``, ``"network"``, or None (anything else,
    a missing object among it)."""
    text = _ANSI.sub("", str(exc))
    codes = _codes(exc)
    statuses = _statuses(text)
    lowered = text.lower()
    # Azure's AuthenticationFailed message; Azurite sends it with the code AuthorizationFailure.
    if codes & _AUTHENTICATION_CODES or "failed to authenticate the request" in lowered:
        return "authentication"
    if codes & _PERMISSION_CODES:
        return "permission"
    if codes & _MISSING_CONTAINER_CODES or "specified bucket does not exist" in lowered:
        return "missing container"
    if codes & _THROTTLING_CODES or statuses & {"429", "503"}:
        return "throttled"
    if codes & _SERVER_FAULT_CODES or statuses & {"408", "500", "502", "504"}:
        return "network"
    if "401" in statuses or type(exc).__name__ == "UnauthenticatedError":
        return "authentication"
    if "403" in statuses or type(exc).__name__ == "PermissionDeniedError" or isinstance(exc, PermissionError):
        return "permission"
    if any(phrase in lowered for phrase in _NETWORK_PHRASES):
        return "network"
    return None


def task_storage_fault(exc: BaseException) -> str | None:
    """:func:`storage_fault` of a failed Spark job whose task quoted a store client's error, else None."""
    return storage_fault(exc) if _STORE_MESSAGE.search(str(exc)) else None


def storage_failure(
    table_uri: str,
    operation: str,
    exc: BaseException,
    storage_options: Mapping[str, str] | None,
    *,
    note: str = "",
) -> TableStorageError:
    """The job's error for a failed request to the table's store: its class by :func:`storage_fault`, its
    message naming the table, the operation, what the store answered, where the credentials came from and
    what to check (secrets masked).

    :param operation: what failed, e.g. ``"reading the Delta log"``.
    :param note: a sentence to end the message with.
    """
    fault = storage_fault(exc)
    options = storage_options or {}
    scheme = urlsplit(table_uri).scheme.lower()
    store = "azure" if scheme in AZURE_SCHEMES else "gcs" if scheme in ("gs", "gcs") else "s3"
    credentials = _credentials_source(table_uri, options, store)
    head = f"{operation[:1].upper()}{operation[1:]} of table {table_uri} failed"
    answer = _answer(exc)
    if fault == "authentication":
        text = (
            f"{head}: the store did not accept the credentials ({answer}). They came from {credentials}: "
            f"check {_KEYS[store]}."
        )
    elif fault == "permission":
        # A 403 with a permission code means the key was checked and lacks the grant; a bare 403 (a HEAD
        # answer has no body, and pyarrow calls it ACCESS_DENIED anyway) may also be a wrong key.
        checked = _codes(exc) & _PERMISSION_CODES and "no response body" not in str(exc).lower()
        verdict = "may not do this" if checked else "are wrong or may not do this"
        text = (
            f"{head}: the store refused the request ({answer}): the credentials from {credentials} "
            f"{verdict}. Check that they may {_GRANTS[store]}."
        )
    elif fault == "missing container":
        text = (
            f"{head}: the {_CONTAINER[store]} {_container(table_uri)!r} does not exist ({answer}). Check the "
            f"URI, the endpoint and the account. The credentials came from {credentials}."
        )
    elif fault == "throttled":
        text = (
            f"{head}: the store is throttling requests ({answer}), after the client's own retries. Spread "
            f"the runs out or ask for a higher request rate. The credentials came from {credentials}."
        )
    elif fault == "network":
        text = (
            f"{head}: the store could not be reached or failed ({answer}) at {_endpoint(options, store)}, "
            "after the client's own retries. Check the endpoint and the network from the driver and the "
            f"executors to the store. The credentials came from {credentials}."
        )
    else:
        cause = f"{type(exc).__name__}: {_first_line(exc)}"
        text = f"{head}. Check {_check(exc, store)}. The credentials came from {credentials}. Cause: {cause}"
    text += f" {note}" if note else ""
    return _FAULTS.get(fault or "", TableStorageError)(redacted(text, storage_options))


@contextmanager
def storage_errors(
    table_uri: str, operation: str, storage_options: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Turn the store's errors (obstore's, OSError) inside the block into :class:`TableStorageError`."""
    from obstore.exceptions import BaseError as StoreError

    try:
        yield
    except (StoreError, OSError) as exc:
        raise storage_failure(table_uri, operation, exc, storage_options) from exc


_KEYS = {
    "s3": "the access key id and secret access key (and the session token of temporary credentials)",
    "azure": "the account name with its account key, SAS token or service principal (client id, secret, "
    "tenant)",
    "gcs": "the service account key",
}
_GRANTS = {
    "s3": "list, read and write the table's objects (s3:ListBucket, s3:GetObject, s3:PutObject)",
    "azure": "list, read and write the container's blobs (Storage Blob Data Contributor, or a SAS token with "
    "read, write and list)",
    "gcs": "list, read and write the bucket's objects (roles/storage.objectUser)",
}
_CONTAINER = {"s3": "bucket", "azure": "container", "gcs": "bucket"}
_ENDPOINT_KEYS = ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint", "azure_storage_endpoint",
                  "azure_endpoint", "google_base_url")  # fmt: skip
_DEFAULT_ENDPOINTS = {
    "s3": "the region's default S3 endpoint",
    "azure": "the account's default endpoint",
    "gcs": "storage.googleapis.com",
}
_ENVIRONMENT = {
    "s3": "the environment of the driver and executors (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) or their "
    "instance role (storage_options hold no key)",
    "azure": "the environment of the driver and executors (AZURE_STORAGE_*) or their managed identity "
    "(storage_options hold no key)",
    "gcs": "the environment of the driver and executors (GOOGLE_APPLICATION_CREDENTIALS) or their service "
    "account (storage_options hold no key)",
}


def _credentials_source(table_uri: str, options: Mapping[str, str], store: str) -> str:
    key = _uri_key(table_uri)
    for uri, text in _NAMED_CREDENTIALS.get().items():
        if key == uri or key.startswith(uri + "/") or uri.startswith(key + "/"):
            return text
    secret_keys = sorted(k for k, v in options.items() if v and is_secret_option(k))
    if secret_keys:
        return f"storage_options ({', '.join(secret_keys)})"
    return _ENVIRONMENT[store]


def _check(exc: BaseException, store: str) -> str:
    """What to check for a failure of no known kind (a missing object among them)."""
    if isinstance(exc, FileNotFoundError) or type(exc).__name__ == "NotFoundError":
        return "that the bucket (or container) and the table path exist"
    return (
        f"the endpoint and the credentials, that the {_CONTAINER[store]} exists and that the credentials "
        "may access the table"
    )


def _answer(exc: BaseException) -> str:
    """What the store answered, as short as it goes: ``403 Forbidden, SignatureDoesNotMatch``."""
    text = _ANSI.sub("", str(exc))
    parts: list[str] = []
    named = _STATUS.search(text)
    numbered = _HTTP_STATUS.search(text)
    if named is not None:
        parts.append(named.group(0))
    elif numbered is not None:
        parts.append(f"HTTP {next(s for s in numbered.groups() if s)}")
    code = next((c for match in _CODE.finditer(text) for c in match.groups() if c), None)
    if code is not None:
        parts.append(code)
    if not parts:
        lowered = text.lower()
        parts.append(next((p for p in _NETWORK_PHRASES if p in lowered), _first_line(exc)))
    return ", ".join(parts)


def _codes(exc: BaseException) -> set[str]:
    text = _ANSI.sub("", str(exc))
    return {_normal(code) for match in _CODE.finditer(text) for code in match.groups() if code}


def _statuses(text: str) -> set[str]:
    found = {m.group(1) for m in _STATUS.finditer(text)}
    found |= {s for m in _HTTP_STATUS.finditer(text) for s in m.groups() if s}
    return found


def _endpoint(options: Mapping[str, str], store: str) -> str:
    for key, value in options.items():
        if key.lower() in _ENDPOINT_KEYS and value:
            return str(value)
    return _DEFAULT_ENDPOINTS[store]


def _container(table_uri: str) -> str:
    netloc = urlsplit(table_uri).netloc
    return netloc.split("@", 1)[0]


def _uri_key(uri: str) -> str:
    parts = urlsplit(uri.rstrip("/"))
    scheme = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}.get(parts.scheme.lower(), parts.scheme.lower())
    return f"{scheme}://{parts.netloc}{parts.path}" if scheme else uri.rstrip("/")


def _first_line(exc: BaseException) -> str:
    return (_ANSI.sub("", str(exc)).strip().splitlines() or [type(exc).__name__])[0]


def _normal(code: str) -> str:
    return code.replace("_", "").lower()
