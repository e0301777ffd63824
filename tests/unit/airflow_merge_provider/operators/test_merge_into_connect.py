"""MergeIntoOperator on a spark_connect connection, without a server: the modes it cannot run are refused
before anything runs, and a server that does not answer is named, never its token."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from airflow_merge_provider.errors import MergeProviderError, MergeSpecInvalidError
from airflow_merge_provider.hooks.merge_connect import MergeConnectHook, is_connect_connection
from tests.support.operator_helpers import merge_operator, runtime_context

TOKEN = "token-that-must-never-show-0f3a"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def connect_conn(monkeypatch: pytest.MonkeyPatch) -> int:
    port = _closed_port()
    conn = {"conn_type": "spark_connect", "host": "localhost", "port": port, "password": TOKEN,
            "extra": {"max_retries": 0}}  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_TEST", json.dumps(conn))
    return port


@pytest.mark.usefixtures("connect_conn")
@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"deferrable": True}, "deferrable=True"),
        ({"wait_for_completion": False}, "wait_for_completion=False"),
        ({"durable": True}, "durable=True"),
    ],
)
def test_modes_without_a_driver_process_are_refused_on_spark_connect(
    tmp_path: Path, make_context: Any, arguments: dict[str, Any], named: str
) -> None:
    operator = merge_operator(tmp_path, conn_id="spark_connect_test", **arguments)
    with pytest.raises(MergeSpecInvalidError) as refused:
        operator.execute(runtime_context(make_context))
    assert named in str(refused.value)
    assert "'spark_connect_test'" in str(refused.value)
    assert not (tmp_path / "table").exists()


def test_the_connection_type_decides_the_path(connect_conn: int, monkeypatch: pytest.MonkeyPatch) -> None:
    local = {"conn_type": "spark", "host": "local[1]"}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL_TEST", json.dumps(local))
    assert is_connect_connection("spark_connect_test")
    assert not is_connect_connection("spark_local_test")
    assert MergeConnectHook("spark_connect_test").server == f"sc://localhost:{connect_conn}"


def test_a_server_that_does_not_answer_is_named_without_its_token(connect_conn: int) -> None:
    hook = MergeConnectHook("spark_connect_test")
    with pytest.raises(MergeProviderError) as unreachable, hook.session():
        pass
    message = str(unreachable.value)
    assert f"sc://localhost:{connect_conn}" in message
    assert "'spark_connect_test'" in message
    assert TOKEN not in message
    assert unreachable.value.__cause__ is None  # not chained: pyspark's error may repeat the channel's URL


def test_leases_hand_each_merge_a_slot_of_its_own_and_keep_its_session(tmp_path: Path) -> None:
    from airflow_merge_provider.hooks.merge_connect import _leased_session_id

    key = f"test-{tmp_path.name}"
    with _leased_session_id(key, 2) as first:
        assert first is not None
        with _leased_session_id(key, 2) as second, _leased_session_id(key, 2) as third:
            assert second is not None
            assert second.session_id != first.session_id
            assert third is None  # every slot is leased: the merge opens a session of its own
        kept = first.session_id
    with _leased_session_id(key, 2) as again:
        assert again is not None
        assert again.session_id == kept  # the server's session, and its warm Python workers, are reused
        again.renew()  # the server no longer had it
        renewed = again.session_id
    with _leased_session_id(key, 2) as after:
        assert after is not None
        assert after.session_id == renewed != kept
    with _leased_session_id(key, 0) as none:
        assert none is None
