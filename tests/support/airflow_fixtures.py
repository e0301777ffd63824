"""Fixtures for the provider's tests: Airflow contexts without a scheduler, a fake spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

if TYPE_CHECKING:
    from airflow.sdk import Context

ContextFactory = Callable[..., "Context"]

LOCAL_CONN = json.dumps({"conn_type": "spark", "host": "local[2]"})


@pytest.fixture
def spark_local(monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``spark_local`` connection with a local master."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", LOCAL_CONN)
    return "spark_local"


class FakeTaskInstance(SimpleNamespace):
    """What the operators read from ``context["ti"]``."""

    def xcom_pull(self, task_ids: str, **_kwargs: Any) -> Any:
        return self.xcoms.get(task_ids)

    def get_first_reschedule_date(self, _context: Any) -> None:
        return None  # never rescheduled yet


@pytest.fixture
def make_context() -> ContextFactory:
    """A task context: ti, dag_run (clear_number), outlet_events, and the template variables used here."""
    from airflow.sdk.execution_time import macros
    from airflow.sdk.execution_time.context import OutletEventAccessors

    def make(
        *,
        dag_id: str = "dag",
        task_id: str = "merge",
        run_id: str = "scheduled__2024-01-02T00:00:00+00:00",
        map_index: int = -1,
        try_number: int = 1,
        clear_number: int = 0,
        xcoms: dict[str, Any] | None = None,
        variables: dict[str, str] | None = None,
    ) -> Context:
        values = dict(variables or {})
        ti = FakeTaskInstance(
            dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index, try_number=try_number,
            xcoms=dict(xcoms or {}),
        )  # fmt: skip
        context = {
            "ti": ti,
            "task_instance": ti,
            "dag_run": SimpleNamespace(dag_id=dag_id, run_id=run_id, clear_number=clear_number),
            "run_id": run_id,
            "ds": "2024-01-02",
            "ds_nodash": "20240102",
            "macros": macros,
            "var": {"value": SimpleNamespace(get=lambda key, default=None: values.get(key, default))},
            "outlet_events": OutletEventAccessors(),
        }
        return cast("Context", context)

    return make


# A stand-in for spark-submit: records its argv and behaves as FAKE_SUBMIT_MODE says, like the job would.
_FAKE_SUBMIT = """
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_SUBMIT_RECORD"], "a") as record:
    record.write(json.dumps(args) + "\\n")
spec = json.loads(args[args.index("--spec-json") + 1]) if "--spec-json" in args else json.load(
    open(args[args.index("--spec") + 1]))
mode = os.environ.get("FAKE_SUBMIT_MODE", "ok")
metrics = json.loads(os.environ.get("FAKE_SUBMIT_METRICS", "{}"))
print("26/01/01 INFO SparkContext: Running Spark version 4.2.0", file=sys.stderr, flush=True)
if mode in ("commit_then_crash", "commit_silently"):
    sys.path.insert(0, os.environ["FAKE_SUBMIT_HELPERS"])
    from delta_tables import commit_merge
    commit_merge(spec["target"]["uri"], app_id=spec["run"]["app_id"], app_version=spec["run"]["app_version"],
                 metrics={k: v for k, v in metrics.items() if isinstance(v, int)})
if mode == "ok" or mode == "commit_silently":
    if mode == "ok":
        print("MERGE_METRICS_JSON=" + json.dumps(metrics), flush=True)
    sys.exit(0)
if mode == "commit_then_crash":
    print("MERGE failed: RuntimeError: the driver died after committing", file=sys.stderr, flush=True)
    sys.exit(2)
kind = os.environ.get("FAKE_SUBMIT_ERROR", "MergeExecutionError")
print(f"MERGE failed: {kind}: something went wrong", file=sys.stderr, flush=True)
sys.exit(1)
"""


@pytest.fixture
def fake_spark_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fake spark-submit binary; ``.calls()`` lists the argv of each call, ``.mode(...)`` sets behaviour."""
    binary = tmp_path / "fake-spark-submit"
    binary.write_text(f"#!{sys.executable}\n" + textwrap.dedent(_FAKE_SUBMIT), encoding="utf-8")
    binary.chmod(0o755)
    record = tmp_path / "fake-spark-submit.calls"
    monkeypatch.setenv("FAKE_SUBMIT_RECORD", str(record))
    monkeypatch.setenv("FAKE_SUBMIT_HELPERS", str(Path(__file__).parent))

    def calls() -> list[list[str]]:
        if not record.exists():
            return []
        return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]

    def mode(name: str, *, metrics: dict[str, Any] | None = None, error: str | None = None) -> None:
        monkeypatch.setenv("FAKE_SUBMIT_MODE", name)
        monkeypatch.setenv("FAKE_SUBMIT_METRICS", json.dumps(metrics or {}))
        if error is not None:
            monkeypatch.setenv("FAKE_SUBMIT_ERROR", error)

    return SimpleNamespace(binary=str(binary), calls=calls, mode=mode)


# -- integration: a real Airflow metadata DB and dags folder, once per test session ------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "dags_examples"

# A DAG only the tests need: its merge task fails after the merge committed, then is retried.
RETRY_DAG = '''
"""A merge task that fails after its merge committed, on its first try only."""
from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException

from airflow_merge_provider.operators.merge_into import MergeIntoOperator

DATA_DIR = os.environ["MERGE_EXAMPLES_DATA_DIR"]


class FailsAfterCommitOnce(MergeIntoOperator):
    def execute(self, context):
        result = super().execute(context)
        if context["ti"].try_number == 1:
            raise AirflowException("failing after the merge committed")
        return result


with DAG(dag_id="merge_retry_after_commit", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
         default_args={"retries": 1, "retry_delay": timedelta(seconds=0)}):
    FailsAfterCommitOnce(
        task_id="append_names",
        target=f"{DATA_DIR}/names",
        source=f"{DATA_DIR}/landing/names/{{{{ ds }}}}",
        # Not idempotent on its own: applied twice, a name would grow twice.
        merge_sql="MERGE INTO target t USING source s ON t.id = s.id "
                  "WHEN MATCHED THEN UPDATE SET name = concat(t.name, s.name) WHEN NOT MATCHED THEN INSERT *",
        conn_id=os.environ["MERGE_EXAMPLES_SPARK_CONN_ID"],
    )
'''


class AirflowHome(SimpleNamespace):
    """An AIRFLOW_HOME with a migrated SQLite DB, a dags folder and a data dir; run the CLI against it."""

    def run(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        airflow = Path(sys.executable).with_name("airflow")
        return subprocess.run(
            [str(airflow), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def dags_test(self, dag_id: str, logical_date: str) -> subprocess.CompletedProcess[str]:
        """``airflow dags test``; its output is kept under the home for post-mortems."""
        result = self.run("dags", "test", dag_id, logical_date)
        log = Path(self.env["AIRFLOW_HOME"]) / f"dags-test-{dag_id}.log"
        log.write_text(result.stdout + result.stderr, encoding="utf-8")
        return result

    def sql(self, statement: str, *params: object) -> list[tuple[Any, ...]]:
        """Rows of ``statement`` read straight from the SQLite metadata DB: milliseconds, where a Python
        process importing Airflow (``query``) takes seconds. JSON columns come back as JSON text."""
        import sqlite3

        database = Path(self.env["AIRFLOW_HOME"]) / "airflow.db"
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
            return connection.execute(statement, params).fetchall()

    def query(self, code: str) -> Any:
        """Run ``code`` (which sets ``result``) with the metadata DB; return ``result`` through JSON."""
        script = "import json\nfrom airflow.utils.session import create_session\n" + textwrap.dedent(code)
        script += "\nprint('RESULT=' + json.dumps(result, default=str))\n"
        out = subprocess.run(
            [sys.executable, "-c", script], env=self.env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-3000:]
        line = [line for line in out.stdout.splitlines() if line.startswith("RESULT=")][-1]
        return json.loads(line.removeprefix("RESULT="))


def make_airflow_home(
    root: Path, *, spark_conn_id: str = "spark_local", spark_conn: str = LOCAL_CONN,
    env: Mapping[str, str] | None = None,
) -> AirflowHome:
    """``airflow db migrate`` on SQLite in ``root`` (about 6 s), the example DAGs plus RETRY_DAG in its dags
    folder, a data dir for the examples' tables, and the examples' Spark connection ``spark_conn_id``
    defined as ``spark_conn`` (a JSON connection); ``env`` adds to the environment of every command."""
    import shutil

    from tests.support.jvm import FAST_START, submit_opts

    dags, data = root / "dags", root / "data"
    dags.mkdir(parents=True)
    data.mkdir()
    for path in EXAMPLES.glob("*.py"):
        shutil.copy(path, dags / path.name)
    (dags / "merge_retry_after_commit.py").write_text(RETRY_DAG, encoding="utf-8")
    bin_dir = str(Path(sys.executable).parent)
    full_env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(root / "home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "false",
        f"AIRFLOW_CONN_{spark_conn_id.upper()}": spark_conn,
        "MERGE_EXAMPLES_DATA_DIR": str(data),
        "MERGE_EXAMPLES_SPARK_CONN_ID": spark_conn_id,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # Every spark-submit the DAGs start reads these: a JVM that starts fast, no UI (tests/support/jvm.py:
        # not a SPARK_CONF_DIR, which would keep the JVM from mapping the class archive).
        "SPARK_SUBMIT_OPTS": submit_opts(FAST_START),
        **(env or {}),
    }
    home = AirflowHome(env=full_env, data=data, dags=dags)
    database = Path(full_env["AIRFLOW_HOME"]) / "airflow.db"
    if _MIGRATED_DB:
        # The schema is the same for every home of the session: copied, not migrated again (~8 s each).
        database.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_MIGRATED_DB[0], database)
        return home
    migrated = home.run("db", "migrate", timeout=600)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    template = root / "migrated-airflow.db"
    shutil.copyfile(database, template)
    _MIGRATED_DB.append(template)
    return home


# The first home's freshly migrated metadata DB, kept unchanged as the template of the session's others.
_MIGRATED_DB: list[Path] = []


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> AirflowHome:
    """An Airflow home (:func:`make_airflow_home`) whose ``spark_local`` connection is a local[2] master,
    migrated once per test session."""
    return make_airflow_home(tmp_path_factory.mktemp("airflow"))
