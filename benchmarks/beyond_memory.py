"""Benchmark: a merge larger than one process's memory, on a Spark standalone cluster of 1 GiB executors,
beside delta-rs on the same data under the same memory cap.

Run from the repository root::

    .venv/bin/python benchmarks/beyond_memory.py                      # 50M-row target, 10M-row source
    .venv/bin/python benchmarks/beyond_memory.py --target-rows 2000000 --source-rows 400000   # smoke run

The target (key-clustered files written by deltalake) and the source (Parquet: half updates of keys spread
over every target file, half new keys) are written once under ``--work-dir`` and reused; each engine merges
into its own copy of the target, with the same upsert.

- ``job``: the merge job through spark-submit on a standalone master and two workers started here on
  127.0.0.1 (one core each), one executor of ``--memory`` per worker and a driver of ``--memory``: the
  materialized source, the join and the rewrite of every file do not fit in one of them, so Spark spills.
- ``delta-rs``: ``DeltaTable.merge`` (streamed source) in a child process capped at ``--memory`` plus
  Spark's executor overhead (384 MiB), as an executor's container is: once by address space
  (``RLIMIT_AS``), once by resident memory (a cgroup v1 memory limit, where this user may create one: the
  kernel kills the process past it), then once without a cap, for the memory it needs.

Reported per engine: the outcome, wall time, rows/s (target rows plus source rows over the wall time) and
peak memory: for the job the largest resident set of one process (driver, executor or Python worker) and
the largest sum over all of them, sampled every 0.2 s; for delta-rs its peak resident set (``ru_maxrss``).
Results go to ``benchmarks/results/beyond_memory-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.standalone_cluster import StandaloneCluster  # noqa: E402
from tests.support.submit_harness import METRICS_PREFIX, PYTHON, SPARK_SUBMIT, submit_env  # noqa: E402

JOB = ROOT / "spark_jobs" / "delta_merge" / "__main__.py"
UPSERT = "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
_OVERHEAD = 384 << 20  # Spark's minimum executor memory overhead
_BATCH_ROWS = 5_000_000
_DELTA_RS = """
import json, sys, time
import pyarrow.dataset as ds
from deltalake import DeltaTable
target, source = sys.argv[1], sys.argv[2]
started = time.perf_counter()
reader = ds.dataset(source, format="parquet").scanner(batch_size=65536).to_reader()
merger = DeltaTable(target).merge(source=reader, predicate="t.id = s.id", source_alias="s",
                                  target_alias="t", streamed_exec=True)
metrics = merger.when_matched_update_all().when_not_matched_insert_all().execute()
print("RESULT=" + json.dumps({"seconds": time.perf_counter() - started, "metrics": metrics}))
"""


def _rows(ids: np.ndarray, tag: str) -> pa.Table:
    keys = pa.array(ids, pa.int64())
    return pa.table({
        "id": keys, "amount": pc.multiply(keys, 3), "ratio": pa.array(ids * 0.5),
        "label": pc.binary_join_element_wise(tag, pc.cast(keys, pa.string()), ""),
    })  # fmt: skip


def prepare(work: Path, target_rows: int, source_rows: int) -> tuple[Path, Path]:
    """The pristine target and the source, written once per size."""
    from deltalake import write_deltalake

    pristine, source = work / "pristine", work / "source"
    if not (pristine / "_delta_log").exists():
        print(f"writing a {target_rows:,}-row target in {pristine} ...", flush=True)
        shutil.rmtree(pristine, ignore_errors=True)
        for start in range(0, target_rows, _BATCH_ROWS):
            ids = np.arange(start, min(start + _BATCH_ROWS, target_rows), dtype=np.int64)
            write_deltalake(str(pristine), _rows(ids, "old-"), mode="append", target_file_size=64 << 20)
    if not source.exists():
        print(f"writing a {source_rows:,}-row source in {source} ...", flush=True)
        rng = np.random.default_rng(7)
        updates = rng.choice(target_rows, source_rows // 2, replace=False).astype(np.int64)
        inserts = np.arange(target_rows, target_rows + source_rows - len(updates), dtype=np.int64)
        ids = np.concatenate([updates, inserts])
        rng.shuffle(ids)
        source.mkdir(parents=True)
        for number, start in enumerate(range(0, len(ids), _BATCH_ROWS)):
            batch = _rows(ids[start : start + _BATCH_ROWS], "new-")
            pq.write_table(batch, source / f"part-{number:05d}.parquet")
    return pristine, source


class _MemorySampler:
    """Peak resident memory of a set of process trees, sampled from /proc."""

    def __init__(self, roots: Sequence[int]) -> None:
        self._roots = set(roots)
        self.peak_process = 0
        self.peak_total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            sizes = [_rss(pid) for pid in _descendants(self._roots)]
            self.peak_process = max(self.peak_process, *sizes, 0)
            self.peak_total = max(self.peak_total, sum(sizes))


def _descendants(roots: set[int]) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    found = set(roots) & set(parents)
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        grew = bool(more)
        found |= more
    return found


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_job(
    cluster: StandaloneCluster, target: Path, source: Path, memory: str, scratch: Path
) -> dict[str, Any]:
    spec = scratch / "spec.json"
    spec.write_text(json.dumps({
        "target": {"uri": str(target)}, "source": {"uri": str(source), "format": "parquet"},
        "merge_sql": UPSERT,
    }), encoding="utf-8")  # fmt: skip
    confs = {
        **cluster.application_confs(wait_for_executors=len(cluster.workers)),
        "spark.executor.memory": memory, "spark.driver.memory": memory,
        "spark.executor.extraJavaOptions": "", "spark.ui.enabled": "false",
        "spark.local.dir": str(scratch / "spark-local"),
    }  # fmt: skip
    argv = [str(SPARK_SUBMIT), "--master", cluster.master_url]
    for key, value in confs.items():
        argv += ["--conf", f"{key}={value}"]
    argv += [str(JOB), "--spec", str(spec)]
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=submit_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    # The driver (spark-submit's JVM and its Python), the executors and their Python workers.
    with _MemorySampler([process.pid] + [w.process.pid for w in cluster.workers]) as memory_used:
        stdout, stderr = process.communicate()
    seconds = time.perf_counter() - started
    metrics = next((json.loads(line[len(METRICS_PREFIX) :]) for line in stdout.splitlines()
                    if line.startswith(METRICS_PREFIX)), None)  # fmt: skip
    outcome = "completed" if process.returncode == 0 and metrics else f"failed (exit {process.returncode})"
    return {
        "engine": "job", "outcome": outcome, "seconds": seconds, "metrics": metrics,
        "peak_process_bytes": memory_used.peak_process, "peak_total_bytes": memory_used.peak_total,
        "error": None if metrics else (stdout + stderr)[-3000:],
    }  # fmt: skip


def _memory_cgroup(limit: int) -> Path | None:
    """A cgroup (v1 memory controller) capping resident memory at ``limit``, where this user may make one."""
    base = Path("/sys/fs/cgroup/memory")
    if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
        return None
    group = base / f"beyond-memory-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "memory.limit_in_bytes").write_text(str(limit))
    return group


def run_delta_rs(target: Path, source: Path, cap: int | None, kind: str = "address-space") -> dict[str, Any]:
    group = _memory_cgroup(cap) if cap is not None and kind == "resident" else None
    if kind == "resident" and group is None:
        return {"engine": "delta-rs (resident cap)", "outcome": "not run (no writable memory cgroup)",
                "seconds": 0.0, "metrics": None, "peak_process_bytes": None, "cap_bytes": cap, "error": None}

    def limit() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        elif cap is not None:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    started = time.perf_counter()
    process = subprocess.Popen([str(PYTHON), "-c", _DELTA_RS, str(target), str(source)], preexec_fn=limit,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    with _MemorySampler([process.pid]) as memory_used:
        stdout, stderr = process.communicate()
    seconds = time.perf_counter() - started
    if group is not None:
        group.rmdir()
    result = next((json.loads(line[len("RESULT="):]) for line in stdout.splitlines()
                   if line.startswith("RESULT=")), None)  # fmt: skip
    outcome = "completed" if result else f"failed (exit {process.returncode})"
    last = [line for line in stderr.splitlines() if line.strip()][-1:] or [""]
    return {
        "engine": f"delta-rs ({kind} cap)" if cap is not None else "delta-rs (no cap)", "outcome": outcome,
        "seconds": seconds, "metrics": result["metrics"] if result else None,
        "peak_process_bytes": memory_used.peak_process, "cap_bytes": cap,
        "error": None if result else last[0][:500],
    }  # fmt: skip


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    return int(text[:-1]) * units[text[-1].lower()] if text[-1].lower() in units else int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target-rows", type=int, default=50_000_000)
    parser.add_argument("--source-rows", type=int, default=10_000_000)
    parser.add_argument("--memory", default="1g",
                        help="executor and driver memory, and delta-rs's cap (default 1g)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="default: $TMPDIR/beyond-memory-TARGETxSOURCE")  # fmt: skip
    parser.add_argument("--skip-uncapped", action="store_true", help="do not run delta-rs without a cap")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    default_work = Path(tempfile.gettempdir()) / f"beyond-memory-{args.target_rows}x{args.source_rows}"
    work = args.work_dir or default_work
    work.mkdir(parents=True, exist_ok=True)
    pristine, source = prepare(work, args.target_rows, args.source_rows)
    load_start = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="beyond-memory-", dir=work) as scratch_dir:
        scratch = Path(scratch_dir)
        target = scratch / "job-target"
        shutil.copytree(pristine, target)
        print("job: spark-submit on a standalone cluster ...", flush=True)
        with StandaloneCluster(scratch / "cluster", workers=2) as cluster:
            results.append(run_job(cluster, target, source, args.memory, scratch))
        shutil.rmtree(target)
        cap = _size(args.memory) + _OVERHEAD
        runs = [(cap, "address-space"), (cap, "resident")] + ([] if args.skip_uncapped else [(None, "")])
        for limit, kind in runs:
            target = scratch / "delta-rs-target"
            shutil.copytree(pristine, target)
            print(f"delta-rs: {f'{kind} capped at {limit >> 20} MiB' if limit else 'no cap'} ...", flush=True)
            results.append(run_delta_rs(target, source, limit, kind))
            shutil.rmtree(target)
    load_end = os.getloadavg()[0]
    rows = args.target_rows + args.source_rows
    print(f"\n== {args.target_rows:,}-row target, {args.source_rows:,}-row source, upsert; 2 cores, "
          f"load average {load_start:.1f} at start, {load_end:.1f} at end ==")  # fmt: skip
    for r in results:
        r["rows_per_second"] = rows / r["seconds"] if r["outcome"] == "completed" else None
        peak = r.get("peak_process_bytes")
        total = r.get("peak_total_bytes")
        print(f"  {r['engine']:<28} {r['outcome']:<18} {r['seconds']:8.1f} s  "
              f"{(r['rows_per_second'] or 0):>12,.0f} rows/s  peak process "
              f"{(peak or 0) / 2**20:8.0f} MiB"
              + (f"  all processes {total / 2**20:8.0f} MiB" if total else ""))
        if r.get("error"):
            print(f"    {r['error'].strip().splitlines()[-1][:300]}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"beyond_memory-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"target_rows": args.target_rows, "source_rows": args.source_rows,
                               "memory": args.memory, "load_average": [load_start, load_end],
                               "results": results}, indent=2), encoding="utf-8")  # fmt: skip
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
