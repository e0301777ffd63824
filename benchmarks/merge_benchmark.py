"""Benchmark: this job's MERGE vs delta-rs vs a naive Spark full rewrite, on Delta's merge benchmark cases.

Run from the repository root (see benchmarks/README.md)::

    .venv/bin/python benchmarks/merge_benchmark.py --rows 20000000 --files 40 --repeats 3

The cases and their names follow ``MergeTestCases`` of Delta's own merge benchmark (delta-io/delta,
``benchmarks/src/main/scala/benchmark/MergeTestCases.scala``); the table is synthetic and key-clustered
instead of TPC-DS ``web_returns``, so that "a fraction of the files" is exactly known.

This module is the command line; the cases, data, engines and report live in the ``merge_bench`` package
next to it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from merge_bench import ROOT
from merge_bench.cases import CASES, DEFAULT_CASES, DV_CASES, DV_TARGETS, TARGETS, UPSERT_5
from merge_bench.data import Layout, build_source, ensure_pristine, pristine_dir
from merge_bench.engines import (
    ALL_ENGINES,
    DELTA_ENGINES,
    DV_ENGINES,
    ENGINES,
    Engine,
    arrow_floor_engine,
    delta_rs_engine,
    job_engine,
    job_spec,
    naive_engine,
    run_one,
    spark_floor_engine,
    start_spark,
)
from merge_bench.report import check_targets, machine_info, plot, print_report, summarize, write_outputs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; see benchmarks/README.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=20_000_000, help="target rows (default 20,000,000)")
    parser.add_argument("--files", type=int, default=40, help="target files, key-clustered (default 40)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="measured runs per case and engine (default 3)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unmeasured runs per engine before measuring, of the 5%%-of-files upsert (default 1)",
    )
    parser.add_argument(
        "--cases",
        nargs="+",
        default=None,
        metavar="CASE",
        help="Delta's case names, or 'all' (default: the five of the README's table; with "
        "--deletion-vectors, the upserts on 5%%, 50%% and 100%% of the files)",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=None,
        choices=ALL_ENGINES,
        help="engines, run in this order (default: job delta delta-rs naive arrow-floor spark-floor; with "
        "--deletion-vectors, job job-cow delta delta-rs arrow-floor); arrow-floor and spark-floor are "
        "reference "
        "lines, not merges: they read and rewrite the touched files with pyarrow, or with two bare Spark "
        "queries, and their results are not checked",
    )
    parser.add_argument(
        "--deletion-vectors",
        action="store_true",
        help="merge a table with delta.enableDeletionVectors=true: the job merges on read; job-cow is the "
        "same job with spark.databricks.delta.merge.deletionVectors.persistent=false",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "results",
        help="where the JSON and PNG go (default benchmarks/results/)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="tables and sources (default: $TMPDIR/merge-benchmark-ROWSxFILES; kept for reuse)",
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild the pristine table even if cached")
    parser.add_argument("--clean", action="store_true", help="delete the work dir at the end")
    parser.add_argument("--seed", type=int, default=7, help="data generation seed (default 7)")
    parser.add_argument("--driver-memory", default="6g", help="spark.driver.memory (default 6g)")
    parser.add_argument(
        "--plot-only",
        type=Path,
        metavar="RESULTS_JSON",
        help="only redraw the chart of an earlier results JSON",
    )
    parser.add_argument("--verbose", action="store_true", help="show the job's own log lines")
    args = parser.parse_args(argv)
    if args.cases is None:
        args.cases = list(DV_CASES if args.deletion_vectors else DEFAULT_CASES)
    if args.engines is None:
        args.engines = list(DV_ENGINES if args.deletion_vectors else ENGINES)
    if args.cases == ["all"]:
        args.cases = list(CASES)
    unknown = [case for case in args.cases if case not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; expected names among:\n  " + "\n  ".join(CASES))
    if args.rows < args.files or args.files < 1 or args.repeats < 1 or args.warmup < 0:
        parser.error("expected --files >= 1, --rows >= --files, --repeats >= 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Build (or reuse) the table and sources, run every engine on every case, report."""
    args = parse_args(argv)
    logging.basicConfig(format="[%(name)s] %(message)s")
    logging.getLogger("delta_merge").setLevel(logging.INFO if args.verbose else logging.WARNING)
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    if args.plot_only:
        path = args.plot_only.with_suffix(".png")
        skipped = plot(json.loads(args.plot_only.read_text()), path)
        print(f"chart: {path}" if skipped is None else f"chart: skipped ({skipped})")
        return 0 if skipped is None else 1
    layout = Layout(args.rows, args.files)
    work = args.work_dir or Path(tempfile.gettempdir()) / f"merge-benchmark-{args.rows}x{args.files}"
    work.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    machine = machine_info()
    load = machine["load_average_at_start"][0]
    if load > 0.5:
        print(f"WARNING: load average {load:.1f} at start: other work is running, timings are unreliable")
    dv = args.deletion_vectors
    table = ensure_pristine(work, layout, seed=args.seed, rebuild=args.rebuild, deletion_vectors=dv)
    sources_dir = work / "sources"
    shutil.rmtree(sources_dir, ignore_errors=True)
    sources_dir.mkdir()
    cases = [CASES[name] for name in args.cases]
    sources = {
        c.name: build_source(c, layout, sources_dir / f"{c.name}.parquet", seed=args.seed) for c in cases
    }
    for case in cases:
        info = sources[case.name]
        print(
            f"source {case.name}: {info.rows:,} rows drawn from {info.matched_files} file(s): "
            f"{info.matched_rows:,} matching, {info.not_matched_rows:,} new"
        )
    print("starting Spark ...", flush=True)
    spark = start_spark(args.driver_memory, with_delta=any(name in DELTA_ENGINES for name in args.engines))
    makers: dict[str, Callable[[], Engine]] = {
        "job": lambda: job_engine(spark),
        "job-cow": lambda: job_engine(spark, copy_on_write=True),
        "delta": lambda: job_engine(spark, delta=True),
        "delta-rs": lambda: delta_rs_engine,
        "naive": lambda: naive_engine(spark),
        "arrow-floor": lambda: arrow_floor_engine(layout, pristine_dir(work, deletion_vectors=dv)),
        "spark-floor": lambda: spark_floor_engine(spark, layout, pristine_dir(work, deletion_vectors=dv)),
    }
    engines = {name: makers[name]() for name in args.engines}
    # The 5%-of-files upsert goes through every stage (join, rewrite, append, commit) once per engine.
    warmup_case = CASES[UPSERT_5] if UPSERT_5 in args.cases else cases[0]
    runs: list[dict[str, Any]] = []
    try:
        rounds = [(r, True, [warmup_case]) for r in range(args.warmup)] + [
            (r, False, cases) for r in range(args.repeats)
        ]
        for repeat, warmup, round_cases in rounds:
            for case in round_cases:
                label = "warm-up" if warmup else f"repeat {repeat + 1}/{args.repeats}"
                print(f"[{label}] {case.name}", flush=True)
                for name, run in engines.items():
                    runs.append(
                        run_one(
                            name,
                            run,
                            case,
                            sources[case.name],
                            work,
                            repeat=repeat,
                            warmup=warmup,
                            deletion_vectors=dv,
                        )
                    )
    finally:
        spark.stop()
        shutil.rmtree(work / "target", ignore_errors=True)
        shutil.rmtree(work / "scratch", ignore_errors=True)
        if args.clean:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarize(runs, args.cases, args.engines)
    targets = check_targets(summary, DV_TARGETS if dv else TARGETS)
    print_report(summary, targets)
    machine["load_average_at_end"] = os.getloadavg()
    results = {
        "benchmark": "merge_benchmark",
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        | {"work_dir": str(work)},
        "machine": machine,
        "table": table,
        "cases": {
            c.name: {
                "clauses": [asdict(x) for x in c.clauses],
                "source": asdict(sources[c.name]),
                "job_spec": job_spec(c, sources[c.name], work / "target"),
            }
            for c in cases
        },
        "runs": runs,
        "summary": summary,
        "targets": targets,
    }
    write_outputs(results, args.out)
    failed = any(r["seconds"] is None or r.get("problems") for r in runs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
