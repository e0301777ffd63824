"""Airflow's CLI lists the provider's operators, sensors, hooks and triggers (entry points only, no DB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGE = "airflow-merge-provider"


def _airflow_json(tmp_path: Path, *args: str) -> Any:
    airflow = Path(sys.executable).with_name("airflow")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
    }
    result = subprocess.run(
        [str(airflow), "providers", *args, "--output", "json"],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # Airflow may print warnings before the JSON document.
    return json.loads(result.stdout[result.stdout.index("[") :])
def test_airflow_providers_triggers_lists_the_merge_commit_trigger(tmp_path: Path) -> None:
    triggers = _airflow_json(tmp_path, "triggers")
    ours = [t for t in triggers if t["package_name"] == PACKAGE]
    assert [t["class"] for t in ours] == ["airflow_merge_provider.triggers.merge_commit"]
def test_airflow_providers_get_lists_every_module_kind(tmp_path: Path) -> None:
    (info,) = _airflow_json(tmp_path, "get", PACKAGE, "--full")
    modules = {kind: [m for entry in info[kind] for m in entry["python-modules"]] for kind in
               ("operators", "sensors", "hooks", "triggers")}  # fmt: skip
    assert modules == {
        "operators": [
            "airflow_merge_provider.operators.merge_into",
            "airflow_merge_provider.operators.merge_metrics_branch",
        ],
        "sensors": ["airflow_merge_provider.sensors.merge_commit"],
        "hooks": [
            "airflow_merge_provider.hooks.merge_commit",
            "airflow_merge_provider.hooks.merge_into",
            "airflow_merge_provider.hooks.storage_credentials",
        ],
        "triggers": ["airflow_merge_provider.triggers.merge_commit"],
    }
