"""Seeded random merges into tables Delta itself creates with table features (deletion vectors, the change
data feed, column mapping by name), on a nested, NULL-heavy schema, with or without schema evolution: the
cases of tests/unit/spark_jobs/test_differential_delta_features.py, and the Delta-side helpers that build
their tables and read them back.

The target schema (``TARGET_COLUMNS``) has a struct with a nested struct, an array and a map beside the
key and a value; many keys, structs and nested fields are NULL. A case's source may differ from the target
(``SOURCE_SHAPES``): an extra top-level column, an extra nested field in the struct, a missing column, the
struct's fields in another order; the merge runs with schema evolution on or off.

The generator keeps to statements whose outcome is Delta's to decide, not a matter of which rows a
multiple match reaches first: the source's keys are unique (NULL keys only under ``=``, at most one NULL
under ``<=>``), except on the shapes of tests/unit/spark_jobs/test_differential.py where both must agree
(insert-only, one unconditional DELETE, or a last unconditional UPDATE, which must raise).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The target's columns as DDL, in order; ``part`` is the partition column of partitioned cases.
TARGET_COLUMNS = (
    ("id", "BIGINT"),
    ("v", "BIGINT"),
    ("st", "STRUCT<x: BIGINT, y: STRING, n: STRUCT<w: BIGINT, z: STRING>>"),
    ("arr", "ARRAY<BIGINT>"),
    ("m", "MAP<STRING, BIGINT>"),
    ("part", "STRING"),
)
# How a case's source differs from the target:
# - extra_column: a STRING column ``extra`` between ``v`` and ``st`` (evolution appends it at the end);
# - extra_field: the struct has one more field ``st.q`` (evolution adds it to the target's struct);
# - missing_column: no ``arr`` column (UPDATE SET * / INSERT * need evolution to leave it out);
# - reordered: the struct's fields in another order (resolved by name).
SOURCE_SHAPES = ("same", "extra_column", "extra_field", "missing_column", "reordered")
TEXTS = ("a", "b", "c", None)
PARTS = ("p0", "p1")


def source_columns(shape: str) -> list[tuple[str, str]]:
    """The source's columns as DDL for ``shape``."""
    columns = list(TARGET_COLUMNS)
    if shape == "extra_column":
        columns.insert(2, ("extra", "STRING"))
    elif shape == "extra_field":
        columns[2] = ("st", "STRUCT<x: BIGINT, y: STRING, n: STRUCT<w: BIGINT, z: STRING>, q: BIGINT>")
    elif shape == "missing_column":
        columns = [c for c in columns if c[0] != "arr"]
    elif shape == "reordered":
        columns[2] = ("st", "STRUCT<n: STRUCT<z: STRING, w: BIGINT>, y: STRING, x: BIGINT>")
    return columns


def ddl(columns: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


@dataclass
class Features:
    """The table's features and the merge's settings."""

    deletion_vectors: bool
    change_data_feed: bool
    column_mapping: bool
    partitioned: bool
    schema_evolution: bool

    def properties(self) -> dict[str, str]:
        props = {}
        if self.deletion_vectors:
            props["delta.enableDeletionVectors"] = "true"
        if self.change_data_feed:
            props["delta.enableChangeDataFeed"] = "true"
        if self.column_mapping:
            props["delta.columnMapping.mode"] = "name"
        return props

    def label(self) -> str:
        names = [("dv", self.deletion_vectors), ("cdf", self.change_data_feed), ("cm", self.column_mapping),
                 ("part", self.partitioned), ("evolve", self.schema_evolution)]  # fmt: skip
        return "+".join(name for name, on in names if on) or "plain"


@dataclass
class Clause:
    when: str  # matched | not_matched | not_matched_by_source
    action: str  # update | update_all | delete | insert | insert_all
    condition: str | None = None
    pairs: dict[str, str] = field(default_factory=dict)

    def sql(self) -> str:
        head = {"matched": "WHEN MATCHED", "not_matched": "WHEN NOT MATCHED",
                "not_matched_by_source": "WHEN NOT MATCHED BY SOURCE"}[self.when]  # fmt: skip
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


@dataclass
class Case:
    seed: int
    features: Features
    shape: str
    target_batches: list[list[dict[str, Any]]]
    delete_after: str | None  # a DELETE Delta runs on the target after its inserts (deletion vectors)
    source_rows: list[dict[str, Any]]
    clauses: list[Clause]
    on: str
    multiple_match_error: bool = False

    def merge_sql(self) -> str:
        whens = " ".join(c.sql() for c in self.clauses)
        return f"MERGE INTO target AS t USING source AS s ON {self.on} {whens}"

    def describe(self) -> str:
        f = self.features
        return (
            f"seed={self.seed} features={f.label()} properties={f.properties()} source_shape={self.shape}\n"
            f"  sql: {self.merge_sql()}\n"
            f"  target batches: {json.dumps(self.target_batches)}\n"
            f"  then: {self.delete_after}\n"
            f"  source: {json.dumps(self.source_rows)}"
        )


# ----------------------------------------------------------------------------------------------------
# Generation


def _maybe(rng: random.Random, p_null: float, value: Any) -> Any:
    return None if rng.random() < p_null else value


def _struct(rng: random.Random, shape: str) -> dict[str, Any] | None:
    if rng.random() < 0.25:
        return None
    inner = _maybe(rng, 0.3, {"w": _maybe(rng, 0.3, rng.randrange(10)), "z": rng.choice(TEXTS)})
    value: dict[str, Any] = {"x": _maybe(rng, 0.3, rng.randrange(10)), "y": rng.choice(TEXTS), "n": inner}
    if shape == "extra_field":
        value["q"] = _maybe(rng, 0.3, rng.randrange(100))
    return value


def _row(rng: random.Random, shape: str, *, null_id: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": None if rng.random() < null_id else rng.randrange(10),
        "v": _maybe(rng, 0.2, rng.randrange(-5, 20)),
        "st": _struct(rng, shape),
        "arr": _maybe(rng, 0.3, [_maybe(rng, 0.15, rng.randrange(5)) for _ in range(rng.randrange(4))]),
        "m": _maybe(
            rng, 0.3, {k: _maybe(rng, 0.2, rng.randrange(9)) for k in rng.sample("abc", rng.randrange(3))}
        ),
        "part": rng.choice(PARTS),
    }
    if shape == "extra_column":
        row["extra"] = rng.choice(TEXTS)
    if shape == "missing_column":
        del row["arr"]
    return row


def _condition(rng: random.Random, options: list[str]) -> str:
    first = rng.choice(options)
    roll = rng.random()
    if roll < 0.15:
        return f"({first} OR {rng.choice(options)})"
    if roll < 0.3:
        return f"{first} AND {rng.choice(options)}"
    if roll < 0.38:
        return f"NOT ({first})"
    return first


def _matched_condition(rng: random.Random) -> str:
    k = rng.randrange(-2, 12)
    return _condition(rng, [
        f"s.v > {k}", f"t.v < {k}", "t.st IS NULL", "t.st.x IS NULL", f"s.st.y = '{rng.choice('abc')}'",
        f"t.st.n.w < {k % 10}", f"array_contains(t.arr, {k % 5})", "s.m IS NULL", "t.v = s.v",
        "t.st.x <=> s.st.x", "s.st.n IS NOT NULL", f"map_contains_key(t.m, '{rng.choice('abc')}')",
    ])  # fmt: skip


def _source_condition(rng: random.Random) -> str:
    k = rng.randrange(-2, 12)
    return _condition(rng, [
        f"s.v > {k}", "s.st IS NOT NULL", "s.st.n IS NULL", "s.id IS NULL", f"s.st.y = '{rng.choice('abc')}'",
        f"s.st.n.w >= {k % 10}", f"s.part = '{rng.choice(PARTS)}'", "s.m IS NOT NULL",
    ])  # fmt: skip


def _target_condition(rng: random.Random) -> str:
    k = rng.randrange(-2, 12)
    return _condition(rng, [
        f"t.v < {k}", "t.st IS NULL", "t.st.y IS NULL", "t.id IS NULL", "t.m IS NOT NULL",
        f"t.st.n.z = '{rng.choice('abc')}'", f"t.part = '{rng.choice(PARTS)}'", f"t.st.x > {k % 10}",
    ])  # fmt: skip


def _pick(
    rng: random.Random, options: dict[str, list[str]], *, always: tuple[str, ...] = ()
) -> dict[str, str]:
    chosen = [c for c in options if c in always or rng.random() < 0.4] or [rng.choice(list(options))]
    # A struct and one of its fields in one SET is a conflict (both refuse it: not generated).
    if "t.st" in chosen:
        chosen = [c for c in chosen if not c.startswith("t.st.")]
    return {c: rng.choice(options[c]) for c in chosen}


def _matched(rng: random.Random, shape: str) -> Clause:
    roll = rng.random()
    if roll < 0.5:
        k = rng.randrange(1, 5)
        options = {
            "t.v": [f"s.v + {k}", "t.v * 2", "s.v"],
            "t.st": [
                "s.st",
                "NULL",
                "named_struct('x', s.v, 'y', 'set', 'n', named_struct('w', t.v, 'z', s.st.y))",
            ],
            "t.st.x": ["s.st.x", f"t.st.x + {k}", "s.v"],
            "t.st.y": ["'upd'", "s.st.y", "t.st.n.z"],
            "t.st.n.w": ["s.v", "t.st.n.w * 2", "NULL"],
            "t.arr": ["array(t.v, s.v)", "NULL"] + ([] if shape == "missing_column" else ["s.arr"]),
            "t.m": ["s.m", f"map('k', s.v + {k})"],
        }
        return Clause("matched", "update", pairs=_pick(rng, options))
    if roll < 0.75:
        return Clause("matched", "update_all")
    return Clause("matched", "delete")


def _not_matched(rng: random.Random, shape: str) -> Clause:
    if rng.random() < 0.5:
        return Clause("not_matched", "insert_all")
    options = {
        "id": ["s.id", "s.id + 100"],
        "v": ["s.v", "s.v * 2", str(rng.randrange(50))],
        "st": ["s.st", "NULL", "named_struct('x', s.id, 'y', 'ins', 'n', s.st.n)"],
        "arr": ["array(s.v)"] + ([] if shape == "missing_column" else ["s.arr"]),
        "m": ["s.m", "map('i', s.id)"],
        "part": ["s.part", f"'{rng.choice(PARTS)}'"],
    }
    pairs = _pick(rng, options, always=("id",))
    return Clause("not_matched", "insert", pairs={c: pairs[c] for c in options if c in pairs})


def _not_matched_by_source(rng: random.Random) -> Clause:
    if rng.random() < 0.5:
        return Clause("not_matched_by_source", "delete")
    k = rng.randrange(1, 5)
    options = {
        "t.v": [f"t.v - {k}", str(k)],
        "t.st": ["NULL", "named_struct('x', t.v, 'y', 'gone', 'n', NULL)"],
        "t.st.x": ["0", f"t.st.x + {k}"],
        "t.st.n.z": ["'nmbs'", "t.st.y"],
        "t.arr": ["NULL", "array(t.v)"],
        "t.m": ["NULL"],
    }
    return Clause("not_matched_by_source", "update", pairs=_pick(rng, options))


def _clauses(rng: random.Random, count: int, make: Any, condition: Any) -> list[Clause]:
    made = []
    for i in range(count):
        clause = make()
        clause.condition = None if i == count - 1 and rng.random() < 0.5 else condition(rng)
        made.append(clause)
    return made


def generate_case(seed: int) -> Case:
    rng = random.Random(seed)
    features = Features(
        deletion_vectors=rng.random() < 0.5,
        change_data_feed=rng.random() < 0.5,
        column_mapping=rng.random() < 0.5,
        partitioned=rng.random() < 0.3,
        schema_evolution=rng.random() < 0.4,
    )
    shape = rng.choice(SOURCE_SHAPES) if rng.random() < 0.6 else "same"
    batches = [[_row(rng, "same", null_id=0.25) for _ in range(rng.randrange(1, 6))]
               for _ in range(rng.randrange(1, 3))]  # fmt: skip
    delete_after = f"v < {rng.randrange(0, 8)}" if rng.random() < 0.4 else None

    null_safe = rng.random() < 0.2
    source_rows: list[dict[str, Any]] = []
    seen: set[int | None] = set()
    for _ in range(rng.randrange(0, 8)):
        row = _row(rng, shape, null_id=0.25)
        if row["id"] in seen and (row["id"] is not None or null_safe):
            continue
        seen.add(row["id"])
        source_rows.append(row)

    matched = _clauses(rng, rng.choice((0, 1, 1, 2)), lambda: _matched(rng, shape), _matched_condition)
    not_matched = _clauses(rng, rng.choice((0, 1, 1, 2)), lambda: _not_matched(rng, shape), _source_condition)
    by_source = _clauses(
        rng, rng.choice((0, 0, 1, 2)), lambda: _not_matched_by_source(rng), _target_condition
    )
    if not (matched or not_matched or by_source):
        not_matched = [Clause("not_matched", "insert_all")]

    multiple_match_error = False
    target_ids = sorted({r["id"] for b in batches for r in b if r["id"] is not None})
    if target_ids and rng.random() < 0.15:
        # Duplicate a source key that matches a target row, on a shape whose outcome is fixed.
        key = rng.choice(target_ids)
        source_rows += [_row(rng, shape, null_id=0.0) | {"id": key} for _ in range(rng.randrange(2, 4))]
        kind = rng.choice(("insert_only", "one_delete", "unconditional_last"))
        if kind == "insert_only":
            matched, by_source = [], []
            not_matched = not_matched or [Clause("not_matched", "insert_all")]
        elif kind == "one_delete":
            matched = [Clause("matched", "delete")]
        else:
            matched = matched or [_matched(rng, shape)]
            if matched[-1].action == "delete":
                matched[-1] = Clause("matched", "update_all")
            matched[-1].condition = None
            multiple_match_error = True
    rng.shuffle(source_rows)

    on = "t.id <=> s.id" if null_safe else "t.id = s.id"
    if rng.random() < 0.15:
        on += " AND t.st.y <=> s.st.y"
    clauses = matched + not_matched + by_source
    return Case(seed, features, shape, batches, delete_after, source_rows, clauses, on, multiple_match_error)


# ----------------------------------------------------------------------------------------------------
# Delta's side: the tables, and reading them back


def create_delta_target(spark: Any, path: Path, case: Case) -> None:
    """The case's target, created and written by Delta itself: CREATE TABLE with the features'
    properties, one INSERT per batch, then the case's DELETE (deletion vectors where enabled)."""
    table = f"delta.`{path}`"
    props = case.features.properties()
    listed = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
    options = f"TBLPROPERTIES ({listed})" if props else ""
    layout = "PARTITIONED BY (part)" if case.features.partitioned else ""
    spark.sql(f"CREATE TABLE {table} ({ddl(TARGET_COLUMNS)}) USING delta {layout} {options}")
    for batch in case.target_batches:
        # One partition: one file per batch (per partition value), whatever the session's parallelism.
        frame = spark.createDataFrame(batch, ddl(TARGET_COLUMNS)).coalesce(1)
        frame.createOrReplaceTempView("differential_batch")
        try:
            spark.sql(f"INSERT INTO {table} SELECT * FROM differential_batch")
        finally:
            spark.catalog.dropTempView("differential_batch")
    if case.delete_after:
        spark.sql(f"DELETE FROM {table} WHERE {case.delete_after}")


def write_source(spark: Any, path: Path, case: Case) -> None:
    """The case's source as Parquet (one file), read by both the job and Delta's MERGE."""
    frame = spark.createDataFrame(case.source_rows, ddl(source_columns(case.shape)))
    frame.coalesce(1).write.parquet(str(path))


def plain(value: Any) -> Any:
    """A value Delta read back -> JSON: structs as lists in field order, maps as sorted pairs."""
    if isinstance(value, tuple):  # a Row
        return [plain(v) for v in value]
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return sorted(([k, plain(v)] for k, v in value.items()), key=lambda kv: str(kv[0]))
    if isinstance(value, (dt.datetime, dt.date, decimal.Decimal)):
        return str(value)
    return value


def delta_rows(spark: Any, path: Path) -> tuple[str, list[str]]:
    """(the schema, the rows as a sorted multiset of JSON), as Delta reads the table."""
    frame = spark.read.format("delta").load(str(path))
    rows = sorted(json.dumps(plain(tuple(r))) for r in frame.collect())
    return frame.schema.simpleString(), rows


def delta_change_rows(spark: Any, path: Path, version: int) -> list[dict[str, Any]]:
    """The change rows of ``version`` as Delta reads the feed: every column but ``_commit_timestamp``,
    ``_commit_version`` checked to be ``version`` and dropped."""
    frame = (spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
             .option("endingVersion", version).load(str(path)))  # fmt: skip
    names = [c for c in frame.columns if c != "_commit_timestamp"]
    rows = []
    for row in frame.select(*names).collect():
        record = dict(zip(names, (plain(v) for v in row), strict=True))
        assert record.pop("_commit_version") == version, (path, version, record)
        rows.append(record)
    return rows


def log_actions(path: Path, version: int) -> dict[str, int]:
    """How many actions of each kind the commit ``version`` holds."""
    counts: dict[str, int] = {}
    for line in (path / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        for kind in json.loads(line):
            counts[kind] = counts.get(kind, 0) + 1
    return counts
