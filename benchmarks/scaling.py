"""Benchmark: the merge's time against the table's size, in one run at several sizes.

Run from the repository root (see benchmarks/README.md)::

    .venv/bin/python benchmarks/scaling.py                                  # 2M, 20M and 60M rows
    .venv/bin/python benchmarks/scaling.py --rows 200000 2000000 --repeats 1   # a quick look

At each size, ``merge_benchmark.py`` runs twice: on the copy-on-write table (the job, delta-rs, and the
two reference lines: the Arrow and the Spark floor) and on the same table with deletion vectors (the job
merging on read, delta-rs). This script then lays the medians side by side: a table of seconds per case
and size with the job's ratio to delta-rs, ``scaling-<time>.json`` and a chart of seconds against rows
(``scaling-<time>.png``, one panel per case, both axes logarithmic).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import merge_benchmark
from merge_bench import ROOT
from merge_bench.cases import DEFAULT_CASES, DV_CASES
from merge_bench.report import MATPLOTLIB_MISSING, pyplot

COPY_ON_WRITE_ENGINES = ("job", "delta-rs", "arrow-floor", "spark-floor")
MERGE_ON_READ_ENGINES = ("job", "delta-rs")
# A line of the chart: (run kind, engine) -> (label, colour, marker, line style).
LINES: dict[tuple[str, str], tuple[str, str, str, str]] = {
    ("cow", "job"): ("job, copy-on-write", "tab:blue", "o", "-"),
    ("mor", "job"): ("job, deletion vectors (merge-on-read)", "tab:cyan", "s", "-"),
    ("cow", "delta-rs"): ("delta-rs, copy-on-write", "tab:orange", "^", "-"),
    ("mor", "delta-rs"): ("delta-rs, deletion-vector table", "tab:brown", "v", "--"),
    ("cow", "arrow-floor"): ("Arrow floor (read+write the touched files)", "0.4", "x", "--"),
    ("cow", "spark-floor"): ("Spark floor (two bare queries)", "0.6", "+", ":"),
}
_SHORT_NAMES = {
    "single_insert_only": "insert-only, 5% of files",
    "delete_only": "delete, 5% of files",
    "upsert_fileMatchedFraction_0.05": "upsert, 5% of files",
    "upsert_fileMatchedFraction_0.5": "upsert, 50% of files",
    "upsert_fileMatchedFraction_1.0": "upsert, 100% of files",
}


def short_name(case: str) -> str:
    """A case's name as the chart and the table print it."""
    return next((short for prefix, short in _SHORT_NAMES.items() if case.startswith(prefix)), case)


def size_label(rows: int) -> str:
    """20000 -> 20k, 2000000 -> 2M."""
    return f"{rows / 1e6:g}M" if rows >= 1_000_000 else f"{rows / 1e3:g}k"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; see benchmarks/README.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[2_000_000, 20_000_000, 60_000_000],
        help="target sizes in rows (default 2M 20M 60M)",
    )  # fmt: skip
    parser.add_argument("--files", type=int, default=40, help="target files at every size (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per point (default 3)")
    parser.add_argument(
        "--no-merge-on-read", action="store_true", help="skip the runs on the deletion-vector table"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results",
        help="where the JSON and PNG go (default benchmarks/results/)",
    )  # fmt: skip
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory (default 6g)")
    parser.add_argument(
        "--plot-only", type=Path, metavar="SCALING_JSON", help="only redraw the chart of an earlier run"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.files < 1 or any(rows < args.files for rows in args.rows):
        parser.error("expected --repeats >= 1, --files >= 1 and every --rows >= --files")
    return args


def points(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[tuple[str, str], list[tuple[int, float]]]]:
    """Per case, per chart line, (rows, median seconds) by rows, from the merge benchmark's results."""
    by_case: dict[str, dict[tuple[str, str], list[tuple[int, float]]]] = {}
    for results in sorted(runs, key=lambda r: r["config"]["rows"]):
        kind = "mor" if results["config"]["deletion_vectors"] else "cow"
        for row in results["summary"]:
            if row["median_seconds"] is not None:
                line = by_case.setdefault(row["case"], {}).setdefault((kind, row["engine"]), [])
                line.append((results["config"]["rows"], row["median_seconds"]))
    return by_case


Lines = Mapping[tuple[str, str], Sequence[tuple[int, float]]]


def job_over_delta_rs(lines: Lines, kind: str) -> dict[int, float]:
    """Per size where both ran, the job's median over delta-rs's, for one kind of run ("cow" or "mor")."""
    job, theirs = dict(lines.get((kind, "job"), [])), dict(lines.get((kind, "delta-rs"), []))
    return {rows: job[rows] / theirs[rows] for rows in sorted(job) if rows in theirs}


def ratios(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per case, size and kind, the job's median seconds, delta-rs's, and their ratio."""
    table = []
    for results in sorted(runs, key=lambda r: (r["config"]["deletion_vectors"], r["config"]["rows"])):
        for row in results["summary"]:
            if row["engine"] == "job":
                table.append({
                    "case": row["case"], "rows": results["config"]["rows"],
                    "merge_on_read": results["config"]["deletion_vectors"],
                    "job_seconds": row["median_seconds"], "ratio_vs_delta_rs": row.get("ratio_vs_delta_rs"),
                    "load_average": [results["machine"]["load_average_at_start"][0],
                                     results["machine"]["load_average_at_end"][0]],
                })  # fmt: skip
    return table


def print_table(runs: Sequence[Mapping[str, Any]]) -> None:
    """Seconds per case and size, every line side by side, and the job's ratio to delta-rs."""
    for case, lines in points(runs).items():
        print(f"\n{short_name(case)}")
        sizes = sorted({rows for line in lines.values() for rows, _ in line})
        print(f"  {'':<44}" + "".join(f"{size_label(rows):>11}" for rows in sizes))
        for key, line in lines.items():
            seconds = dict(line)
            label = LINES.get(key, (f"{key[1]} ({key[0]})",))[0]
            print(f"  {label:<44}" + "".join(f"{seconds[rows]:>11.2f}" if rows in seconds else f"{'-':>11}"
                                            for rows in sizes))  # fmt: skip
        for kind in ("cow", "mor"):
            ratio = job_over_delta_rs(lines, kind)
            if ratio:
                print(f"  {'job / delta-rs, ' + ('merge-on-read' if kind == 'mor' else 'copy-on-write'):<44}"
                      + "".join(f"{ratio[rows]:>10.2f}x" if rows in ratio else f"{'-':>11}"
                                for rows in sizes))  # fmt: skip


def plot(scaling: Mapping[str, Any], path: Path) -> str | None:
    """Seconds against rows, both logarithmic, one panel per case; None when drawn, else why not."""
    charting = pyplot()
    if charting is None:
        return MATPLOTLIB_MISSING
    plt, ticker = charting
    by_case = points(scaling["runs"])
    cases = [case for case in DEFAULT_CASES if case in by_case]
    files = scaling["config"]["files"]
    columns = 3
    figure, grid = plt.subplots(
        (len(cases) + 1 + columns - 1) // columns, columns, figsize=(14.0, 9.0), squeeze=False
    )
    sizes = sorted({rows for lines in by_case.values() for line in lines.values() for rows, _ in line})

    def size_axis(axes: Any) -> None:
        axes.set_xscale("log")
        axes.set_xticks(sizes, [size_label(rows) for rows in sizes])
        axes.xaxis.set_minor_formatter(ticker.NullFormatter())
        axes.set_xlabel(f"target rows ({files} files)", fontsize=8)
        axes.grid(True, which="major", alpha=0.3)

    for axes, case in zip(grid.flat, cases, strict=False):
        for key, line in by_case[case].items():
            label, colour, marker, style = LINES.get(key, (f"{key[1]} ({key[0]})", "black", "o", "-"))
            xs, ys = [rows for rows, _ in line], [seconds for _, seconds in line]
            axes.plot(xs, ys, style, color=colour, marker=marker, label=label)
            if key[1] == "job":
                for x, y in line:
                    axes.annotate(f"{y:.3g}", (x, y), xytext=(0, 6), textcoords="offset points",
                                  ha="center", fontsize=7, color=colour)  # fmt: skip
        size_axis(axes)
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        axes.set_title(short_name(case), fontsize=10)
        axes.set_ylabel("median seconds", fontsize=8)
    # The last panel: the job's time over delta-rs's, per case, against the size.
    ratio_axes = grid.flat[len(cases)]
    for index, case in enumerate(cases):
        for kind, style in (("cow", "-"), ("mor", "--")):
            ratio = job_over_delta_rs(by_case[case], kind)
            if ratio:
                label = short_name(case) + (", merge-on-read" if kind == "mor" else "")
                ratio_axes.plot(list(ratio), list(ratio.values()), style, color=f"C{index}", marker="o",
                                label=label)  # fmt: skip
    size_axis(ratio_axes)
    ratio_axes.set_yscale("log")
    ratio_axes.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ratio_axes.axhline(1.0, color="0.5", linewidth=0.8)
    ratio_axes.set_title("job / delta-rs (dashed: deletion vectors)", fontsize=10)
    ratio_axes.set_ylabel("ratio of medians", fontsize=8)
    ratio_axes.legend(fontsize=6)
    for axes in grid.flat[len(cases) + 1 :]:
        axes.axis("off")
    handles: dict[str, Any] = {}
    for axes in grid.flat[: len(cases)]:
        for handle, label in zip(*axes.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    figure.legend(handles.values(), handles.keys(), loc="lower center", ncol=3, fontsize=9)
    loads = [results["machine"]["load_average_at_start"][0] for results in scaling["runs"]]
    cores = sorted({str(results["machine"]["cpu_count"]) for results in scaling["runs"]})
    figure.suptitle(
        f"MERGE time against table size, {'/'.join(cores)} cores; medians of "
        f"{scaling['config']['repeats']} run(s) per point; load average {min(loads):.1f}-{max(loads):.1f} "
        "at the start of each run", fontsize=11,
    )  # fmt: skip
    figure.tight_layout(rect=(0.0, 0.07, 1.0, 1.0))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the merge benchmark at every size, then print, write and draw the scaling."""
    args = parse_args(argv)
    if args.plot_only:
        path = args.plot_only.with_suffix(".png")
        skipped = plot(json.loads(args.plot_only.read_text()), path)
        print(f"chart: {path}" if skipped is None else f"chart: skipped ({skipped})")
        return 0 if skipped is None else 1
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    stamp = started.replace(":", "").replace("-", "")[:15]
    runs: list[dict[str, Any]] = []
    failed = False
    kinds: list[tuple[str, Sequence[str], Sequence[str]]] = [("cow", COPY_ON_WRITE_ENGINES, DEFAULT_CASES)]
    if not args.no_merge_on_read:
        kinds.append(("mor", MERGE_ON_READ_ENGINES, DV_CASES))
    for rows in args.rows:
        for kind, engines, cases in kinds:
            out = args.out / f"scaling-{stamp}" / f"{rows}-{kind}"
            print(f"\n=== {rows:,} rows, {'deletion vectors' if kind == 'mor' else 'copy-on-write'} ===",
                  flush=True)  # fmt: skip
            argv_one = ["--rows", str(rows), "--files", str(args.files), "--repeats", str(args.repeats),
                        "--engines", *engines, "--cases", *cases, "--out", str(out),
                        "--driver-memory", args.driver_memory]  # fmt: skip
            if kind == "mor":
                argv_one.append("--deletion-vectors")
            failed |= merge_benchmark.main(argv_one) != 0
            runs.append(json.loads(max(out.glob("merge_benchmark-*.json")).read_text()))
    scaling = {
        "benchmark": "scaling",
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {key: str(value) if isinstance(value, Path) else value
                   for key, value in vars(args).items()},
        "runs": runs,
        "job_vs_delta_rs": ratios(runs),
    }
    print("\n\n== scaling: median seconds by target rows ==")
    print_table(runs)
    stem = args.out / f"scaling-{stamp}"
    stem.with_suffix(".json").write_text(json.dumps(scaling, indent=2, default=str))
    print(f"\nresults: {stem.with_suffix('.json')}")
    skipped = plot(scaling, stem.with_suffix(".png"))
    print(f"chart:   {stem.with_suffix('.png')}" if skipped is None else f"chart:   skipped ({skipped})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
