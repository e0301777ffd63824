"""Airflow itself finds the installed provider through its entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_airflow_providers_list_shows_the_provider(tmp_path: Path) -> None:
    # `airflow providers list` reads entry points only: no metadata DB is needed.
    airflow = Path(sys.executable).with_name("airflow")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
    }
    result = subprocess.run(
        [str(airflow), "providers", "list", "--output", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    # Airflow may print warnings before the JSON document.
    providers = json.loads(result.stdout[result.stdout.index("[") :])
    (ours,) = [p for p in providers if p["package_name"] == "airflow-merge-provider"]
    assert ours["version"] == "0.1.0"
    assert "Delta Lake MERGE INTO" in ours["description"]
