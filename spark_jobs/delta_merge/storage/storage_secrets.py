"""Which storage options hold secrets: stdlib only, so the provider's import of the job stays light."""

from __future__ import annotations

__all__ = ["is_secret_option"]

# Words (and endings) of storage option keys whose values are secrets: never shown in a message, a log
# record, XCom or on a command line. Shared by the job's masking and the operator's deploy-mode checks.
_SECRET_WORDS = (
    "secret", "token", "password", "sas", "signature", "credential", "account_key", "private", "master_key",
    "encryption_key",
)  # fmt: skip
_SECRET_SUFFIXES = ("access_key",)


def is_secret_option(key: str) -> bool:
    """Whether the storage option ``key`` holds a secret (its value is never shown)."""
    name = key.lower()
    return any(word in name for word in _SECRET_WORDS) or name.endswith(_SECRET_SUFFIXES)
