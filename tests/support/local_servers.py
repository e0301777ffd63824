"""What the tests' own servers share (moto's S3, Azurite, Spark's standalone daemons): a free port on
127.0.0.1, waiting until a server listens there, and stopping its process."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

__all__ = ["free_port", "stop_process", "wait_for_port"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(
    port: int, process: subprocess.Popen[bytes], *, name: str, timeout: float, output: Callable[[], str] = str
) -> None:
    """Wait until ``process`` listens on 127.0.0.1:``port``: a TCP probe, no request (moto counts its first
    unauthenticated requests). Raises, with the process's ``output``, if it exits or does not listen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode} before listening: {output()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within {timeout} s")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """Terminate ``process`` (by its PID), killing it if it does not exit within 10 s."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
