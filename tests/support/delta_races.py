"""Races between Delta's own writers (delta-spark) and the job's merge on one table, each writer in a
process of its own (tests/support/race_writer.py), with Delta's MERGE in the job's place as the reference.

Each race is made deterministic by a gate: the loser's statement holds its read version at a Python UDF
that blocks until the winner has committed, so the loser always commits (or fails to) on top of a commit it
did not read. A :class:`Lake` says where the tables live: a local folder or the S3 server.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from spark_jobs.delta_merge.protocol.delta_log import read_commit_actions
from tests.support.race_writer import RaceWriter

__all__ = [
    "DELTA_LOSES", "JOB_LOSES", "MERGE_A", "Lake", "Race", "Write", "check_same", "race_both", "writer_pair",
]  # fmt: skip

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("v", pa.string())])
# (partition, ids) of the table's four data files, one append each: versions 0 to 3.
FILES = (("a", range(1, 6)), ("a", range(6, 11)), ("b", range(11, 16)), ("b", range(16, 21)))
INITIAL_VERSION = len(FILES) - 1
GATED_SOURCE = "SELECT * FROM src WHERE race_gate(id)"
_GATE_REACHED_S = 180.0

Row = tuple[int, str, str]


@dataclass(frozen=True)
class Write:
    """One writer's statement. ``statement`` is Delta's, on ``{table}``; its rows pass ``race_gate``. A
    merge (``on`` and ``clauses`` set) runs through the job as well: ``MERGE INTO t USING s ON ...``."""

    name: str
    statement: str = ""
    source: tuple[Row, ...] = ()
    on: str = ""
    clauses: str = "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"

    @property
    def is_merge(self) -> bool:
        return bool(self.on)

    def delta_command(self, table: str) -> dict[str, Any]:
        if self.is_merge:
            sql = f"MERGE INTO delta.`{table}` t USING ({GATED_SOURCE}) s ON {self.on} {self.clauses}"
        else:
            sql = self.statement.format(table=f"delta.`{table}`")
        return {"sql": sql, "source": [list(row) for row in self.source]}

    def job_command(self, table: str) -> dict[str, Any]:
        assert self.is_merge, self.name
        spec = {"target": {"uri": table}, "source": {"query": GATED_SOURCE},
                "merge_sql": f"MERGE INTO t USING s ON {self.on} {self.clauses}"}  # fmt: skip
        return {"merge": spec, "source": [list(row) for row in self.source]}


# The job's merges: upserts whose ON condition confines what they read to one partition.
MERGE_A = Write("merge in a", source=((1, "a", "m1"), (30, "a", "m30")), on="t.id = s.id AND t.p = 'a'")
MERGE_B = Write("merge in b", source=((12, "b", "m12"), (31, "b", "m31")), on="t.id = s.id AND t.p = 'b'")
# Delta's other statements.
UPDATE_A = Write("update in a", "UPDATE {table} SET v = 'new' WHERE p = 'a' AND id = 3 AND race_gate(id)")
UPDATE_B = Write("update in b", "UPDATE {table} SET v = 'new' WHERE p = 'b' AND id = 13 AND race_gate(id)")
DELETE_A = Write("delete in a", "DELETE FROM {table} WHERE p = 'a' AND id = 4 AND race_gate(id)")
INSERT_A = Write("insert into a", "INSERT INTO {table} " + GATED_SOURCE, source=((50, "a", "inserted"),))
# OPTIMIZE's WHERE may name partition columns only: the gate takes one.
OPTIMIZE = Write("optimize", "OPTIMIZE {table} WHERE race_gate(p)")


@dataclass
class Race:
    """What a race left: each writer's answer, the table's rows and commits after it."""

    loser: dict[str, Any]
    winner: dict[str, Any]
    rows: list[Row]
    commits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def conflict(self) -> str | None:
        """The loser's error class (None when it committed); any other failure fails the test."""
        if self.loser["ok"]:
            return None
        return str(self.loser["error_class"])


@contextlib.contextmanager
def writer_pair(
    logs: Path, *, s3: Mapping[str, str] | None = None, storage_options: Mapping[str, str] | None = None
) -> Iterator[tuple[RaceWriter, RaceWriter]]:
    """Two writer processes, each with its own Delta-enabled local SparkSession (``s3``: with S3A on the S3
    server, see RaceWriter); stopped by PID."""
    first, second = (RaceWriter(name, logs / f"{name}.log", s3=s3, storage_options=storage_options)
                     for name in ("first", "second"))  # fmt: skip
    try:
        first.wait_ready()
        second.wait_ready()
        yield first, second
    finally:
        first.stop()
        second.stop()


@dataclass(frozen=True)
class Lake:
    """Where a race's tables live: under ``root`` (a folder, or ``s3://bucket/prefix``), reached with
    ``storage_options``; ``gates`` is a local folder for the writers' gates."""

    root: str
    gates: Path
    storage_options: Mapping[str, str] = field(default_factory=dict)

    def new_table(self, name: str) -> str:
        """The table every race starts from: four data files in two partitions, versions 0-3."""
        uri = f"{self.root.rstrip('/')}/{name}"
        for partition, ids in FILES:
            rows = [{"id": i, "p": partition, "v": f"v{i}"} for i in ids]
            write_deltalake(uri, pa.Table.from_pylist(rows, schema=SCHEMA), mode="append", partition_by=["p"],
                            storage_options=dict(self.storage_options) or None)  # fmt: skip
        return uri

    def table(self, uri: str) -> DeltaTable:
        return DeltaTable(uri, storage_options=dict(self.storage_options) or None)


def race(
    loser: tuple[RaceWriter, dict[str, Any]], winner: tuple[RaceWriter, dict[str, Any]], lake: Lake,
    table: str, gate: Path,
) -> Race:
    """Start the loser, hold it at its gate with its version read, run the winner whole, then let the loser
    go on: it commits on top of the winner's commit, or fails."""
    (loser_writer, loser_command), (winner_writer, winner_command) = loser, winner
    gate.mkdir(parents=True)
    loser_writer.send({**loser_command, "gate": str(gate)})
    deadline = time.monotonic() + _GATE_REACHED_S
    while not (gate / "reached").exists():
        early = loser_writer.poll()
        assert early is None, f"the loser ended before its gate: {early}"
        assert time.monotonic() < deadline, "the loser never reached its gate"
        time.sleep(0.05)
    try:
        winner_writer.send(winner_command)
        winner_result = winner_writer.result()
    finally:
        (gate / "go").touch()
    loser_result = loser_writer.result()
    assert winner_result["ok"], winner_result
    commits = []
    delta_table = lake.table(table)
    for version in range(INITIAL_VERSION + 1, delta_table.version() + 1):
        actions = read_commit_actions(table, version, storage_options=dict(lake.storage_options) or None)
        assert actions is not None
        commits.extend(a["commitInfo"] for a in actions if "commitInfo" in a)
    rows = sorted((row["id"], row["p"], row["v"]) for row in delta_table.to_pyarrow_table().to_pylist())
    return Race(loser_result, winner_result, rows, commits)


def check_real(outcome: Race, loser_name: str) -> None:
    """The winner took the version after the one both read; a loser that committed took the next one,
    having read the same version as the winner."""
    assert outcome.commits, "nothing committed"
    assert outcome.commits[0]["readVersion"] == INITIAL_VERSION, outcome.commits
    if outcome.conflict is None:
        assert len(outcome.commits) == 2, (loser_name, outcome.commits)
        assert outcome.commits[1]["readVersion"] == INITIAL_VERSION, (loser_name, outcome.commits)
    else:
        assert len(outcome.commits) == 1, (loser_name, outcome.commits)


def race_both(
    writers: tuple[RaceWriter, RaceWriter], lake: Lake, name: str, *, job_loses: bool, merge: Write,
    other: Write,
) -> tuple[Race, Race]:
    """The race of ``merge`` through the job against Delta's ``other``, and the same race with Delta's MERGE
    in the job's place: (the job's, Delta's)."""
    loser_writer, winner_writer = writers
    outcomes = []
    for engine in ("job", "delta"):
        table = lake.new_table(f"{name}-{engine}")
        merge_command = merge.job_command(table) if engine == "job" else merge.delta_command(table)
        other_command = other.delta_command(table)
        if job_loses:
            loser, winner = (loser_writer, merge_command), (winner_writer, other_command)
        else:
            loser, winner = (loser_writer, other_command), (winner_writer, merge_command)
        outcome = race(loser, winner, lake, table, lake.gates / f"{name}-{engine}")
        check_real(outcome, engine)
        outcomes.append(outcome)
    return outcomes[0], outcomes[1]


def conflict_words(message: str) -> str:
    """The conflict's class and sentence, as Delta words it, its table's path left out."""
    found = re.search(r"\[(DELTA_[A-Z_.]+)\] ([^\n]*)", message)
    assert found is not None, message
    return re.sub(r"delta\.`[^`]*`", "delta.`...`", f"[{found.group(1)}] {found.group(2)}")


def check_same(job: Race, delta: Race, expected: str | None) -> None:
    """Delta's race went as Delta goes; the job's went the same way, in Delta's words, and left the same
    rows."""
    assert delta.conflict == expected, delta.loser
    assert job.conflict == delta.conflict, (job.loser, delta.loser)
    if expected is not None:
        assert conflict_words(job.loser["message"]) == conflict_words(delta.loser["message"])
    assert len({row[0] for row in job.rows}) == len(job.rows)  # no row doubled
    assert job.rows == delta.rows
    assert [c["operation"] for c in job.commits] == [c["operation"] for c in delta.commits]


APPEND = "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT"
DELETE_READ = "DELTA_CONCURRENT_DELETE_READ.WITH_PARTITION_HINT"
# Delta's statement wins, the job's merge (reading partition a) loses: what Delta's MERGE in its place met.
# Delta 4.4 runs MERGE, UPDATE, DELETE and INSERT at Serializable (blind appends where a merge read conflict)
# and OPTIMIZE at SnapshotIsolation; every add of a non-blind commit counts, a compaction's too.
JOB_LOSES: Sequence[tuple[str, Write, str | None]] = [
    ("update-same-file", UPDATE_A, APPEND),
    ("update-other-partition", UPDATE_B, None),
    ("delete-same-file", DELETE_A, APPEND),
    ("blind-insert-where-read", INSERT_A, APPEND),
    ("optimize", OPTIMIZE, APPEND),
    ("merge-other-partition", MERGE_B, None),
    ("merge-same-partition", MERGE_A, APPEND),
]
# The job's merge (in partition a) wins; Delta's statement loses, as it would to Delta's MERGE.
DELTA_LOSES: Sequence[tuple[str, Write, str | None]] = [
    ("update-same-file", UPDATE_A, APPEND),
    ("update-other-partition", UPDATE_B, None),
    ("blind-insert-where-read", INSERT_A, None),  # a blind append reads nothing
    ("optimize", OPTIMIZE, DELETE_READ),  # it adds no data: only its read files count
    ("merge-same-partition", MERGE_A, APPEND),
    ("merge-other-partition", MERGE_B, None),
]

