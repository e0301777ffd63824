"""The README's reference tables against the code they describe: the XCom contract, the Spark connections."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from airflow_merge_provider.metrics import to_xcom

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _table_rows(section: str) -> list[list[str]]:
    """The cells of each body row of the first markdown table in ``section``."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def _code(cell: str) -> str:
    match = re.fullmatch(r"`([^`]+)`", cell)
    assert match, f"expected one `code` span, found {cell!r}"
    return match[1]


def test_the_xcom_table_lists_exactly_the_keys_and_types_the_operator_pushes() -> None:
    rows = _table_rows(_section("XCom, assets and lineage"))
    documented = {_code(key): kind for key, kind, _meaning in rows}

    pushed = to_xcom({}, app_id="airflow:dag.task:run", app_version=0)

    assert list(documented) == list(dict.fromkeys(documented)), "a key is documented twice"
    assert set(documented) == set(pushed)
    python_names = {int: "int", str: "str", bool: "bool", dict: "dict"}
    assert documented == {key: python_names[type(value)] for key, value in pushed.items()}


def _connection_examples() -> list[tuple[str, str, str]]:
    rows = _table_rows(_section("Running on a cluster"))
    return [(cluster, _code(connection), modes) for cluster, connection, modes in rows]


def test_the_cluster_section_gives_a_connection_for_each_kind_of_master() -> None:
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
    _define_readme_connection(cluster, monkeypatch)

    hook = merge_into.MergeSubmitHook.for_merge(conn_id="readme_example", name="readme")

    assert (hook.master, hook.deploy_mode) == (master, deploy_mode)


def test_a_kubernetes_master_without_its_provider_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_merge_provider.errors import MergeArgumentError
    from airflow_merge_provider.hooks import merge_into

    monkeypatch.setattr(merge_into, "kubernetes_provider_installed", lambda: False)
    _define_readme_connection("Kubernetes", monkeypatch)

    install = "pip install 'airflow-merge-provider[kubernetes]'"
    with pytest.raises(MergeArgumentError, match=re.escape(install)):
        merge_into.MergeSubmitHook.for_merge(conn_id="readme_example", name="readme")


def _define_readme_connection(cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (connection,) = [conn for name, conn, _modes in _connection_examples() if name == cluster]
    json.loads(connection)  # valid JSON, as AIRFLOW_CONN_* needs it
    monkeypatch.setenv("AIRFLOW_CONN_README_EXAMPLE", connection)
