"""The merge job against delta-rs's own MERGE (an independent implementation) and Delta's own MERGE
(delta-spark 4.4, the reference) on seeded random merges.

Each case builds the same target three times (1-3 files, partitioned or not, NULL keys, duplicate target
keys), runs one random merge through the job (``merge_sql``), the same merge through ``DeltaTable.merge``
and, on the classic session (which has Delta loaded), through Delta's ``MERGE INTO``, and compares the rows
left and the row-level metrics (Delta's: its commit's ``operationMetrics``), on the classic session (every
case) and a Spark Connect session (a quarter of them: ``SESSION_CASES``). The ON condition is the key
equality, sometimes with a target-only, source-only or partition conjunct (what the job prunes files and
partitions by).

Where delta-rs and Delta disagree, the generator stays on the shapes both agree on:

- Multiple matches: Delta raises whenever a target row joins two or more source rows (clause conditions
  aside), unless the only MATCHED clause is an unconditional DELETE or the merge is insert-only.
  delta-rs 1.6 raises only when two or more source rows of one target row take a WHEN MATCHED action,
  and not when they all fall through to an unconditional DELETE. So a conditional UPDATE that all but
  one duplicate fails, NOT MATCHED BY SOURCE clauses without MATCHED clauses, or a conditional UPDATE
  followed by an unconditional DELETE that every duplicate reaches, raise in Delta and succeed in
  delta-rs. Duplicate source keys therefore come only with no MATCHED (and no NOT MATCHED BY SOURCE)
  clauses, one unconditional DELETE, or a last MATCHED clause that is an unconditional UPDATE (every
  joined pair takes an action, so both raise).
- Expressions stay in the SQL both dialects read alike: comparisons, IS [NOT] NULL, AND/OR/NOT,
  integer + - * on small values, string literals (no string functions: concat treats NULL differently).

``MERGE_DIFFERENTIAL_CASES`` (default 40) sets the number of seeded cases; a failing case's id carries
its seed, and the assertion message prints the statement and both inputs.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.delta_reader import read_table, table_version
from tests.support.delta_reference import delta_merge_outcome

NUM_CASES = int(os.environ.get("MERGE_DIFFERENTIAL_CASES", "40"))
COLUMNS = ("id", "value", "name", "part")
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.int64()), ("name", pa.string()), ("part", pa.string())])
NAMES = ("a", "b", "c", "a string that is longer than thirty-two characters", None)
PARTS = ("p0", "p1", "p2")
# Extra ON conjuncts: target-only ones are what the job skips files and partitions by.
ON_EXTRAS = (
    "t.part = s.part", "t.part = '{part}'", "t.value > {k}", "t.value IS NOT NULL", "s.value < {k}",
    "(t.part = '{part}' OR s.value > {k})",
)
# The row metrics Delta's MERGE records, compared with the job's name by name (the file and byte metrics
# depend on each writer's layout: tests/integration/spark_connect/test_session_kinds.py).
DELTA_ROW_METRICS = (
    "numSourceRows", "numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted",
    "numTargetRowsMatchedUpdated", "numTargetRowsMatchedDeleted", "numTargetRowsNotMatchedBySourceUpdated",
    "numTargetRowsNotMatchedBySourceDeleted", "numTargetRowsCopied", "numTargetFilesRemoved",
)  # fmt: skip
# (job metric, delta-rs metric)
METRICS = (
    ("numTargetRowsInserted", "num_target_rows_inserted"),
    ("numTargetRowsUpdated", "num_target_rows_updated"),
    ("numTargetRowsDeleted", "num_target_rows_deleted"),
    ("numSourceRows", "num_source_rows"),
)


@dataclass
class Clause:
    """One WHEN clause in both spellings."""

    when: str  # matched | not_matched | not_matched_by_source
    action: str  # update | update_all | delete | insert | insert_all
    condition: str | None = None
    pairs: dict[str, str] = field(default_factory=dict)

    def sql(self) -> str:
        head = {"matched": "WHEN MATCHED", "not_matched": "WHEN NOT MATCHED",
                "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE"}[self.when]
        cond = f" AND {self.condition}" if self.condition else ""
        if self.action == "update":
            body = "UPDATE SET " + ", ".join(f"{c} = {v}" for c, v in self.pairs.items())
        elif self.action == "update_all":
            body = "UPDATE SET *"
        elif self.action == "delete":
            body = "DELETE"
        elif self.action == "insert":
            body = f"INSERT ({', '.join(self.pairs)}) VALUES ({', '.join(self.pairs.values())})"
        else:
            body = "INSERT *"
        return f"{head}{cond} THEN {body}"

    def apply(self, merger: Any) -> Any:
        """Add this clause to a delta-rs TableMerger."""
        p = self.condition
        if self.when == "matched":
            if self.action == "update":
                return merger.when_matched_update(updates=dict(self.pairs), predicate=p)
            if self.action == "update_all":
                return merger.when_matched_update_all(predicate=p)
            return merger.when_matched_delete(predicate=p)
        if self.when == "not_matched":
            if self.action == "insert":
                return merger.when_not_matched_insert(updates=dict(self.pairs), predicate=p)
            return merger.when_not_matched_insert_all(predicate=p)
        if self.action == "update":
            return merger.when_not_matched_by_source_update(updates=dict(self.pairs), predicate=p)
        return merger.when_not_matched_by_source_delete(predicate=p)


@dataclass
class Case:
    seed: int
    partitioned: bool
    target_batches: list[pa.Table]
    source: pa.Table
    clauses: list[Clause]
    expect_multiple_match_error: bool
    on: str = "t.id = s.id"

    def merge_sql(self) -> str:
        whens = " ".join(c.sql() for c in self.clauses)
        return f"MERGE INTO target AS t USING source AS s ON {self.on} {whens}"

    def describe(self) -> str:
        target = [r for b in self.target_batches for r in b.to_pylist()]
        return (
            f"seed={self.seed} partitioned={self.partitioned} "
            f"files={[b.num_rows for b in self.target_batches]}\n"
            f"  sql: {self.merge_sql()}\n  target: {json.dumps(target)}\n"
            f"  source: {json.dumps(self.source.to_pylist())}"
        )


# ----------------------------------------------------------------------------------------------------
# Generation


def _row(rng: random.Random, *, null_id: float, parts: tuple[str | None, ...]) -> dict[str, Any]:
    return {
        "id": None if rng.random() < null_id else rng.randrange(12),
        "value": None if rng.random() < 0.15 else rng.randrange(-5, 20),
        "name": rng.choice(NAMES),
        "part": rng.choice(parts),
    }


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _matched_condition(rng: random.Random) -> str:
    k = rng.randrange(-2, 15)
    simple = [
        f"s.value > {k}", f"t.value < {k}", "s.value >= t.value", f"t.name = '{rng.choice(NAMES[:3])}'",
        "s.name IS NULL", "t.value IS NOT NULL", f"t.part = '{rng.choice(PARTS)}'", f"s.id <= {k}",
        "s.name = t.name",
    ]
    first = rng.choice(simple)
    roll = rng.random()
    if roll < 0.15:
        return f"({first} OR {rng.choice(simple)})"
    if roll < 0.3:
        return f"{first} AND {rng.choice(simple)}"
    if roll < 0.38:
        return f"NOT ({first})"
    return first


def _source_condition(rng: random.Random) -> str:
    k = rng.randrange(-2, 15)
    simple = [f"s.value > {k}", f"s.name = '{rng.choice(NAMES[:3])}'", "s.name IS NOT NULL",
              f"s.part = '{rng.choice(PARTS)}'", "s.id IS NULL", f"s.value % 2 = {rng.randrange(2)}"]
    first = rng.choice(simple)
    return f"({first} OR {rng.choice(simple)})" if rng.random() < 0.2 else first


def _target_condition(rng: random.Random) -> str:
    k = rng.randrange(-2, 15)
    simple = [f"t.value < {k}", "t.name IS NULL", f"t.part = '{rng.choice(PARTS)}'", "t.id IS NULL",
              f"t.id > {rng.randrange(12)}", f"t.name = '{rng.choice(NAMES[:3])}'"]
    first = rng.choice(simple)
    return f"{first} AND {rng.choice(simple)}" if rng.random() < 0.2 else first


def _subset(
    rng: random.Random, options: dict[str, list[str]], *, always: tuple[str, ...] = ()
) -> dict[str, str]:
    chosen = [c for c in options if c in always or rng.random() < 0.5] or [rng.choice(list(options))]
    return {c: rng.choice(options[c]) for c in COLUMNS if c in chosen}


def _clauses_of_kind(rng: random.Random, count: int, make: Any, condition: Any) -> list[Clause]:
    clauses = []
    for i in range(count):
        last = i == count - 1
        clause = make()
        clause.condition = None if last and rng.random() < 0.5 else condition(rng)
        clauses.append(clause)
    return clauses


def _matched(rng: random.Random) -> Clause:
    roll = rng.random()
    if roll < 0.4:
        k = rng.randrange(1, 5)
        options = {
            "id": ["t.id + 100", "s.id"],
            "value": [f"s.value + {k}", "t.value + s.value", "t.value * 2", f"{k}"],
            "name": ["s.name", "'upd'", "t.name"],
            "part": ["s.part", f"'{rng.choice(PARTS)}'"],
        }
        if rng.random() < 0.8:
            del options["id"]
        return Clause("matched", "update", pairs=_subset(rng, options))
    if roll < 0.6:
        return Clause("matched", "update_all")
    return Clause("matched", "delete")


def _not_matched(rng: random.Random) -> Clause:
    if rng.random() < 0.5:
        return Clause("not_matched", "insert_all")
    options = {
        "id": ["s.id", "s.id + 1000"],
        "value": ["s.value", "s.value * 2", f"{rng.randrange(50)}"],
        "name": ["s.name", "'ins'"],
        "part": ["s.part", f"'{rng.choice(PARTS)}'"],
    }
    return Clause("not_matched", "insert", pairs=_subset(rng, options, always=("id",)))


def _not_matched_by_source(rng: random.Random) -> Clause:
    if rng.random() < 0.5:
        return Clause("not_matched_by_source", "delete")
    k = rng.randrange(1, 5)
    options = {
        "value": [f"t.value - {k}", "t.value * 2", f"{k}"],
        "name": ["'gone'", "t.name"],
        "part": [f"'{rng.choice(PARTS)}'"],
    }
    return Clause("not_matched_by_source", "update", pairs=_subset(rng, options))


def generate_case(seed: int) -> Case:
    rng = random.Random(seed)
    partitioned = rng.random() < 0.5
    # A NULL partition value now and then (written as __HIVE_DEFAULT_PARTITION__).
    parts: tuple[str | None, ...] = PARTS + ((None,) if rng.random() < 0.2 else ())
    target_batches = [
        _table([_row(rng, null_id=0.1, parts=parts) for _ in range(rng.randrange(1 if i == 0 else 0, 7))])
        for i in range(rng.randrange(1, 4))
    ]
    target_batches = [b for b in target_batches if b.num_rows] or [
        _table([_row(rng, null_id=0.0, parts=parts)])
    ]

    multi = rng.random() < 0.2
    source_rows: list[dict[str, Any]] = []
    seen: set[int] = set()
    for _ in range(rng.randrange(0, 9) if rng.random() < 0.95 else 0):
        row = _row(rng, null_id=0.15, parts=parts)
        if row["id"] is not None and row["id"] in seen:
            continue
        if row["id"] is not None:
            seen.add(row["id"])
        source_rows.append(row)

    matched = _clauses_of_kind(rng, rng.choice((0, 1, 1, 2, 3)), lambda: _matched(rng), _matched_condition)
    not_matched = _clauses_of_kind(
        rng, rng.choice((0, 1, 1, 2)), lambda: _not_matched(rng), _source_condition
    )
    by_source = _clauses_of_kind(
        rng, rng.choice((0, 0, 1, 2)), lambda: _not_matched_by_source(rng), _target_condition
    )
    if not (matched or not_matched or by_source):
        not_matched = [Clause("not_matched", "insert_all")]

    expect_error = False
    if multi:
        # Duplicate a source key that matches a target row, on a shape Delta and delta-rs agree on.
        target_ids = sorted({r["id"] for b in target_batches for r in b.to_pylist() if r["id"] is not None})
        if target_ids:
            key = rng.choice(target_ids)
            for _ in range(rng.randrange(2, 4)):
                source_rows.append(_row(rng, null_id=0.0, parts=parts) | {"id": key})
            shape = rng.choice(("insert_only", "one_delete", "unconditional_last"))
            if shape == "insert_only":
                matched, by_source = [], []
                not_matched = not_matched or [Clause("not_matched", "insert_all")]
            elif shape == "one_delete":
                matched = [Clause("matched", "delete")]
            else:
                matched = matched or [_matched(rng)]
                if matched[-1].action == "delete":
                    matched[-1] = Clause("matched", "update_all")
                matched[-1].condition = None
                expect_error = True
    rng.shuffle(source_rows)
    on = "t.id = s.id"
    if not expect_error and rng.random() < 0.4:
        on += " AND " + rng.choice(ON_EXTRAS).format(part=rng.choice(PARTS), k=rng.randrange(-2, 15))
    return Case(seed, partitioned, target_batches, _table(source_rows), matched + not_matched + by_source,
                expect_error, on)


# ----------------------------------------------------------------------------------------------------
# Running


def _write_target(path: Path, case: Case) -> None:
    from deltalake import write_deltalake

    for batch in case.target_batches:
        write_deltalake(str(path), batch, mode="append", partition_by=["part"] if case.partitioned else None)


def prepare_case(root: Path, case: Case) -> tuple[Path, Path, dict[str, Any]]:
    """The case's target twice under ``root`` (ours, delta-rs's), its source as Parquet, and our spec."""
    ours, theirs, source = root / "ours", root / "theirs", root / "source"
    _write_target(ours, case)
    _write_target(theirs, case)
    source.mkdir()
    pq.write_table(case.source, source / "part-0.parquet")
    spec = {
        "target": {"uri": str(ours)},
        "source": {"uri": str(source), "format": "parquet"},
        "merge_sql": case.merge_sql(),
    }
    return ours, theirs, spec


def _rows(path: Path) -> list[str]:
    rows = read_table(path).select(list(COLUMNS)).to_pylist()
    return sorted(json.dumps([r[c] for c in COLUMNS]) for r in rows)


def _run_delta_rs(path: Path, case: Case) -> dict[str, Any]:
    from deltalake import DeltaTable

    merger = DeltaTable(str(path)).merge(
        source=case.source, predicate=case.on, source_alias="s", target_alias="t", streamed_exec=False
    )
    for clause in case.clauses:
        merger = clause.apply(merger)
    return dict(merger.execute())


# Every case on the classic session; a quarter of them (both copy paths) on a Spark Connect session too:
# that the job gives the same outcome on both kinds is shown scenario by scenario in
# tests/integration/spark_connect/test_session_kinds.py, so the Connect runs here only need to show the
# random shapes go through Connect as well, at a quarter of the suite time the other three would cost.
SESSION_CASES = [("classic", s) for s in range(NUM_CASES)] + [
    ("connect", s) for s in range(NUM_CASES) if s % 8 in (0, 1)
]


@pytest.mark.parametrize(
    ("merge_spark", "seed"), SESSION_CASES, ids=[f"{kind}-seed{s}" for kind, s in SESSION_CASES],
    indirect=["merge_spark"],
)
def test_same_as_delta_rs(
    merge_spark: Any, tmp_path: Path, seed: int, request: pytest.FixtureRequest
) -> None:
    if seed % 2:
        # Odd seeds rewrite touched files copying their unchanged rows by position, even seeds through
        # Spark's reader (the default for files this small).
        request.getfixturevalue("copy_by_position")
    from spark_jobs.delta_merge import run_merge
    from spark_jobs.delta_merge.errors import MultipleSourceRowMatchesError

    case = generate_case(seed)
    ours, theirs, spec = prepare_case(tmp_path, case)
    where = case.describe()
    before = table_version(ours)
    delta: dict[str, Any] | None = None
    if request.node.callspec.params["merge_spark"] == "classic":
        # Delta's own MERGE on a third copy, in this session (it has Delta loaded).
        _write_target(tmp_path / "delta", case)
        source = merge_spark.read.parquet(spec["source"]["uri"])
        delta = delta_merge_outcome(merge_spark, tmp_path / "delta", case.merge_sql(), source)

    if case.expect_multiple_match_error:
        if delta is not None:
            conditions = delta.get("error", ({},))[0]
            assert "DELTA_MULTIPLE_SOURCE_ROW_MATCHING_TARGET_ROW_IN_MERGE" in conditions, where
        with pytest.raises(Exception, match=r"(?i)multiple source rows") as delta_rs_error:
            _run_delta_rs(theirs, case)
        assert "DeltaError" in type(delta_rs_error.value).__name__, where
        version = table_version(ours)
        with pytest.raises(MultipleSourceRowMatchesError):
            run_merge(merge_spark, spec)
        assert table_version(ours) == version, where
        return

    expected_metrics = _run_delta_rs(theirs, case)
    metrics = run_merge(merge_spark, spec).to_dict()
    assert _rows(ours) == _rows(theirs), where
    got = {ours_name: metrics[ours_name] for ours_name, _ in METRICS}
    want = {ours_name: expected_metrics[theirs_name] for ours_name, theirs_name in METRICS}
    assert got == want, where
    assert metrics["numTargetRowsUpdated"] == (
        metrics["numTargetRowsMatchedUpdated"] + metrics["numTargetRowsNotMatchedBySourceUpdated"]
    ), where
    assert metrics["numTargetRowsDeleted"] == (
        metrics["numTargetRowsMatchedDeleted"] + metrics["numTargetRowsNotMatchedBySourceDeleted"]
    ), where
    if delta is not None:
        assert "error" not in delta, f"{where}\n  Delta: {delta.get('error')}"
        assert _rows(tmp_path / "delta") == _rows(ours), where
        # A merge that changes nothing records no version in Delta (skipRecordingEmptyCommits) nor the job.
        assert delta["version"] - before == table_version(ours) - before in (0, 1), where
        if delta["version"] > before:
            differing = {name: (metrics[name], delta["metrics"].get(name)) for name in DELTA_ROW_METRICS
                         if metrics[name] != delta["metrics"].get(name)}  # fmt: skip
            assert differing == {}, f"(job, Delta) {where}"
