"""Which storage options hold secrets: stdlib only, so the provider's import of the job stays light."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote

__all__ = ["is_secret_option", "redacted"]

# Words (and endings) of storage option keys whose values are secrets: never shown in a message, a log
# record, XCom or on a command line. Shared by the job's masking and the operator's deploy-mode checks.
_SECRET_WORDS = (
    "secret", "token", "password", "sas", "signature", "credential", "account_key", "private", "master_key",
    "encryption_key",
)  # fmt: skip
_SECRET_SUFFIXES = ("access_key",)
# A SAS token's signature wherever a request URL shows it: object_store redacts its URLs, but pyarrow's
# Azure errors may quote them, with the token re-encoded, so the option's value may not appear verbatim.
_SAS_SIGNATURE = re.compile(r"(?i)\b(sig=)[^&\s\"'<>]+")


def is_secret_option(key: str) -> bool:
    """Whether the storage option ``key`` holds a secret (its value is never shown)."""
    name = key.lower()
    return any(word in name for word in _SECRET_WORDS) or name.endswith(_SECRET_SUFFIXES)


def redacted(text: str, storage_options: Mapping[str, str] | None) -> str:
    """``text`` with the values of secret storage options (keys, tokens, passwords) masked, also
    percent-encoded, and any SAS signature (``sig=...``) masked whatever options are given."""
    for key, value in (storage_options or {}).items():
        if value and len(value) >= 4 and is_secret_option(key):
            for form in {value, quote(value, safe=""), quote(value, safe="/=&")}:
                text = text.replace(form, "***")
    return _SAS_SIGNATURE.sub(r"\1***", text)
