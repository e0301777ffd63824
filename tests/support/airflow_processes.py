"""Airflow's components (scheduler, dag-processor, triggerer, api-server) as real processes, for tests that
need a deployed Airflow rather than ``airflow dags test``: each in its own session with its own log file,
stopped by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["AirflowProcesses", "airflow_binary", "kill_session", "stop_process_group"]


def airflow_binary() -> Path:
    """The ``airflow`` command of this interpreter's environment."""
    return Path(sys.executable).with_name("airflow")


class AirflowProcesses:
    """Run ``airflow`` commands with ``env``; long-running components are started with :meth:`start`.

    Use it as a context manager: leaving it stops every started component by its PID (SIGTERM, then
    SIGKILL of its process group after ``stop_timeout``), also when the body raised. Each component's
    output goes to ``<log_dir>/<name>.log``; :meth:`tails` gives the end of them for assertion messages.
    """

    def __init__(self, log_dir: Path, *, env: Mapping[str, str], stop_timeout: float = 20) -> None:
        self.log_dir = log_dir
        self.env = dict(env)
        self.stop_timeout = stop_timeout
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> AirflowProcesses:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def run(self, name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``airflow <args>`` to completion; its output is kept in ``<name>.log`` too."""
        result = subprocess.run([str(airflow_binary()), *args], env=self.env, capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
        self.log(name).write_text(
            f"$ airflow {' '.join(args)}\n{result.stdout}{result.stderr}", encoding="utf-8"
        )
        return result

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start ``airflow <args>`` in its own session (so that its children can be stopped with it)."""
        if name in self.processes:
            raise ValueError(f"{name} is already started")
        with self.log(name).open("wb") as log:
            process = subprocess.Popen([str(airflow_binary()), *args], env=self.env, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)  # fmt: skip
        self.processes[name] = process
        return process

    def check_running(self) -> None:
        """Raise, with the logs' tails, if a started component has exited."""
        exited = {name: p.returncode for name, p in self.processes.items() if p.poll() is not None}
        if exited:
            raise RuntimeError(f"Airflow components exited: {exited}\n{self.tails(*exited)}")

    def tail(self, name: str, chars: int = 4000) -> str:
        path = self.log(name)
        if not path.exists():
            return f"--- {name}: no log ---"
        return f"--- {name} ({path}) ---\n" + path.read_text(encoding="utf-8", errors="replace")[-chars:]

    def tails(self, *names: str, chars: int = 4000) -> str:
        """The end of the named components' logs (all started ones when none is named)."""
        return "\n".join(self.tail(name, chars) for name in (names or tuple(self.processes)))

    def stop_all(self) -> None:
        """SIGTERM every component at once (each waits for its own children: the triggerer gives its
        triggers 10 s), then SIGKILL the process group of any still running after ``stop_timeout``."""
        processes, self.processes = list(self.processes.values()), {}
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for process in processes:
            stop_process_group(process, timeout=max(0.0, deadline - time.monotonic()))


def stop_process_group(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    """SIGTERM ``process`` (a session leader), SIGKILL its process group if it has not exited within
    ``timeout``, then SIGKILL whatever of the group outlived it (workers it forked)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def kill_session(pid: int, *, command_contains: str, timeout: float = 10) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``, the process group of ``pid``, a process that is not this
    process's child (one that started its own session), if it still runs a command line containing
    ``command_contains`` (not a process that reused the PID). Returns whether it was running."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        group = os.getpgid(pid)
    except (OSError, ProcessLookupError):
        return False
    if command_contains not in command or group == os.getpgrp():
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    return True
