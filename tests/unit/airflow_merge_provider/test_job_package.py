"""The job as spark-submit gets it: the entry-point file and the --py-files zip."""

from __future__ import annotations

import zipfile
from pathlib import Path

from airflow_merge_provider import __version__
from airflow_merge_provider.job_package import job_application, job_py_files

ROOT = Path(__file__).resolve().parents[3]


def test_the_application_is_the_installed_job_entry_point() -> None:
    assert Path(job_application()) == ROOT / "spark_jobs" / "delta_merge" / "__main__.py"


def test_the_zip_holds_the_package_and_is_built_once(tmp_path: Path) -> None:
    path = Path(job_py_files(tmp_path))
    assert path.name == "spark_jobs.zip"
    assert path.parent.name.startswith(f"{__version__}-")
    names = zipfile.ZipFile(path).namelist()
    assert {
        "spark_jobs/__init__.py",
        "spark_jobs/delta_merge/__main__.py",
        "spark_jobs/delta_merge/spec.py",
    } <= set(names)
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    built = path.stat().st_mtime_ns
    assert Path(job_py_files(tmp_path)) == path
    assert path.stat().st_mtime_ns == built
    assert [p.name for p in path.parent.iterdir()] == ["spark_jobs.zip"]  # no partial file left
