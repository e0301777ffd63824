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

The same step fetches Hadoop's S3A connector, for the tests where Delta itself reads and writes tables on
the test S3 server (:func:`delta_s3_session_confs`): ``org.apache.hadoop:hadoop-aws`` in the version of
the Hadoop client pyspark ships (read from the name of its ``hadoop-client-api`` jar), with what it pulls
at run time (the AWS SDK v2 bundle, the analytics accelerator, wildfly-openssl), into a folder of its own
beside Delta's. It is the costly part, once per virtualenv: 4 jars, 690 MB, of which the SDK's bundle
(``software.amazon.awssdk:bundle``) is 686 MB; 12-13 s here from Maven Central, a spark-submit's start
included (Delta's own: 11 jars, 14 MB).
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

__all__ = [
    "DELTA_ARTIFACT", "HADOOP_AWS_ARTIFACT", "S3A_KEY_CONFS", "DeltaJarsUnavailable", "delta_jars",
    "delta_package_confs",
    "delta_s3_session_confs", "delta_session_confs", "s3a_jars",
]  # fmt: skip

SCALA_VERSION = "2.13"
DELTA_VERSION = importlib.metadata.version("delta-spark")
DELTA_ARTIFACT = (
    f"io.delta:delta-spark_{'.'.join(pyspark.__version__.split('.')[:2])}_{SCALA_VERSION}:{DELTA_VERSION}"
)
# Beside the interpreter, as the class archive: a fresh virtualenv (a clean clone's) fetches its own.
JARS_ROOT = Path(sys.prefix) / "delta-jars"
_JARS_DIR = JARS_ROOT / DELTA_ARTIFACT.replace(":", "_")
# Under JARS_ROOT (read when called, as a test moves it): the Ivy home Delta's jars were resolved in, kept,
# so that a later ``--packages`` of DELTA_ARTIFACT with these settings (the delta engine's spark-submit)
# resolves from its cache, not from the network again; and those settings.
_DELTA_IVY_HOME, _DELTA_IVY_SETTINGS = "ivy", "ivysettings.xml"
_PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"


def _hadoop_version() -> str:
    """The version of the Hadoop client pyspark ships: ``hadoop-client-api-3.5.0.jar`` -> ``3.5.0``."""
    names = sorted(jar.name for jar in _PYSPARK_JARS.glob("hadoop-client-api-*.jar"))
    if len(names) != 1:
        raise RuntimeError(f"expected one hadoop-client-api jar in {_PYSPARK_JARS}, found {names}")
    return names[0].removeprefix("hadoop-client-api-").removesuffix(".jar")


# Hadoop's S3A connector, in the version of pyspark's Hadoop client (its classes must match them).
HADOOP_AWS_ARTIFACT = f"org.apache.hadoop:hadoop-aws:{_hadoop_version()}"
_S3A_JARS_DIR = JARS_ROOT / HADOOP_AWS_ARTIFACT.replace(":", "_")
# The confs of delta_s3_session_confs that hold the S3 key. Classic pyspark's builder hands every conf to
# spark-submit as ``--conf key=value`` (pyspark.java_gateway.launch_gateway): these go on the session's
# Hadoop configuration once it runs (``spark.sparkContext._jsc.hadoopConfiguration().set``, without the
# ``spark.hadoop.`` prefix), before its first S3 access.
S3A_KEY_CONFS = ("spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key")
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
    return _jars(DELTA_ARTIFACT, _JARS_DIR, "Delta's jars",
                 f"the version of the pip package delta-spark {DELTA_VERSION}")  # fmt: skip


def delta_package_confs() -> dict[str, str]:
    """Confs with which spark-submit ``--packages`` :data:`DELTA_ARTIFACT` resolves from the Ivy cache that
    fetched Delta's jars (Maven Central first, ``~/.m2`` as fallback, as :func:`delta_jars` resolves)."""
    delta_jars()
    settings = JARS_ROOT / _DELTA_IVY_SETTINGS
    if not settings.is_file():
        _write_ivy_settings(settings)
    return {"spark.jars.ivy": str(JARS_ROOT / _DELTA_IVY_HOME), "spark.jars.ivySettings": str(settings)}


def _write_ivy_settings(path: Path) -> None:
    m2 = (Path.home() / ".m2" / "repository").as_uri()
    path.write_text(_IVY_SETTINGS.format(central=_CENTRAL, m2=m2), encoding="utf-8")


def s3a_jars() -> list[Path]:
    """The jars of :data:`HADOOP_AWS_ARTIFACT` and what it pulls at run time (the AWS SDK bundle), fetched
    first if this virtualenv has none."""
    return _jars(HADOOP_AWS_ARTIFACT, _S3A_JARS_DIR, "Hadoop's S3A connector",
                 "the version of the Hadoop client pyspark ships")  # fmt: skip


def _jars(artifact: str, jars_dir: Path, what: str, version_from: str) -> list[Path]:
    jars = sorted(jars_dir.glob("*.jar"))
    if jars:
        return jars
    JARS_ROOT.mkdir(parents=True, exist_ok=True)
    with (JARS_ROOT / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not any(jars_dir.glob("*.jar")):  # else fetched by the process that held the lock before
            _fetch(artifact, jars_dir, what, version_from)
    return sorted(jars_dir.glob("*.jar"))


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


def delta_s3_session_confs(
    endpoint: str, access_key_id: str, secret_access_key: str, region: str
) -> dict[str, str]:
    """:func:`delta_session_confs` plus Hadoop's S3A connector on the S3 API at ``endpoint`` (plain HTTP,
    path-style, a static key), for ``s3a://`` and ``s3://`` alike, so that Delta reads and writes the same
    ``s3://bucket/path`` URIs as the job and deltalake. The key is in the confs :data:`S3A_KEY_CONFS`,
    which must not reach a command line: a classic session's builder would put them on its JVM's."""
    confs = delta_session_confs()
    confs["spark.jars"] = ",".join(str(jar) for jar in [*delta_jars(), *s3a_jars()])
    s3a = "org.apache.hadoop.fs.s3a"
    confs.update({
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": region,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.aws.credentials.provider": f"{s3a}.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.access.key": access_key_id,
        "spark.hadoop.fs.s3a.secret.key": secret_access_key,
        # s3:// (which Hadoop 3 maps to no file system) through S3A too. Delta picks its log store by
        # scheme and gives s3 and s3a the same one already (S3SingleDriverLogStore): no conf needed.
        "spark.hadoop.fs.s3.impl": f"{s3a}.S3AFileSystem",
    })  # fmt: skip
    return confs


def _fetch(artifact: str, jars_dir: Path, what: str, version_from: str) -> None:
    """Resolve ``artifact`` with spark-submit's --packages (an application that does nothing) into a
    scratch Ivy home, then move its jars, less those pyspark ships, into ``jars_dir`` whole."""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    with tempfile.TemporaryDirectory(prefix="delta-jars-", dir=JARS_ROOT) as scratch:
        # Delta's cache is kept (delta_package_confs); the S3A connector's (the 690 MB SDK bundle) is not.
        ivy = JARS_ROOT / _DELTA_IVY_HOME if artifact == DELTA_ARTIFACT else Path(scratch, "ivy")
        settings = Path(scratch, "ivysettings.xml")
        _write_ivy_settings(settings)
        nothing = Path(scratch, "nothing.py")
        nothing.write_text("", encoding="utf-8")
        command = [str(spark_submit), "--master", "local[1]", "--packages", artifact,
                   "--conf", f"spark.jars.ivy={ivy}", "--conf", f"spark.jars.ivySettings={settings}",
                   str(nothing)]  # fmt: skip
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as timeout:
            raise DeltaJarsUnavailable(
                f"Could not fetch {what} ({artifact}): resolving them from Maven Central "
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
                f"Could not fetch {what} ({artifact}, {version_from}) from Maven Central ({_CENTRAL}) "
                f"or ~/.m2: spark-submit --packages exited {done.returncode}. The tests that run Delta "
                "itself need them; check that Maven Central is reachable (or put the jars in ~/.m2), then "
                f"run the tests again.\n{detail}"
            )
        staged = Path(scratch, "jars")
        staged.mkdir()
        for jar in fetched:  # moved, not copied: the AWS SDK's bundle is ~690 MB
            shutil.move(jar, staged / jar.name)
        os.replace(staged, jars_dir)  # whole or not at all


def _artifact(jar_name: str) -> str:
    """A jar's artifact: ``parquet-hadoop-1.17.0.jar`` -> ``parquet-hadoop``."""
    return re.sub(r"-\d[\w.+-]*$", "", jar_name.removesuffix(".jar"))


def _ivy_artifact(jar_name: str) -> str:
    """:func:`_artifact` of a jar Ivy retrieved, named ``<organisation>_<artifact>-<version>.jar``."""
    return _artifact(jar_name.split("_", 1)[1])


def _spark_artifacts() -> set[str]:
    return {_artifact(jar.name) for jar in _PYSPARK_JARS.glob("*.jar")}


def main() -> int:
    for artifact, jars_dir, fetch in [(DELTA_ARTIFACT, _JARS_DIR, delta_jars),
                                      (HADOOP_AWS_ARTIFACT, _S3A_JARS_DIR, s3a_jars)]:  # fmt: skip
        try:
            jars = fetch()
        except DeltaJarsUnavailable as unavailable:
            print(f"delta-jars: {unavailable}", file=sys.stderr)
            return 1
        size = sum(jar.stat().st_size for jar in jars) / 1e6
        print(f"delta-jars: {artifact}: {len(jars)} jars, {size:.0f} MB in {jars_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
