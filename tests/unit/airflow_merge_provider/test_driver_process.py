"""DriverRef: a detached driver named across processes, and whether it still runs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from airflow_merge_provider.driver_process import DriverRef, driver_state, process_start_ticks, stop_driver


def _sleeper() -> subprocess.Popen[bytes]:
    # A group leader with a child, as spark-submit (the JVM) with its Python driver.
    child = "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
    code = f"import subprocess, sys, time; {child}; time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _ref(process: subprocess.Popen[bytes]) -> DriverRef:
    return DriverRef.of_process(process.pid, app_id="a", app_version=2, driver_log="/nowhere.log")


def test_round_trip_and_identity() -> None:
    ref = DriverRef("a", 2, 123, "host", "boot", 99, "/tmp/x.log", "/tmp/spec.json")
    assert DriverRef.from_dict(ref.to_dict()) == ref
    assert ref.is_for("a", 2)
    assert not ref.is_for("a", 3)
    with pytest.raises(ValueError, match="not a merge driver ref"):
        DriverRef.from_dict({"pid": 1})


def test_a_running_driver_then_stopped_with_its_process_group() -> None:
    process = _sleeper()
    ref = _ref(process)
    try:
        assert ref.start_ticks == process_start_ticks(process.pid)
        assert driver_state(ref) == "running"
        assert stop_driver(ref) is True
        process.wait(timeout=10)
    finally:
        process.kill()
    assert driver_state(ref) == "exited"
    assert stop_driver(ref) is False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the group's other member got the signal too
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the driver's child outlived stop_driver")


def test_an_unreaped_exited_driver_and_a_reused_pid_are_exited() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = _ref(process)
    deadline = time.monotonic() + 10
    while driver_state(ref) == "running" and time.monotonic() < deadline:
        time.sleep(0.05)  # a zombie until waited for
    assert driver_state(ref) == "exited"
    process.wait()
    myself = DriverRef.of_process(os.getpid(), app_id="a", app_version=0, driver_log="x")
    assert driver_state(myself) == "running"
    assert driver_state(dataclasses.replace(myself, start_ticks=(myself.start_ticks or 0) + 1)) == "exited"


def test_a_driver_of_another_host_or_boot() -> None:
    myself = DriverRef.of_process(os.getpid(), app_id="a", app_version=0, driver_log="x")
    assert driver_state(dataclasses.replace(myself, host="elsewhere.example")) == "elsewhere"
    assert stop_driver(dataclasses.replace(myself, host="elsewhere.example")) is False
    if myself.boot_id is not None:
        assert driver_state(dataclasses.replace(myself, boot_id="another-boot")) == "exited"
