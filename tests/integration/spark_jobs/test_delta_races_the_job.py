"""Delta as the other writer, on a local table: Delta's own MERGE, UPDATE, DELETE, INSERT and OPTIMIZE
(delta-spark 4.4) race the job's merge, each writer in a process of its own, and the same race with Delta's
MERGE in the job's place is the reference (tests/support/delta_races.py). For every pair, in both orders:

* the pair conflicts (the loser fails, with the same error class) exactly when the same pair conflicts with
  Delta's MERGE in the job's place;
* the table then holds the same rows as after Delta's race: no row lost or doubled;
* the log shows the race was real: the loser read the version the winner read, the winner took the next.

Both writers' sessions have Delta's extension and catalog loaded: the job runs there unchanged.
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
from tests.support.race_writer import RaceWriter

pytestmark = pytest.mark.xdist_group("delta-races")


@pytest.fixture(scope="module")
def writers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RaceWriter, RaceWriter]]:
    with writer_pair(tmp_path_factory.mktemp("race-writers")) as writers:
        yield writers


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(root=str(tmp_path / "tables"), gates=tmp_path / "gates")


@pytest.mark.parametrize(("winner", "expected"), [p[1:] for p in JOB_LOSES], ids=[p[0] for p in JOB_LOSES])
def test_the_job_losing_to_delta_conflicts_as_delta_s_merge_would(
    writers: tuple[RaceWriter, RaceWriter], lake: Lake, winner: Write, expected: str | None
) -> None:
    job, delta = race_both(writers, lake, "t", job_loses=True, merge=MERGE_A, other=winner)
    check_same(job, delta, expected)


@pytest.mark.parametrize(("loser", "expected"), [p[1:] for p in DELTA_LOSES], ids=[p[0] for p in DELTA_LOSES])
def test_delta_losing_to_the_job_conflicts_as_it_would_losing_to_delta_s_merge(
    writers: tuple[RaceWriter, RaceWriter], lake: Lake, loser: Write, expected: str | None
) -> None:
    job, delta = race_both(writers, lake, "t", job_loses=False, merge=MERGE_A, other=loser)
    check_same(job, delta, expected)
