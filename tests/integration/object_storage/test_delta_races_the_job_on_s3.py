"""Delta as the other writer on the S3 server: Delta's own statements (delta-spark 4.4 with Hadoop's S3A
connector) race the job's merge on one table at ``s3://``, each writer in a process of its own, and the
same race with Delta's MERGE in the job's place is the reference (tests/support/delta_races.py; the local
table's races are tests/integration/spark_jobs/test_delta_races_the_job.py, every pair; here one pair of
each kind of outcome). The pair conflicts exactly when it conflicts between two Delta writers, with the
same error class, and the table holds the same rows.

Each race is sequenced by its gate (the loser commits only after the winner has), as Delta's S3 log store
needs: ``S3SingleDriverLogStore`` checks that the version is free, then uploads without a condition, so two
writers committing the same version at once could overwrite each other's commit
(tests/integration/object_storage/test_delta_on_s3.py shows it). The job commits with put-if-absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.delta_races import (
    DELTA_LOSES,
    JOB_LOSES,
    MERGE_A,
    Lake,
    Write,
    check_same,
    race_both,
    writer_pair,
)  # fmt: skip
from tests.support.object_store_fixtures import own_s3_server  # noqa: F401  (the fixture s3_server, own)
from tests.support.race_writer import RaceWriter
from tests.support.s3_server import REGION, S3Server

# One pair of each kind: a conflict over a rewritten file, a blind append where the merge read, no conflict
# (another partition), and Delta's compaction losing to the job.
ON_S3 = ("update-same-file", "blind-insert-where-read", "merge-other-partition")
JOB_LOSES_ON_S3 = [pair for pair in JOB_LOSES if pair[0] in ON_S3]
DELTA_LOSES_ON_S3 = [pair for pair in DELTA_LOSES if pair[0] in ("optimize", "merge-same-partition")]


@pytest.fixture(scope="module")
def writers(
    s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RaceWriter, RaceWriter]]:
    """Two writer processes with Delta and S3A on the S3 server; the key reaches them on stdin."""
    key = s3_server.admin
    s3 = {"endpoint": s3_server.endpoint, "region": REGION, "access_key_id": key.access_key_id,
          "secret_access_key": key.secret_access_key}  # fmt: skip
    logs = tmp_path_factory.mktemp("s3-race-writers")
    with writer_pair(logs, s3=s3, storage_options=s3_server.storage_options()) as writers:
        yield writers


@pytest.fixture
def lake(s3_server: S3Server, bucket: str, tmp_path: Path) -> Lake:
    options = s3_server.storage_options()
    return Lake(root=f"s3://{bucket}/races", gates=tmp_path / "gates", storage_options=options)


@pytest.mark.parametrize(
    ("winner", "expected"), [p[1:] for p in JOB_LOSES_ON_S3], ids=[p[0] for p in JOB_LOSES_ON_S3]
)
def test_the_job_losing_to_delta_on_s3_conflicts_as_delta_s_merge_would(
    writers: tuple[RaceWriter, RaceWriter], lake: Lake, winner: Write, expected: str | None
) -> None:
    job, delta = race_both(writers, lake, "t", job_loses=True, merge=MERGE_A, other=winner)
    check_same(job, delta, expected)


@pytest.mark.parametrize(
    ("loser", "expected"), [p[1:] for p in DELTA_LOSES_ON_S3], ids=[p[0] for p in DELTA_LOSES_ON_S3]
)
def test_delta_losing_to_the_job_on_s3_conflicts_as_it_would_losing_to_delta_s_merge(
    writers: tuple[RaceWriter, RaceWriter], lake: Lake, loser: Write, expected: str | None
) -> None:
    job, delta = race_both(writers, lake, "t", job_loses=False, merge=MERGE_A, other=loser)
    check_same(job, delta, expected)


def test_the_writers_keep_the_s3_key_off_their_command_lines_and_environments(
    writers: tuple[RaceWriter, RaceWriter], s3_server: S3Server
) -> None:
    secret = s3_server.admin.secret_access_key
    for writer in writers:
        pids = [writer.process.pid, *_children(writer.process.pid)]
        for pid in pids:
            for kind in ("cmdline", "environ"):
                try:  # Spark's Python workers come and go
                    text = Path(f"/proc/{pid}/{kind}").read_bytes().decode(errors="replace")
                except (FileNotFoundError, ProcessLookupError):
                    continue
                assert secret not in text, (pid, kind)


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return []
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for child in children:
            found += [int(child), *_children(int(child))]
    return found
