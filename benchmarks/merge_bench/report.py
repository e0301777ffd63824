"""The merge benchmark's report: medians, targets, the printed tables, machine info, the JSON and chart."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from . import ROOT
from .cases import CATALOG, TARGETS, Target
from .engines import REFERENCE_ENGINES

__all__ = [
    "MATPLOTLIB_MISSING",
    "check_targets",
    "machine_info",
    "plot",
    "print_report",
    "pyplot",
    "summarize",
    "upsert_points",
    "write_outputs",
]


def summarize(
    runs: Sequence[Mapping[str, Any]], cases: Sequence[str], engines: Sequence[str]
) -> list[dict[str, Any]]:
    """Median seconds per (case, engine) over the measured runs, with the median run's counts; a reference
    engine's row has ``reference`` set and ``wrong_results`` None (its results are not checked)."""
    rows: list[dict[str, Any]] = []
    for case in cases:
        medians: dict[str, float] = {}
        for engine in engines:
            good = [
                r
                for r in runs
                if r["case"] == case
                and r["engine"] == engine
                and not r["warmup"]
                and r["seconds"] is not None
            ]
            row: dict[str, Any] = {"case": case, "engine": engine, "runs": len(good), "median_seconds": None}
            if good:
                seconds = [r["seconds"] for r in good]
                median = statistics.median(seconds)
                closest_run = min(good, key=lambda r: abs(r["seconds"] - median))
                closest = closest_run["outcome"]
                medians[engine] = median
                row |= {
                    "median_seconds": median,
                    "min_seconds": min(seconds),
                    "max_seconds": max(seconds),
                    "files_removed": closest["files_removed"],
                    "files_added": closest["files_added"],
                    "rows_copied": closest["rows_copied"],
                }
                if engine in REFERENCE_ENGINES:  # not checked: its runs have no "problems"
                    row |= {"wrong_results": None, "reference": True}
                else:
                    row["wrong_results"] = sum(bool(r["problems"]) for r in good)
                if "deletion_vectors" in closest_run:  # the job's runs
                    dv = closest_run["deletion_vectors"]
                    row |= {"deletion_vectors": dv["added"] + dv["updated"], "rows_marked": dv["rows_marked"]}
                    # What the median run cost its Spark session: the time of each stage.
                    row["stage_ms"] = closest["raw"].get("stageTimesMs") or []
                    # Its Spark jobs, and the time none ran: the driver's own work and the waits between.
                    if "sparkJobs" in closest["raw"]:
                        row["spark_jobs"] = closest["raw"]["sparkJobs"]
                        row["driver_seconds"] = closest_run["seconds"] - closest["raw"]["sparkJobMs"] / 1000
            rows.append(row)
        bases = (
            ("naive", "ratio_vs_naive"),
            ("delta", "ratio_vs_delta"),
            ("delta-rs", "ratio_vs_delta_rs"),
            ("job-cow", "ratio_vs_job_cow"),
        )
        for row in rows[-len(engines) :]:
            for base, key in bases:
                mine, theirs = row["median_seconds"], medians.get(base)
                row[key] = mine / theirs if mine is not None and theirs else None
    return rows


def check_targets(
    summary: Sequence[Mapping[str, Any]], targets: Sequence[Target] = TARGETS
) -> list[dict[str, Any]]:
    """Each goal of ``targets``: PASS, FAIL, or n/a when its case or an engine was not measured. A goal
    compares the job with a merge engine, never with a reference line such as the Arrow floor."""
    results = []
    for goal in targets:
        if goal.base in REFERENCE_ENGINES:
            raise ValueError(f"target {goal.label!r}: expected a merge engine as base, found {goal.base!r}")
        job = next((r for r in summary if r["case"] == goal.case and r["engine"] == "job"), None)
        ratio = job.get(f"ratio_vs_{goal.base.replace('-', '_')}") if job else None
        result: dict[str, Any] = asdict(goal) | {"ratio": ratio, "status": "n/a", "detail": ""}
        if job is None or ratio is None:
            result["detail"] = f"needs the case and the job and {goal.base} engines measured"
        else:
            fails = [f"{ratio:.3f}x {goal.base} > {goal.max_ratio}x"] if ratio > goal.max_ratio else []
            if goal.no_file_removed and job["files_removed"]:
                fails.append(f"{job['files_removed']} file(s) removed")
            if goal.merge_on_read and not job.get("deletion_vectors"):
                fails.append("the job wrote no deletion vector (not merge-on-read)")
            if job["wrong_results"]:
                fails.append("wrong results")
            result["status"] = "FAIL" if fails else "PASS"
            result["detail"] = "; ".join(fails) or f"{ratio:.3f}x {goal.base}"
        results.append(result)
    return results


def _fmt(value: Any, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def print_report(summary: Sequence[Mapping[str, Any]], targets: Sequence[Mapping[str, Any]]) -> None:
    """The summary table (one block per case) and the goals; the job-cow and deletion vector columns
    only when the job-cow engine ran."""
    with_cow = any(row["engine"] == "job-cow" for row in summary)
    header = (
        f"  {'engine':<11} {'median s':>9} {'runs':>4} {'files removed':>13} {'files added':>11} "
        f"{'rows copied':>13} {'x naive':>8} {'x delta':>8} {'x delta-rs':>10}"
        + (f" {'x job-cow':>9} {'DVs':>5} {'rows marked':>12}" if with_cow else "")
    )
    print("\n== medians ==")
    for index, row in enumerate(summary):
        if index == 0 or row["case"] != summary[index - 1]["case"]:
            print(f"\n{row['case']}\n{header}")
        print(
            f"  {row['engine']:<11} {_fmt(row['median_seconds'], '.3f', 9)} {row['runs']:>4} "
            f"{_fmt(row.get('files_removed'), ',', 13)} {_fmt(row.get('files_added'), ',', 11)} "
            f"{_fmt(row.get('rows_copied'), ',', 13)} {_fmt(row.get('ratio_vs_naive'), '.3f', 8)} "
            f"{_fmt(row.get('ratio_vs_delta'), '.3f', 8)} {_fmt(row.get('ratio_vs_delta_rs'), '.2f', 10)}"
            + (
                f" {_fmt(row.get('ratio_vs_job_cow'), '.3f', 9)} {_fmt(row.get('deletion_vectors'), ',', 5)} "
                f"{_fmt(row.get('rows_marked'), ',', 12)}"
                if with_cow
                else ""
            )
            + (f"  ({row['wrong_results']} wrong result(s))" if row.get("wrong_results") else "")
            + ("  (reference, not a merge)" if row.get("reference") else "")
        )
    print("\n== the job's median runs: ms per stage ==")
    for row in summary:
        if row.get("stage_ms"):
            stages = ", ".join(f"{stage['stage'].removeprefix('MERGE operation - ')} {stage['ms']}"
                               for stage in row["stage_ms"])  # fmt: skip
            print(f"  {row['case']} [{row['engine']}]: {stages}")
            if row.get("spark_jobs") is not None:
                print(f"      {row['spark_jobs']} Spark jobs; outside them (driver work, waits) "
                      f"{row['driver_seconds']:.3f} s of the run's time")
    bases = ", ".join(dict.fromkeys(goal["base"] for goal in targets))
    print(f"\n== targets (this job vs {bases}) ==")
    for goal in targets:
        print(f"  {goal['status']:<4}  {goal['label']:<45} {goal['detail']}")


def _memory_kib() -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return None


def machine_info() -> dict[str, Any]:
    """Enough to tell two result files apart: hardware, load, versions, commit."""
    versions = {}
    for name in ("pyspark", "deltalake", "pyarrow", "numpy"):
        versions[name] = str(getattr(importlib.import_module(name), "__version__", "?"))

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_kib": _memory_kib(),
        "python": sys.version.split()[0],
        "versions": versions,
        "git_commit": git("rev-parse", "HEAD"),
        # What the measured code is: the commit plus uncommitted changes, untracked files included.
        "git_changes": git("status", "--porcelain").splitlines(),
        "load_average_at_start": os.getloadavg(),
    }


# engine: (colour, marker, line style)
_CHART_STYLE = {
    "job": ("tab:blue", "o", "-"),
    "job-cow": ("tab:purple", "s", "-"),
    "delta": ("tab:green", "s", "-"),
    "delta-rs": ("tab:orange", "^", "-"),
    "naive": ("tab:red", "D", "-"),
    "arrow-floor": ("0.4", "x", "--"),
    "spark-floor": ("0.6", "+", ":"),
}


def _chart_label(engine: str, *, deletion_vectors: bool) -> str:
    labels = {
        "job": "job: deletion vectors (merge-on-read)" if deletion_vectors else "job (copy-on-write)",
        "job-cow": "job-cow (copy-on-write)",
        "delta": "delta: Delta's own MERGE INTO (delta-spark 4.4)",
        "delta-rs": "delta-rs (copy-on-write)",
        "naive": "naive (Spark's full rewrite)",
        "arrow-floor": "Arrow read+write floor (the touched files)",
        "spark-floor": "Spark floor (two bare queries on the touched files)",
    }
    return labels.get(engine, engine)


def upsert_points(results: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Per engine, (fraction of the files touched, median seconds) of the measured upsert cases, by
    fraction. Where several upserts touch the same fraction (``--cases all``), the first in Delta's order."""
    measured = {row["case"] for row in results["summary"]}
    by_fraction: dict[float, str] = {}
    for case in CATALOG:
        if case.kind == "upsert" and case.name in measured:
            by_fraction.setdefault(case.file_matched_fraction, case.name)
    points: dict[str, list[tuple[float, float]]] = {}
    for engine in results["config"]["engines"]:
        seconds = {
            row["case"]: row["median_seconds"] for row in results["summary"] if row["engine"] == engine
        }
        line = [
            (x, seconds[name]) for x, name in sorted(by_fraction.items()) if seconds.get(name) is not None
        ]
        if line:
            points[engine] = line
    return points


def _chart_title(results: Mapping[str, Any]) -> str:
    config, machine = results["config"], results.get("machine", {})
    kind = " deletion-vector" if config.get("deletion_vectors") else ""
    size = f" ({results['table']['bytes'] / 2**20:,.0f} MiB)" if results.get("table", {}).get("bytes") else ""
    start, end = machine.get("load_average_at_start"), machine.get("load_average_at_end")
    load = f"load average {start[0]:.1f}" if start else "load average not recorded"
    load += f" at start, {end[0]:.1f} at end" if start and end else ""
    return (
        f"Upsert MERGE on a {config['rows']:,}-row, {config['files']}-file{kind} Delta table{size}\n"
        f"median of {config['repeats']} run(s) per point; {load}"
    )


MATPLOTLIB_MISSING = "matplotlib is not installed; see benchmarks/README.md"


def pyplot() -> tuple[Any, Any] | None:
    """matplotlib's ``pyplot`` (drawing to files, no display) and ``ticker``, or None without matplotlib
    (the optional ``bench`` extra)."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot"), importlib.import_module("matplotlib.ticker")


def plot(results: Mapping[str, Any], path: Path) -> str | None:
    """Median seconds (log scale) against the fraction of the files the upsert cases touch, one line per
    engine; None when drawn, else why not (no upsert case measured, or no matplotlib)."""
    points = upsert_points(results)
    if not points:
        return "no upsert case measured"
    charting = pyplot()
    if charting is None:
        return MATPLOTLIB_MISSING
    plt, ticker = charting
    deletion_vectors = bool(results["config"].get("deletion_vectors"))
    figure, axes = plt.subplots(figsize=(9.0, 6.0))
    for engine, line in points.items():
        colour, marker, style = _CHART_STYLE.get(engine, ("black", "o", "-"))
        xs, ys = [x for x, _ in line], [y for _, y in line]
        label = _chart_label(engine, deletion_vectors=deletion_vectors)
        axes.plot(xs, ys, style, color=colour, marker=marker, label=label)
        for x, y in line:
            # Below the point when another engine's is just above it, so that the two labels do not collide.
            near = [oy for other, at in points.items() if other != engine for ox, oy in at if ox == x]
            below = any(y <= oy < 1.35 * y for oy in near)
            axes.annotate(
                f"{y:.3g}",
                (x, y),
                xytext=(0, -7 if below else 7),
                textcoords="offset points",
                ha="center",
                va="top" if below else "bottom",
                fontsize=7,
                color=colour,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
            )
    fractions = sorted({x for line in points.values() for x, _ in line})
    axes.set_xticks(fractions, [f"{x:.0%}" for x in fractions])
    axes.set_xlim(0.0, 1.1)
    axes.set_xlabel("fraction of the target's files touched (fileMatchedFraction of Delta's upsert cases)")
    axes.set_yscale("log")
    axes.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axes.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    axes.yaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_ylabel("median seconds (log scale)")
    axes.grid(True, which="major", alpha=0.3)
    axes.set_title(_chart_title(results), fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None


def write_outputs(results: dict[str, Any], out: Path) -> None:
    """JSON (everything) and the PNG chart (time vs fraction of files touched), named by the start time."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"merge_benchmark-{results['started'].replace(':', '').replace('-', '')[:15]}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nresults: {stem.with_suffix('.json')}")
    skipped = plot(results, stem.with_suffix(".png"))
    print(f"chart:   {stem.with_suffix('.png')}" if skipped is None else f"chart:   skipped ({skipped})")
