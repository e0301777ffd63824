"""Delta Lake's own JVM implementation (delta-spark) for the tests: its jars, and the confs of a session
that has Delta's SQL extension and catalog loaded.

Delta is the reference the job is tested against and the other writer it must coexist with; the job itself
never needs it. The jar is the one Delta's pip package names (``delta.pip_utils``:
``io.delta:delta-spark_<pyspark major.minor>_2.13:<delta-spark's version>``), so the pip pin in the dev
extra pins the jars too. Spark's own dependency resolver (Ivy, in ``spark-submit --packages``) fetches it
and what it pulls from Maven Central (``~/.m2`` when Central cannot be reached), once per virtualenv,
into ``.venv/delta-jars/``: Java is the only prerequisite, not Maven. Ivy's default chain looks in ``~/.m2``
first and fails on an entry there that has a POM but no jar (what ``mvn dependency:get`` leaves for a
provided dependency), so it gets settings of its own. Of what Delta pulls, the jars pyspark ships already
(Parquet, Hadoop's client, compression codecs, in Spark's own versions) are left out, as a cluster's Spark
provides them. ``scripts/test`` runs ``python -m tests.support.delta_spark``
before pytest (not for ``--fast``: the fast tier needs no jars); a test session that finds no jars fetches
them under a lock.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark

__all__ = ["DELTA_ARTIFACT", "DeltaJarsUnavailable", "delta_jars", "delta_session_confs"]

SCALA_VERSION = "2.13"
DELTA_VERSION = importlib.metadata.version("delta-spark")
DELTA_ARTIFACT = (
    f"io.delta:delta-spark_{'.'.join(pyspark.__version__.split('.')[:2])}_{SCALA_VERSION}:{DELTA_VERSION}"
)
# Beside the interpreter, as the class archive: a fresh virtualenv (a clean clone's) fetches its own.
JARS_ROOT = Path(sys.prefix) / "delta-jars"
_JARS_DIR = JARS_ROOT / DELTA_ARTIFACT.replace(":", "_")
_FETCH_TIMEOUT_S = 900
_CENTRAL = "https://repo1.maven.org/maven2"
_IVY_SETTINGS = """<ivysettings>
  <settings defaultResolver="central-then-m2"/>
  <resolvers>
    <chain name="central-then-m2" returnFirst="true">
      <ibiblio name="central" m2compatible="true" root="{central}/"/>
      <ibiblio name="m2" m2compatible="true" root="{m2}"/>
    </chain>
  </resolvers>
</ivysettings>
"""


class DeltaJarsUnavailable(RuntimeError):
    """Delta's jars are not in this virtualenv and could not be fetched."""


def delta_jars() -> list[Path]:
    """The jars of :data:`DELTA_ARTIFACT` and what it pulls, fetched first if this virtualenv has none."""
    jars = sorted(_JARS_DIR.glob("*.jar"))
    if jars:
        return jars
    JARS_ROOT.mkdir(parents=True, exist_ok=True)
    with (JARS_ROOT / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not any(_JARS_DIR.glob("*.jar")):  # else fetched by the process that held the lock before
            _fetch()
    return sorted(_JARS_DIR.glob("*.jar"))


def delta_session_confs() -> dict[str, str]:
    """The confs of a Spark session with Delta loaded: its jars, its SQL extension, its catalog."""
    return {
        "spark.jars": ",".join(str(jar) for jar in delta_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Delta replays its log over 50 partitions by default: on tables of a few files, 2 cut each of its
        # MERGEs here from ~10 s to ~2-4 s. It changes no result.
        "spark.databricks.delta.snapshotPartitions": "2",
    }


def _fetch() -> None:
    """Resolve DELTA_ARTIFACT with spark-submit's --packages (an application that does nothing) into a
    scratch Ivy home, then move its jars into place whole."""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    with tempfile.TemporaryDirectory(prefix="delta-jars-", dir=JARS_ROOT) as scratch:
        ivy = Path(scratch, "ivy")
        settings = Path(scratch, "ivysettings.xml")
        m2 = (Path.home() / ".m2" / "repository").as_uri()
        settings.write_text(_IVY_SETTINGS.format(central=_CENTRAL, m2=m2), encoding="utf-8")
        nothing = Path(scratch, "nothing.py")
        nothing.write_text("", encoding="utf-8")
        command = [str(spark_submit), "--master", "local[1]", "--packages", DELTA_ARTIFACT,
                   "--conf", f"spark.jars.ivy={ivy}", "--conf", f"spark.jars.ivySettings={settings}",
                   str(nothing)]  # fmt: skip
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as timeout:
            raise DeltaJarsUnavailable(
                f"Could not fetch Delta's jars ({DELTA_ARTIFACT}): resolving them from Maven Central "
                f"({_CENTRAL}) and ~/.m2 ran over {timeout.timeout} s."
            ) from None
        provided = _spark_artifacts()
        fetched = [jar for jar in sorted((ivy / "jars").glob("*.jar"))
                   if _ivy_artifact(jar.name) not in provided]  # fmt: skip
        if done.returncode != 0 or not fetched:
            unresolved = [line.strip() for line in done.stderr.splitlines()
                          if "not found" in line or "UNRESOLVED" in line or "::" in line]  # fmt: skip
            detail = "\n".join(unresolved[-12:]) or done.stderr[-2000:]
            raise DeltaJarsUnavailable(
                f"Could not fetch Delta's jars ({DELTA_ARTIFACT}, the version of the pip package "
                f"delta-spark {DELTA_VERSION}) from Maven Central ({_CENTRAL}) or ~/.m2: spark-submit "
                f"--packages exited {done.returncode}. The tests that run Delta beside the job need them; "
                "check that Maven Central is reachable (or put the jars in ~/.m2), then run the tests "
                f"again.\n{detail}"
            )
        staged = Path(scratch, "jars")
        staged.mkdir()
        for jar in fetched:
            shutil.copy2(jar, staged / jar.name)
        os.replace(staged, _JARS_DIR)  # whole or not at all


def _artifact(jar_name: str) -> str:
    """A jar's artifact: ``parquet-hadoop-1.17.0.jar`` -> ``parquet-hadoop``."""
    return re.sub(r"-\d[\w.+-]*$", "", jar_name.removesuffix(".jar"))


def _ivy_artifact(jar_name: str) -> str:
    """:func:`_artifact` of a jar Ivy retrieved, named ``<organisation>_<artifact>-<version>.jar``."""
    return _artifact(jar_name.split("_", 1)[1])


def _spark_artifacts() -> set[str]:
    return {_artifact(jar.name) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def main() -> int:
    try:
        jars = delta_jars()
    except DeltaJarsUnavailable as unavailable:
        print(f"delta-jars: {unavailable}", file=sys.stderr)
        return 1
    print(f"delta-jars: {DELTA_ARTIFACT}: {len(jars)} jars in {_JARS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
