"""The installed Spark job as spark-submit needs it: the entry-point file and a ``--py-files`` zip."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import zipfile
from pathlib import Path

from airflow_merge_provider import __version__

__all__ = ["job_application", "job_py_files", "job_sources_root"]

_PACKAGE = "spark_jobs"


def job_sources_root() -> Path:
    """The directory holding the installed ``spark_jobs`` package."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"The {_PACKAGE} package is not installed next to airflow_merge_provider")
    return Path(next(iter(spec.submodule_search_locations))).parent


def job_application() -> str:
    """Path of ``spark_jobs/delta_merge/__main__.py``, the application spark-submit runs."""
    return str(job_sources_root() / _PACKAGE / "delta_merge" / "__main__.py")


def job_py_files(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Path of a zip of the installed ``spark_jobs`` package, built once per version and content.

    The zip lives in ``<cache_dir>/<version>-<digest>/spark_jobs.zip`` (``cache_dir`` defaults to
    ``<tempdir>/airflow-merge-provider``). The content digest keeps an editable install from submitting
    a stale zip; the zip is written to a temporary name and renamed, so concurrent tasks never see a
    partial file.
    """
    files = _package_files()
    digest = hashlib.sha256()
    for relative, path in files:
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    base = Path(cache_dir or Path(tempfile.gettempdir()) / "airflow-merge-provider")
    folder = base / f"{__version__}-{digest.hexdigest()[:16]}"
    target = folder / f"{_PACKAGE}.zip"
    if target.is_file():
        return str(target)
    folder.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=folder, prefix=f".{_PACKAGE}-", suffix=".zip.partial")
    try:
        with os.fdopen(handle, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
            for relative, path in files:
                archive.write(path, relative)
        os.chmod(partial, 0o644)
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return str(target)


def _package_files() -> list[tuple[str, Path]]:
    root = job_sources_root()
    found = [
        (path.relative_to(root).as_posix(), path)
        for path in (root / _PACKAGE).rglob("*")
        if path.is_file() and path.suffix in (".py", ".typed") and "__pycache__" not in path.parts
    ]
    return sorted(found)
