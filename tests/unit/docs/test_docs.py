"""The documentation against the code it describes: the XCom contract, the Spark connections, every error,
the navigation, the charts, the Docker Compose commands, and the README's first steps.

``scripts/test`` builds the site with ``mkdocs build --strict`` (links, anchors, the API reference); these
tests check what the build cannot, and need no JVM, no server and no network.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_merge_provider.metrics import to_xcom
from tests.support.error_classes import error_classes_named_in

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
ERROR_MODULES = (
    ROOT / "airflow_merge_provider" / "errors.py",
    ROOT / "spark_jobs" / "delta_merge" / "errors.py",
)
PACKAGES = (ROOT / "airflow_merge_provider", ROOT / "spark_jobs")


def _section(page: Path, title: str) -> str:
    """The text of the ``## title`` section of a page, up to the next ``## `` heading."""
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the first markdown table in ``section``."""
    lines = []
    for line in section.splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[2:]]


def _code(cell: str) -> str:
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"expected one `code` span, found {cell!r}"
    return match[1]


# -- the XCom table ------------------------------------------------------------------------------------------


def test_the_xcom_table_lists_exactly_the_keys_and_types_the_operator_pushes() -> None:
    rows = _table_rows(_section(DOCS / "xcom.md", "The XCom return value"))
    documented = {_code(key): kind for key, kind, _meaning in rows}

    pushed = to_xcom({}, app_id="airflow:dag.task:run", app_version=0)

    assert len(documented) == len(rows), "a key is documented twice"
    assert set(documented) == set(pushed)
    python_names = {int: "int", str: "str", bool: "bool", dict: "dict", list: "list"}
    assert documented == {key: python_names[type(value)] for key, value in pushed.items()}


def test_the_readme_s_metrics_are_real_xcom_keys() -> None:
    table = _table_rows(_section(README, "What a merge shows"))
    named = {key for cells in table for key in re.findall(r"`(\w+)`", cells[0])}
    pushed = to_xcom({}, app_id="airflow:dag.task:run", app_version=0)
    assert named
    assert named <= set(pushed), sorted(named - set(pushed))


# -- the Spark connections -----------------------------------------------------------------------------------


def _connection_examples() -> list[tuple[str, str, str]]:
    rows = _table_rows(_section(DOCS / "connections.md", "Spark connections"))
    return [(cluster, _code(connection), modes) for cluster, connection, modes in rows]


def test_the_connections_page_gives_a_connection_for_each_kind_of_master() -> None:
    assert [cluster for cluster, _conn, _modes in _connection_examples()] == [
        "local", "Spark standalone", "YARN", "Kubernetes",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("cluster", "master", "deploy_mode"),
    [
        ("local", "local[*]", "client"),
        ("Spark standalone", "spark://spark-master:7077", "client"),
        ("YARN", "yarn", "cluster"),
        ("Kubernetes", "k8s://https://kubernetes.default.svc:443", "cluster"),
    ],
)
def test_each_documented_connection_resolves_to_its_master(
    cluster: str, master: str, deploy_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.hooks import spark_submit

    from airflow_merge_provider.hooks import merge_into

    if cluster == "Kubernetes":
        # The Kubernetes extra is not part of the test environment; the hook only needs its client to exist.
        monkeypatch.setattr(merge_into, "kubernetes_provider_installed", lambda: True)
        monkeypatch.setattr(spark_submit, "kube_client", object(), raising=False)
    _define_documented_connection(cluster, monkeypatch)

    hook = merge_into.MergeSubmitHook.for_merge(conn_id="docs_example", name="docs")

    assert (hook.master, hook.deploy_mode) == (master, deploy_mode)


def test_a_kubernetes_master_without_its_provider_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_merge_provider.errors import MergeArgumentError
    from airflow_merge_provider.hooks import merge_into

    monkeypatch.setattr(merge_into, "kubernetes_provider_installed", lambda: False)
    _define_documented_connection("Kubernetes", monkeypatch)

    install = "pip install 'airflow-merge-provider[kubernetes]'"
    with pytest.raises(MergeArgumentError, match=re.escape(install)):
        merge_into.MergeSubmitHook.for_merge(conn_id="docs_example", name="docs")
    assert install in (DOCS / "connections.md").read_text(encoding="utf-8")


def _define_documented_connection(cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (connection,) = [conn for name, conn, _modes in _connection_examples() if name == cluster]
    json.loads(connection)  # valid JSON, as AIRFLOW_CONN_* needs it
    monkeypatch.setenv("AIRFLOW_CONN_DOCS_EXAMPLE", connection)


# -- every error on the troubleshooting page -----------------------------------------------------------------


def _sources(*roots: Path) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def _base_names(node: ast.ClassDef) -> set[str]:
    return {base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
            if isinstance(base, (ast.Name, ast.Attribute))}  # fmt: skip


def error_types() -> set[str]:
    """Every class the two errors modules define, and every public class elsewhere in the two packages
    that derives from one of them (by name, as ast sees the bases)."""
    defined = {node.name for path in ERROR_MODULES for node in ast.walk(ast.parse(path.read_text("utf-8")))
               if isinstance(node, ast.ClassDef)}  # fmt: skip
    classes = [node for _path, tree in _sources(*PACKAGES) for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]  # fmt: skip
    found = set(defined)
    grew = True
    while grew:
        more = {node.name for node in classes if _base_names(node) & found}
        grew = not more <= found
        found |= more
    return found


def test_the_scan_finds_both_modules_errors_and_their_subclasses_elsewhere() -> None:
    found = error_types()
    assert {"MergeProviderError", "MergeJobRejectedError", "MergeJobError", "TableStorageError"} <= found
    assert "MaterializedSourceLostError" in found  # defined in source/materialize.py


def test_every_error_type_has_a_heading_on_the_troubleshooting_page() -> None:
    page = TROUBLESHOOTING.read_text(encoding="utf-8")
    headings = set(re.findall(r"^### (\w+)$", page, flags=re.MULTILINE))
    missing = sorted(error_types() - headings)
    assert not missing, f"error types without a '### Name' section in docs/troubleshooting.md: {missing}"


# Delta's and Spark's error classes, found in the source as the error-class tests find them.
def test_every_error_class_the_code_raises_is_on_the_troubleshooting_page() -> None:
    named = {cls: path.relative_to(ROOT).as_posix() for path, tree in _sources(*PACKAGES)
             for cls in error_classes_named_in(tree)}  # fmt: skip
    expected = {"DELTA_MERGE_MISSING_WHEN", "PARSE_SYNTAX_ERROR", "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES"}
    assert expected <= set(named), "the scan finds a literal, a bound name and a class inside a message"
    documented = set(re.findall(r"`([A-Z][A-Z0-9_.]+)`", TROUBLESHOOTING.read_text(encoding="utf-8")))
    missing = sorted(f"{cls} ({module})" for cls, module in named.items() if cls not in documented)
    assert not missing, f"error classes missing from docs/troubleshooting.md: {missing}"


# -- the site: navigation, pages, charts, no network ---------------------------------------------------------


def _mkdocs_config() -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert isinstance(config, dict)
    return config


def _nav_pages(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def test_every_page_in_the_nav_exists_and_every_page_is_in_the_nav() -> None:
    pages = list(_nav_pages(_mkdocs_config()["nav"]))
    assert len(pages) == len(set(pages)), "a page is listed twice"
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that do not exist under docs/: {missing}"
    on_disk = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert on_disk == set(pages), f"pages not in the nav: {sorted(on_disk - set(pages))}"


def test_the_build_fetches_nothing() -> None:
    config = _mkdocs_config()
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}
    # Material's social and privacy plugins download fonts and assets at build time.
    assert plugins <= {"search", "mkdocstrings"}, plugins
    assert config["theme"].get("font") is False, "Material would load Google Fonts"


def test_the_performance_charts_are_the_benchmark_s_own() -> None:
    charts = {path.name: path.read_bytes() for path in (ROOT / "benchmarks" / "charts").glob("*.png")}
    copies = {path.name: path.read_bytes() for path in (DOCS / "img").glob("*.png")}
    assert charts
    assert copies == charts, "docs/img/ must hold copies of benchmarks/charts/*.png (copy them again)"
    performance = (DOCS / "performance.md").read_text(encoding="utf-8")
    assert set(re.findall(r"\]\(img/([^)]+\.png)\)", performance)) == set(charts)


# -- the Docker Compose page ---------------------------------------------------------------------------------


def test_the_compose_page_names_real_services_dags_and_ports() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text(encoding="utf-8"))
    services: dict[str, Any] = compose["services"]
    dag_ids = {found[1] for path in (ROOT / "dags_examples").glob("*.py")
               for found in re.finditer(r'dag_id="(\w+)"', path.read_text(encoding="utf-8"))}  # fmt: skip
    page = (DOCS / "docker-compose.md").read_text(encoding="utf-8")
    commands = [line.strip() for line in page.splitlines() if line.strip().startswith("docker compose ")]
    commands += re.findall(r"`(docker compose [^`]+)`", page)
    assert any(command.startswith("docker compose up") for command in commands)
    for command in commands:
        words = command.split()
        if words[2] in ("exec", "run"):
            service = next(word for word in words[3:] if not word.startswith("-"))
            assert service in services, command
            if "dags" in words:
                assert words[words.index("dags") + 2] in dag_ids, command
        elif words[2] in ("logs", "restart", "stop", "start"):
            assert {word for word in words[3:] if not word.startswith("-")} <= set(services), command
    published = {int(str(port).split(":")[-2]) for service in services.values()
                 for port in service.get("ports", [])}  # fmt: skip
    mentioned = {int(port) for port in re.findall(r"localhost:(\d+)", page)}
    assert mentioned, "the page should say where the UIs are"
    assert mentioned <= published, f"ports nothing publishes: {mentioned - published}"


# -- the README ----------------------------------------------------------------------------------------------


def test_the_readme_stays_a_first_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 260, f"README.md has {len(lines)} lines: move reference material to docs/"
    code_lines = {line.strip() for line in lines}
    assert "scripts/test" in code_lines, "the README must give CI's test command on a line of its own"
    assert "scripts/run-example" in code_lines


def test_the_readme_s_links_into_the_docs_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert links
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"README links to missing pages: {missing}"
