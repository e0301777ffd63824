"""The test tiers are told by what a test uses: the markers tests/conftest.py applies, checked on this run's
own tests, and the guard that keeps the fast tier free of JVMs and servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import (
    INTEGRATION_DIR,
    INTEGRATION_FIXTURES,
    SHARED_SERVER_FIXTURES,
    SPARK_FIXTURES,
    fixtures_of,
    server_group,
)


def test_every_collected_test_carries_the_markers_of_what_it_uses(request: pytest.FixtureRequest) -> None:
    wrong = []
    for item in request.session.items:
        fixtures = fixtures_of(item)
        markers = {m.name for m in item.iter_markers()}
        if fixtures & SPARK_FIXTURES and "spark" not in markers:
            wrong.append(f"{item.nodeid}: uses the SparkSession, not marked spark")
        integration = fixtures & INTEGRATION_FIXTURES or INTEGRATION_DIR in Path(str(item.path)).parents
        if integration and "integration" not in markers:
            wrong.append(f"{item.nodeid}: starts a server or is under tests/integration, not integration")
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        if fixtures & SHARED_SERVER_FIXTURES and groups != [server_group(fixtures)]:
            wrong.append(f"{item.nodeid}: uses a shared server outside the {server_group(fixtures)} group")
    assert wrong == []
    assert request.node.get_closest_marker("spark") is None  # this test itself is in the fast tier


def test_a_merge_on_each_session_kind_is_marked_and_grouped_by_its_kind() -> None:
    def item(kind: str) -> Any:
        callspec = SimpleNamespace(params={"merge_spark": kind})
        return SimpleNamespace(fixturenames=["merge_spark", "tmp_path"], callspec=callspec)

    assert fixtures_of(item("classic")) == {"merge_spark", "tmp_path", "spark"}
    assert server_group(fixtures_of(item("classic"))) is None
    assert fixtures_of(item("connect")) == {"merge_spark", "tmp_path", "connect_server"}
    assert server_group(fixtures_of(item("connect")) | {"s3_server"}) == "spark-connect"


def test_a_fast_test_cannot_start_a_jvm() -> None:
    with pytest.raises(AssertionError, match="starts 'java' but is in the fast tier"):
        subprocess.Popen(["java", "-version"])
    with pytest.raises(AssertionError, match="starts 'spark-submit' but is in the fast tier"):
        subprocess.Popen("spark-submit --version", shell=True)


def test_a_fast_test_may_start_python_and_a_fake_it_wrote(tmp_path: Path) -> None:
    fake = tmp_path / "spark-submit"
    fake.write_text(f"#!{sys.executable}\nprint('fake')\n", encoding="utf-8")
    fake.chmod(0o755)
    assert subprocess.run([str(fake)], capture_output=True, text=True, check=True).stdout == "fake\n"
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout == "1\n"


def test_the_connect_servers_tests_form_their_own_group() -> None:
    assert server_group({"connect_server", "s3_server"}) == "spark-connect"
    assert server_group({"s3_server", "standalone_cluster"}) == "shared-servers"
    assert server_group({"spark", "tmp_path"}) is None
