"""Apache Airflow provider that runs Delta Lake MERGE INTO on Spark through a packaged PySpark job."""

from __future__ import annotations

__all__ = ["__version__"]

# Kept equal to [project].version in pyproject.toml (tests/unit/test_packaging.py checks it).
__version__ = "0.1.0"
