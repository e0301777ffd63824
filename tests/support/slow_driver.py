"""A fake spark-submit whose driver waits to be released, for tests that must find it still running.

Like conftest's fake, it records its argv and behaves as the job would; before committing it prints Spark's
application lines (UI port, driver host) and a stage line, then waits for a release file, so a test can
crash a task, reconnect, defer or kill while the driver runs.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

_SCRIPT = """
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["SLOW_SUBMIT_RECORD"], "a") as record:
    record.write(json.dumps(args) + "\\n")
spec = json.loads(args[args.index("--spec-json") + 1]) if "--spec-json" in args else json.load(
    open(args[args.index("--spec") + 1]))
err = sys.stderr
print("26/01/01 INFO SparkContext: Running Spark version 4.2.0", file=err, flush=True)
print("26/01/01 INFO Utils: Successfully started service 'SparkUI' on port 4041.", file=err, flush=True)
print("26/01/01 INFO NettyBlockTransferService: Server created on 10.1.2.3:45475", file=err, flush=True)
print("[delta-merge] MERGE operation - loading the target's snapshot", file=err, flush=True)
release = os.environ["SLOW_SUBMIT_RELEASE"]
deadline = time.time() + 120
while not os.path.exists(release) and time.time() < deadline:
    time.sleep(0.05)
mode = os.environ.get("SLOW_SUBMIT_MODE", "ok")
metrics = json.loads(os.environ.get("SLOW_SUBMIT_METRICS", "{}"))
if mode == "ok":
    sys.path.insert(0, os.environ["SLOW_SUBMIT_HELPERS"])
    from delta_tables import commit_merge
    if not spec["options"].get("dry_run"):
        version = commit_merge(spec["target"]["uri"], app_id=spec["run"]["app_id"],
                               app_version=spec["run"]["app_version"],
                               metrics={k: v for k, v in metrics.items() if isinstance(v, int)})
        metrics = {**metrics, "tableVersion": version}
    print("[delta-merge] MERGE committed", file=err, flush=True)
    print("MERGE_METRICS_JSON=" + json.dumps(metrics), flush=True)
    sys.exit(0)
if mode == "fail":
    kind = os.environ.get("SLOW_SUBMIT_ERROR", "MergeExecutionError")
    print(f"MERGE failed: {kind}: something went wrong", file=err, flush=True)
    sys.exit(1)
sys.exit(3)  # "die": no line at all
"""


def make_slow_spark_submit(directory: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The fake binary in ``directory``: ``.binary``, ``.calls()`` (argv of each run), ``.release()`` (let
    waiting drivers go on), ``.mode(name, metrics=, error=)`` with name ``ok``, ``fail`` or ``die``, and
    ``.env`` (its variables, for a subprocess such as ``airflow dags test``)."""
    binary = directory / "slow-spark-submit"
    binary.write_text(f"#!{sys.executable}\n" + textwrap.dedent(_SCRIPT), encoding="utf-8")
    binary.chmod(0o755)
    record, release = directory / "slow-spark-submit.calls", directory / "slow-spark-submit.release"
    env = {"SLOW_SUBMIT_RECORD": str(record), "SLOW_SUBMIT_RELEASE": str(release),
           "SLOW_SUBMIT_HELPERS": str(Path(__file__).parent)}  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def calls() -> list[list[str]]:
        if not record.exists():
            return []
        return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]

    def mode(name: str, *, metrics: dict[str, Any] | None = None, error: str | None = None) -> None:
        values = {"SLOW_SUBMIT_MODE": name, "SLOW_SUBMIT_METRICS": json.dumps(metrics or {})}
        if error is not None:
            values["SLOW_SUBMIT_ERROR"] = error
        env.update(values)
        for key, value in values.items():
            monkeypatch.setenv(key, value)

    return SimpleNamespace(binary=str(binary), calls=calls, release=release.touch, mode=mode, env=env)
