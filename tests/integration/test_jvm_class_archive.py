"""The test JVMs' class archive (tests/support/jvm.py) is made, and spark-submit maps it by both routes the
tests give their options: ``spark.driver.extraJavaOptions`` and ``SPARK_SUBMIT_OPTS``.

``-Xshare:on`` makes a JVM that cannot map the archive fail at start instead of starting without it
(the tests' own JVMs run ``-Xshare:auto``, the default, which would only make them slower)."""

from __future__ import annotations

import os
import subprocess

from tests.support import jvm
from tests.support.submit_harness import SPARK_SUBMIT


def _spark_submit_version(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SPARK_SUBMIT), *args, "--version"], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_spark_submit_maps_the_class_archive_from_its_conf_and_from_spark_submit_opts() -> None:
    archive = jvm.class_archive(wait=True)
    assert archive is not None, f"the class archive could not be made: {jvm.failure()}"
    forced = f"{jvm.fast_jvm_options()} -Xshare:on"
    assert f"-XX:SharedArchiveFile={archive}" in forced

    by_conf = _spark_submit_version("--conf", f"spark.driver.extraJavaOptions={forced}")
    assert by_conf.returncode == 0, by_conf.stdout + by_conf.stderr
    assert "version" in by_conf.stdout + by_conf.stderr

    # A conf value with spaces, quoted as submit_opts quotes it, must not split the JVM's options.
    opts = jvm.submit_opts({"spark.executor.extraJavaOptions": jvm.FAST_JVM, "spark.ui.enabled": "false"})
    by_opts = _spark_submit_version(env={"SPARK_SUBMIT_OPTS": f"{opts} -Xshare:on"})
    assert by_opts.returncode == 0, by_opts.stdout + by_opts.stderr
    assert "version" in by_opts.stdout + by_opts.stderr
