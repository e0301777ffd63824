"""The merge benchmark's modules; ``benchmarks/merge_benchmark.py`` is its command line.

``cases`` -> ``data`` -> ``engines`` -> ``report``: each module imports only those before it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT"]

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
