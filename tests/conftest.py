"""Shared fixtures (one local SparkSession with Delta loaded and one standalone cluster per test session,
temp table roots), and the test tiers: each test is marked by what it uses, and a fast test cannot start a
JVM or a server.

- ``spark``: the test uses the shared SparkSession (the ``spark`` fixture, directly or through another).
- ``integration``: the test lives under ``tests/integration/`` (real spark-submit, the airflow CLI, an
  Airflow deployment, object-store servers) or uses a fixture that starts a server or a cluster.
- the rest is the fast tier (``scripts/test --fast``): no JVM, no server, no ``airflow`` process.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest_plugins = ["tests.support.airflow_fixtures", "tests.support.object_store_fixtures"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.support.connect_server import ConnectServer
    from tests.support.standalone_cluster import StandaloneCluster


def _spark_builder() -> Any:
    from pyspark.sql import SparkSession

    from tests.support.delta_spark import delta_session_confs
    from tests.support.jvm import fast_jvm_options

    builder = SparkSession.builder
    # Delta's extension and catalog (tests/support/delta_spark.py), as on a cluster that has Delta: every
    # test of the job runs in such a session (the job runs there unchanged), and Delta's own MERGE, the
    # reference, runs beside it. The job's runs without Delta are its spark-submits and the example.
    for key, value in delta_session_confs().items():
        builder = builder.config(key, value)
    return (
        builder.master("local[2]")
        .appName("airflow-merge-provider-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        # Tables registered in the session's catalog (Delta's MERGE of a scenario) put their database here,
        # not in the working directory.
        .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="spark-warehouse-"))
        # The JIT's first tier, the serial collector and the class archive (tests/support/jvm.py): the
        # suite is CPU-bound on 2 cores (the Spark unit tests of analysis/ and merge/ took 150 s instead of
        # 197 s on two workers with the first two).
        .config("spark.driver.extraJavaOptions", fast_jvm_options())
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        # Test data is tiny: compiling generated code for each new query costs more than it saves.
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one SparkSession of the test session (a cold start costs ~8 s, so it is shared)."""
    from tests.support.connect_server import connect_mode

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Classic, even when the first test to ask for it is a Connect test inside connect_mode (a [connect]
    # case asking for a conf fixture): there the builder would try to open a Connect session.
    with connect_mode(enabled=False):
        session = _spark_builder().getOrCreate()
        session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
    # py4j closes its last connections at interpreter exit, logging at INFO through handlers whose streams
    # pytest has closed by then ("--- Logging error ---"): nothing of it is worth a line.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One Spark standalone master with two workers for the test session's cluster tests (three JVM
    daemons: started once). A test that kills a worker starts a replacement before it returns."""
    from tests.support.standalone_cluster import StandaloneCluster

    with StandaloneCluster(tmp_path_factory.mktemp("standalone")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """The one Spark Connect server of the test session (``local[2]``, with a token), stopped by PID."""
    from tests.support.connect_server import ConnectServer

    with ConnectServer(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


@pytest.fixture(scope="session")
def connect_client(connect_server: ConnectServer) -> Iterator[Any]:
    from tests.support.connect_server import connect_mode

    with connect_mode():
        session = connect_server.session()
    yield session
    with connect_mode():
        session.stop()


@pytest.fixture
def connect_spark(connect_client: Any) -> Iterator[Any]:
    """A Spark Connect session on :func:`connect_server` with the job added as an artifact; pyspark's
    functions build Connect columns for the test's duration (then classic ones again)."""
    from tests.support.connect_server import connect_mode

    with connect_mode():
        yield connect_client


# The two kinds of session a merge runs on. A test that takes ``merge_spark`` runs once on each; the
# classic run is told by its parameter to use ``spark``, the Connect run ``connect_server`` (fixtures_of).
SESSION_KINDS = {"classic": "spark", "connect": "connect_spark"}


@pytest.fixture(params=list(SESSION_KINDS))
def merge_spark(request: pytest.FixtureRequest) -> Any:
    """The test's session: the shared classic SparkSession, or a Spark Connect session on the test
    session's server (pyspark building Connect columns for the test's duration). Conf fixtures
    (``copy_on_write``, ``copy_by_position``) set their conf on this session."""
    return request.getfixturevalue(SESSION_KINDS[request.param])


def _conf_session(request: pytest.FixtureRequest) -> Any:
    """The session a conf fixture sets its conf on: the test's ``merge_spark`` if it has one. (The conf
    fixtures take ``spark`` too: a test that uses one is a Spark test, whichever session it merges on.)"""
    return request.getfixturevalue("merge_spark" if "merge_spark" in request.fixturenames else "spark")


@pytest.fixture
def table_root(tmp_path: Path) -> Path:
    """A fresh directory for one Delta table."""
    path = tmp_path / "table"
    path.mkdir()
    return path


@pytest.fixture
def copy_on_write(spark: SparkSession, request: pytest.FixtureRequest) -> Iterator[None]:
    """Merges rewrite touched files even where the table enables deletion vectors (Delta's conf off)."""
    from spark_jobs.delta_merge.merge.deletion_vector_updates import PERSISTENT_DELETION_VECTORS_CONF

    session = _conf_session(request)
    session.conf.set(PERSISTENT_DELETION_VECTORS_CONF, "false")
    yield
    session.conf.unset(PERSISTENT_DELETION_VECTORS_CONF)


@pytest.fixture
def copy_by_position(spark: SparkSession, request: pytest.FixtureRequest) -> Iterator[None]:
    """Copy-on-write merges copy the unchanged rows of touched files by position, however small they are."""
    from spark_jobs.delta_merge.merge.copy_by_position import COPY_BY_POSITION_CONF

    session = _conf_session(request)
    session.conf.set(COPY_BY_POSITION_CONF, "0")
    yield
    session.conf.unset(COPY_BY_POSITION_CONF)


# -- test tiers ----------------------------------------------------------------------------------------

INTEGRATION_DIR = ROOT / "tests" / "integration"
SPARK_FIXTURES = frozenset({"spark"})
# Fixtures that start a server, a cluster or an Airflow metadata database.
INTEGRATION_FIXTURES = frozenset(
    {"standalone_cluster", "s3_server", "azurite", "airflow_home", "connect_server"}
)
# Programs a fast test must not start: a JVM (Spark) or a server. A fake spark-submit (a Python script)
# and the Python interpreter itself are fine.
_HEAVY_PROGRAMS = frozenset({
    "java", "spark-submit", "spark-class", "pyspark", "airflow", "moto_server", "azurite", "azurite-blob",
    "postgres", "pg_ctl", "initdb", "node", "npm", "docker",
})  # fmt: skip


def fixtures_of(item: pytest.Item) -> set[str]:
    """The fixtures a test uses, with the session a ``merge_spark`` parameter stands for (``spark``, or
    ``connect_server``: its fixtures are asked for only when the test runs)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    kind = getattr(getattr(item, "callspec", None), "params", {}).get("merge_spark")
    if kind == "classic":
        fixtures.add("spark")
    elif kind == "connect":
        fixtures.add("connect_server")
    return fixtures


def tiers_of(item: pytest.Item) -> set[str]:
    """The markers a test gets from where it lives and the fixtures it uses."""
    fixtures = fixtures_of(item)
    tiers = set()
    if fixtures & SPARK_FIXTURES:
        tiers.add("spark")
    if fixtures & INTEGRATION_FIXTURES or INTEGRATION_DIR in Path(str(item.path)).parents:
        tiers.add("integration")
    return tiers


# Under pytest-xdist (scripts/test runs two workers, one a core), the tests of the session-wide servers and
# cluster run on one worker, so that each is started once per run; every other test goes to whichever
# worker is free. Each worker that runs a Spark test has the one SparkSession of its own test session.
SHARED_SERVER_FIXTURES = frozenset({"standalone_cluster", "s3_server", "azurite", "connect_server"})
SHARED_SERVERS_GROUP = "shared-servers"
# The Spark Connect server's tests form a group of their own, so that they can run beside the other
# servers' (each group stays on one worker, which starts its servers once). A test that uses the Connect
# server and another server runs in this group: that worker starts the other server too.
CONNECT_GROUP = "spark-connect"


def server_group(fixtures: set[str]) -> str | None:
    """The xdist group of a test that uses ``fixtures``: None when it uses no shared server."""
    if "connect_server" in fixtures:
        return CONNECT_GROUP
    return SHARED_SERVERS_GROUP if fixtures & SHARED_SERVER_FIXTURES else None


# First: pytest-xdist's worker turns the xdist_group marks into scheduling groups in a hook of its own, which
# runs before this file's (an initial conftest, registered earlier) unless this one says tryfirst.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for tier in sorted(tiers_of(item)):
            item.add_marker(tier)
        group = server_group(fixtures_of(item))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup``, pytest-xdist's worker appends each test's group to its id (``...@group``),
    which is how the scheduler keeps a group on one worker. Where it could not (pytest 9.2 with
    pytest-xdist 3.8), each worker would start every shared server of its own: refuse the run instead."""
    if not session.config.getoption("loadgroup", default=False):
        return
    ungrouped = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]  # fmt: skip
    if ungrouped:
        reason = (
            f"pytest-xdist did not group {len(ungrouped)} tests (first: {ungrouped[0]}): with this pytest "
            f"{pytest.__version__} and pytest-xdist, --dist loadgroup would run each shared server's tests "
            "on both workers. Use the versions the dev extra pins (pip install -e '.[dev]')."
        )
        print(reason, file=sys.stderr)  # a worker's exception reaches the controller without its text
        raise pytest.UsageError(reason)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_jvm_and_no_server(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test without a tier marker runs in the fast tier: it fails if it starts a JVM or a server, so a
    test that needs one must say so through its fixtures or its place under tests/integration/."""
    if request.node.get_closest_marker("spark") or request.node.get_closest_marker("integration"):
        yield
        return
    import subprocess

    real_init = subprocess.Popen.__init__
    # Stand-ins a test writes into its own temp directory (a fake spark-submit) are no JVM.
    fakes = str(request.getfixturevalue("tmp_path_factory").getbasetemp())

    def refusing_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        program = os.fsdecode(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
        name = os.path.basename(program).split()[0] if program else ""
        if name in _HEAVY_PROGRAMS and not os.path.abspath(program).startswith(fakes):
            raise AssertionError(
                f"{request.node.nodeid} starts {name!r} but is in the fast tier: use the spark fixture, a "
                "server fixture, or move it under tests/integration/"
            )
        real_init(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = refusing_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real_init  # type: ignore[method-assign]


