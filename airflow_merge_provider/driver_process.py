"""A merge driver started detached: how to name it across processes, and whether it still runs.

A detached spark-submit (client deploy mode) runs in its own session, with its output in a log file, so it
outlives the task that started it. :class:`DriverRef` is what a task records to find it again: in the task
state store (a retry reconnects), in a trigger (the triggerer watches it), or in XCom (fire and forget).
A pid alone could name another process after a reboot or once reused, so the ref also holds the host, the
kernel's boot id and the process's start time (Linux ``/proc``); off Linux only the host and pid are
compared.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DriverRef",
    "DriverState",
    "driver_state",
    "process_start_ticks",
    "remove_spec_file",
    "stop_driver",
]

DriverState = Literal["running", "exited", "elsewhere"]


@dataclass(frozen=True)
class DriverRef:
    """A detached spark-submit of one merge.

    :param app_id: the merge's idempotency key (``txn.appId``), to tell a stale ref from this merge's.
    :param app_version: ... and its version.
    :param pid: spark-submit's pid, also its process group (it leads its own session).
    :param host: the host it runs on (``socket.gethostname()``).
    :param boot_id: the kernel's boot id when started (None off Linux).
    :param start_ticks: the process's start time in clock ticks since boot (None off Linux).
    :param driver_log: the file holding spark-submit's and the driver's output.
    :param spec_file: the private spec file the driver reads, removed once it has exited (None when the
        spec travelled on the command line).
    """

    app_id: str
    app_version: int
    pid: int
    host: str
    boot_id: str | None
    start_ticks: int | None
    driver_log: str
    spec_file: str | None = None

    @classmethod
    def of_process(
        cls, pid: int, *, app_id: str, app_version: int, driver_log: str, spec_file: str | None = None
    ) -> DriverRef:
        """The ref of ``pid``, a process of this host started just now."""
        return cls(app_id=app_id, app_version=app_version, pid=pid, host=socket.gethostname(),
                   boot_id=_boot_id(), start_ticks=process_start_ticks(pid), driver_log=driver_log,
                   spec_file=spec_file)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """JSON form (task state store, trigger kwargs)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DriverRef:
        """Inverse of :meth:`to_dict`.

        :raises ValueError: ``data`` is not a ref (e.g. written by another version of the provider).
        """
        try:
            return cls(
                app_id=str(data["app_id"]), app_version=int(data["app_version"]), pid=int(data["pid"]),
                host=str(data["host"]), boot_id=_optional(data.get("boot_id"), str),
                start_ticks=_optional(data.get("start_ticks"), int), driver_log=str(data["driver_log"]),
                spec_file=_optional(data.get("spec_file"), str),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a merge driver ref: {dict(data)!r} ({error})") from None

    def is_for(self, app_id: str | None, app_version: int | None) -> bool:
        """Whether this ref is the driver of the merge ``(app_id, app_version)``."""
        return (self.app_id, self.app_version) == (app_id, app_version)


def driver_state(ref: DriverRef) -> DriverState:
    """``running``, ``exited`` (also: reaped, a zombie, or its pid now names another process), or
    ``elsewhere``: it was started on another host (or before a reboot of this one), where this process
    cannot look."""
    if ref.host != socket.gethostname():
        return "elsewhere"
    boot_id = _boot_id()
    if ref.boot_id is not None and boot_id is not None and ref.boot_id != boot_id:
        return "exited"  # this host rebooted since: every process of that boot is gone
    try:
        os.kill(ref.pid, 0)
    except ProcessLookupError:
        return "exited"
    except PermissionError:
        pass  # a process of another user: the start time tells whether it is still ours
    if ref.start_ticks is not None and process_start_ticks(ref.pid) != ref.start_ticks:
        return "exited"
    return "exited" if _process_state(ref.pid) == "Z" else "running"


def stop_driver(ref: DriverRef, *, sig: int = signal.SIGTERM) -> bool:
    """Signal the driver's process group (spark-submit and the Python driver it started); False when it is
    not running here."""
    if driver_state(ref) != "running":
        return False
    try:
        os.killpg(ref.pid, sig)
    except ProcessLookupError:
        return False
    return True


def remove_spec_file(ref: DriverRef) -> None:
    """Remove the driver's private spec file, on the host it was written on (it may hold credentials)."""
    if ref.spec_file is not None and ref.host == socket.gethostname():
        Path(ref.spec_file).unlink(missing_ok=True)


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``: start time in clock ticks since boot (None off Linux, or gone)."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def _process_state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return None if fields is None else fields[0]


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` from the third on (after the command name, which may hold
    spaces)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return None


def _optional(value: Any, kind: type[Any]) -> Any:
    return None if value is None else kind(value)
