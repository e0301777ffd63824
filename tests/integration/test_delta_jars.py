"""Delta's jars (tests/support/delta_spark.py): without a repository that has them, the fetch stops with a
message naming the artifact and what Spark's resolver could not resolve, and leaves no partial jar folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import delta_spark
from tests.support.local_servers import free_port


def test_without_a_reachable_repository_the_fetch_stops_naming_what_it_could_not_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Maven Central replaced by a loopback port nothing listens on, ~/.m2 by an empty home.
    monkeypatch.setattr(delta_spark, "_CENTRAL", f"http://127.0.0.1:{free_port()}/maven2")
    monkeypatch.setattr(delta_spark, "JARS_ROOT", tmp_path / "delta-jars")
    monkeypatch.setattr(delta_spark, "_JARS_DIR", tmp_path / "delta-jars" / "fetched")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    with pytest.raises(delta_spark.DeltaJarsUnavailable) as refused:
        delta_spark.delta_jars()

    message = str(refused.value)
    assert f"Could not fetch Delta's jars ({delta_spark.DELTA_ARTIFACT}" in message
    # Ivy's own line for the artifact it could not find (organisation#module;version).
    group, module, version = delta_spark.DELTA_ARTIFACT.split(":")
    assert f"{group}#{module};{version}" in message
    assert not (tmp_path / "delta-jars" / "fetched").exists()
