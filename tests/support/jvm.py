"""The JVM options of every Spark process the tests start, and the class-data-sharing archive they map.

Each test JVM (the shared session, the Connect server, the standalone daemons and executors, every
spark-submit) runs the JIT's first tier and the serial collector: test queries are small and many, so
the optimizing compiler's and G1's threads cost CPU the other xdist worker needs.

Each also maps a class-data-sharing archive (the JDK's dynamic CDS archive, ``-XX:SharedArchiveFile``):
the classes a merge loads, already parsed and verified, instead of reading them from Spark's ~250 jars.
Measured on this machine, a cold spark-submit of a small merge: 16 s wall and 16.7 s of CPU without the
archive, 10.5 s and 11.3 s with it; a cold session's start halves. The suite starts dozens of cold JVMs.

The archive is made once per Java, pyspark and option set (one small merge under spark-submit with
``-XX:ArchiveClassesAtExit``, ~40 s). ``scripts/test`` makes it before pytest starts, while ruff, mypy
and MkDocs run (:mod:`tests.support.prepare`); otherwise the first test process that asks for it makes it,
under a lock, and a process that finds the lock taken does not wait: its JVMs start without the archive
until the archive exists.

A JVM maps an archive only if its class path is the one the archive was made with. Spark puts
``SPARK_CONF_DIR`` on the class path, so no test sets it: confs go on the command line, in the builder,
or (for the spark-submits Airflow starts) in ``SPARK_SUBMIT_OPTS`` (:func:`submit_opts`). A JVM whose
class path differs starts without the archive (``-Xshare:auto``, the default); ``-Xlog:cds*=off`` keeps
its warning out of the job's stdout, and ``tests/integration/test_jvm_class_archive.py`` checks that
spark-submit does map it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

import pyspark

__all__ = [
    "FAST_JVM", "FAST_START", "class_archive", "failure", "fast_jvm_options", "make_class_archive",
    "submit_opts",
]

ROOT = Path(__file__).resolve().parents[2]
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# A cold driver spends most of a small merge compiling: no codegen (with FAST_JVM) cut ~25% off each
# spark-submit here. Test-only settings; they change no result. The archive is made under them too.
FAST_START = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# Beside the interpreter, so a fresh virtualenv (a clean clone's) makes its own and git never sees it.
ARCHIVE_DIR = Path(sys.prefix) / "spark-class-archive"
_QUIET = "-Xlog:cds*=off"
_TRAINING_MERGE = (
    "MERGE INTO target t USING source s ON t.id = s.id "
    "WHEN MATCHED AND s.v = 'gone' THEN DELETE "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
)


def _archive_path() -> Path:
    """The archive for this Java, this pyspark's jars and FAST_JVM: a change of any makes a new one."""
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home, "bin", "java") if java_home else Path(shutil.which("java") or "java")
    jars = sorted(path.name for path in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    real_java = java.resolve()
    built = str(real_java.stat().st_mtime) if real_java.exists() else ""
    facts = [str(real_java), built, pyspark.__version__, FAST_JVM, *jars]
    key = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]
    return ARCHIVE_DIR / f"spark-{pyspark.__version__}-{key}.jsa"


# Why this process could not make the archive (it does not try twice).
_FAILED: list[str] = []


def failure() -> str | None:
    """Why this process could not make the archive, if it tried and could not."""
    return _FAILED[-1] if _FAILED else None


def class_archive(*, wait: bool = False) -> Path | None:
    """The archive, made now if no other process is making it; None while another one is (unless
    ``wait``), or if making it failed in this process (a warning says why)."""
    archive = _archive_path()
    if archive.is_file():
        return archive
    if _FAILED:
        return None
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    with (ARCHIVE_DIR / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        if not archive.is_file():  # else made by the process that held the lock before this one
            # Left by a process killed while dumping (the lock is ours, so no dump is under way).
            for stale in ARCHIVE_DIR.glob(".*.partial"):
                stale.unlink(missing_ok=True)
            error = make_class_archive(archive)
            if error is not None:
                _FAILED.append(error)
                warnings.warn(f"no JVM class archive (Spark's JVMs start slower): {error[-2000:]}",
                              stacklevel=2)
                return None
    return archive


def fast_jvm_options() -> str:
    """FAST_JVM and, once it exists, the class archive (``spark.driver.extraJavaOptions`` and the like)."""
    archive = class_archive()
    return f"{FAST_JVM} {_QUIET} -XX:SharedArchiveFile={archive}" if archive else FAST_JVM


def submit_opts(confs: Mapping[str, str]) -> str:
    """``SPARK_SUBMIT_OPTS`` that start spark-submit's JVM with :func:`fast_jvm_options` and give it
    ``confs`` as system properties, which Spark reads as confs below any ``--conf`` (the place of
    spark-defaults.conf, without a SPARK_CONF_DIR on the class path)."""
    options = [fast_jvm_options()]
    for key, value in confs.items():
        if key == "spark.driver.extraJavaOptions":
            raise ValueError("the driver's JVM options are fast_jvm_options(): its JVM has started by then")
        if '"' in value:
            raise ValueError(f"{key}: a double quote cannot be passed through SPARK_SUBMIT_OPTS: {value!r}")
        options.append(f'"-D{key}={value}"' if " " in value else f"-D{key}={value}")
    return " ".join(options)


def make_class_archive(archive: Path) -> str | None:
    """Run one small merge under spark-submit that writes its loaded classes to ``archive`` at exit;
    the error output if it fails (None when the archive is there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        work = Path(scratch)
        schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
        target = pa.table({"id": list(range(100)), "v": ["a"] * 100}, schema=schema)
        write_deltalake(str(work / "target"), target)
        (work / "source").mkdir()
        pq.write_table(pa.table({"id": [1, 2, 300], "v": ["gone", "b", "c"]}, schema=schema),
                       work / "source" / "part-0.parquet")  # fmt: skip
        spec = {"target": {"uri": str(work / "target")}, "source": {"uri": str(work / "source")},
                "merge_sql": _TRAINING_MERGE}  # fmt: skip
        (work / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        # Dumped beside its final name (a rename across file systems would copy), under a name no JVM maps.
        dumped = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
        dump = f"{FAST_JVM} -XX:ArchiveClassesAtExit={dumped}"
        confs = {**FAST_START, "spark.driver.extraJavaOptions": dump}
        command = [str(bin_dir / "spark-submit"), "--master", "local[2]"]
        for key, value in confs.items():
            command += ["--conf", f"{key}={value}"]
        job = ROOT / "spark_jobs" / "delta_merge" / "__main__.py"
        command += [str(job), "--spec", str(work / "spec.json")]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        try:
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as timeout:
            dumped.unlink(missing_ok=True)
            return f"the merge that makes the archive ran over {timeout.timeout} s"
        if done.returncode != 0 or not dumped.is_file():
            dumped.unlink(missing_ok=True)
            return f"spark-submit exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        os.replace(dumped, archive)  # whole or not at all: a JVM never maps a half-written archive
    return None
