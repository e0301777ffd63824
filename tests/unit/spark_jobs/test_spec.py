"""The merge contract: JSON round trip, field checks with messages naming field, expectation and finding."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.spec import (
    Assignment,
    MergeClause,
    MergeOptions,
    MergeSpec,
    ParsedMerge,
    RunSpec,
    SourceSpec,
    TargetSpec,
    format_column_path,
    parse_column_path,
)

EXAMPLE: dict[str, Any] = {
    "target": {"uri": "/data/tables/accounts", "storage_options": {}},
    "source": {"uri": "/data/landing/2024-01-02", "format": "parquet", "options": {}},
    "merge_sql": "MERGE INTO target t USING source s ON t.id = s.id "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
    "options": {"materialize_source": "auto", "schema_evolution": False},
    "run": {"app_id": "dag.task", "app_version": 1, "commit_metadata": {"dag_id": "d", "run_id": "r"}},
}


def with_(**changes: Any) -> dict[str, Any]:
    """EXAMPLE with top-level keys replaced (None removes the key)."""
    data: dict[str, Any] = json.loads(json.dumps(EXAMPLE))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(MergeSpecError) as error:
        MergeSpec.from_dict(data).validate()
    return error.value.bare_message


def test_example_from_the_issue_round_trips() -> None:
    spec = MergeSpec.from_dict(EXAMPLE)
    assert MergeSpec.from_json(spec.to_json()) == spec
    assert MergeSpec.from_dict(spec.to_dict()) == spec
    assert spec.target == TargetSpec(uri="/data/tables/accounts")
    assert spec.source == SourceSpec(uri="/data/landing/2024-01-02", format="parquet")
    assert spec.run == RunSpec(
        app_id="dag.task", app_version=1, commit_metadata={"dag_id": "d", "run_id": "r"}
    )
    assert spec.options == MergeOptions()
    assert spec.validate() == ParsedMerge(
        "t",
        "s",
        "t.id = s.id",
        (MergeClause("matched", "update_all"), MergeClause("not_matched", "insert_all")),
    )


def test_to_dict_keys() -> None:
    data = MergeSpec.from_dict(EXAMPLE).to_dict()
    assert list(data) == ["target", "source", "merge_sql", "options", "run", "expected_metrics"]
    assert data["target"] == {"uri": "/data/tables/accounts", "storage_options": {}}
    assert data["source"] == {"uri": "/data/landing/2024-01-02", "format": "parquet", "options": {}}
    assert set(data["options"]) == {
        "materialize_source",
        "materialize_storage_level",
        "schema_evolution",
        "target_file_size",
        "store_assignment_policy",
        "resolve_structs_by_name",
        "shuffle_partitions",
        "dry_run",
        "engine",
    }
    assert MergeSpec.from_dict(with_(source={"query": "SELECT * FROM v"})).to_dict()["source"] == {
        "query": "SELECT * FROM v"
    }


def test_structural_clause_to_dict_uses_set_and_values() -> None:
    update = MergeClause("matched", "update", "s.v > 0", (Assignment(("addr", "city"), "s.city"),))
    insert = MergeClause("not_matched", "insert", None, (Assignment(("a b",), "1"),))
    assert update.to_dict() == {
        "when": "matched",
        "action": "update",
        "condition": "s.v > 0",
        "set": {"addr.city": "s.city"},
    }
    assert insert.to_dict() == {"when": "not_matched", "action": "insert", "values": {"`a b`": "1"}}
    assert MergeClause("matched", "delete").to_dict() == {"when": "matched", "action": "delete"}


def test_from_dict_does_not_share_the_callers_dicts() -> None:
    data = with_()
    spec = MergeSpec.from_dict(data)
    data["run"]["commit_metadata"]["dag_id"] = "changed"
    assert spec.run.commit_metadata["dag_id"] == "d"


# Hypothesis: any well-typed spec survives the JSON round trip unchanged.

_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(str.strip)
_name = st.text(string.ascii_letters + "_", min_size=1, max_size=8)
_json_leaf = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _text
)
_json = st.recursive(
    _json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3)
)
_str_map = st.dictionaries(_text, _text, max_size=3)
_number = st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False)
_column = st.lists(_text, min_size=1, max_size=3).map(tuple)


@st.composite
def _sources(draw: st.DrawFn) -> SourceSpec:
    if draw(st.booleans()):
        return SourceSpec(query=f"SELECT * FROM {draw(_name)}")
    fmt = draw(st.sampled_from([None, "delta", "parquet", "csv", "json", "orc"]))
    version = draw(st.none() | st.integers(0, 10**9)) if fmt == "delta" else None
    return SourceSpec(uri=draw(_text), format=fmt, options=draw(_str_map), version=version)


@st.composite
def _clauses(draw: st.DrawFn) -> MergeClause:
    action = draw(st.sampled_from(["update", "update_all", "delete", "insert", "insert_all"]))
    when = draw(st.sampled_from(["matched", "not_matched", "not_matched_by_source"]))
    assignments: tuple[Assignment, ...] = ()
    if action in ("update", "insert"):
        columns = draw(st.lists(_column, min_size=1, max_size=3, unique_by=format_column_path))
        assignments = tuple(Assignment(column, draw(_text)) for column in columns)
    return MergeClause(when, action, draw(st.none() | _text), assignments)  # type: ignore[arg-type]


@st.composite
def _specs(draw: st.DrawFn) -> MergeSpec:
    identified = draw(st.booleans())
    metrics = st.dictionaries(
        st.sampled_from(["numSourceRows", "numTargetRowsUpdated", "numTargetFilesAdded", "executionTimeMs"]),
        st.fixed_dictionaries(
            {},
            optional={
                "equal_to": _number,
                "greater_than": _number,
                "less_than": _number,
                "geq_to": _number,
                "leq_to": _number,
            },
        ).filter(bool),
        max_size=3,
    )
    merge: dict[str, Any]
    if draw(st.booleans()):
        merge = {"merge_sql": draw(_text)}
    else:
        merge = {
            "target_alias": draw(st.none() | _text),
            "source_alias": draw(st.none() | _text),
            "condition": draw(_text),
            "clauses": tuple(draw(st.lists(_clauses(), max_size=4))),
        }
    return MergeSpec(
        target=TargetSpec(uri=draw(_text), storage_options=draw(_str_map)),
        source=draw(_sources()),
        options=MergeOptions(
            materialize_source=draw(st.sampled_from(["auto", "all", "none"])),
            materialize_storage_level=draw(
                st.sampled_from(["MEMORY_AND_DISK", "DISK_ONLY", "MEMORY_AND_DISK_2"])
            ),
            schema_evolution=draw(st.booleans()),
            target_file_size=draw(st.none() | st.integers(1, 2**40)),
            store_assignment_policy=draw(st.sampled_from(["ANSI", "LEGACY", "STRICT"])),
            resolve_structs_by_name=draw(st.booleans()),
            shuffle_partitions=draw(st.none() | st.integers(1, 10_000)),
            dry_run=draw(st.booleans()),
        ),
        run=RunSpec(
            app_id=draw(_text) if identified else None,
            app_version=draw(st.integers(0, 2**62)) if identified else None,
            commit_metadata=draw(st.dictionaries(_text, _json, max_size=3)),
        ),
        expected_metrics=draw(metrics),
        **merge,
    )


@settings(max_examples=150, deadline=None)
@given(_specs())
def test_any_well_typed_spec_round_trips_through_json(spec: MergeSpec) -> None:
    assert MergeSpec.from_json(spec.to_json()) == spec
    assert MergeSpec.from_dict(spec.to_dict()) == spec
    assert MergeSpec.from_json(spec.to_json(indent=2)) == spec


@settings(max_examples=300, deadline=None)
@given(_column)
def test_column_paths_round_trip(column: tuple[str, ...]) -> None:
    assert parse_column_path(format_column_path(column), field="f") == column


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("a", ("a",)),
        ("addr.city", ("addr", "city")),
        ("`a b`", ("a b",)),
        ("`a.b`.c", ("a.b", "c")),
        ("`a``b`", ("a`b",)),
        ("t.`x y`.z", ("t", "x y", "z")),
    ],
)
def test_column_path_syntax(text: str, column: tuple[str, ...]) -> None:
    assert parse_column_path(text, field="f") == column


@pytest.mark.parametrize("text", ["", "a..b", ".a", "a.", "a b", "`a", "``", "a.`b`c"])
def test_bad_column_paths(text: str) -> None:
    with pytest.raises(MergeSpecError, match=r"^clauses\[0\]\.set: expected "):
        parse_column_path(text, field="clauses[0].set")


# Field checks: each names the field, what was expected and what was found.


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (with_(targte={"uri": "/x"}), "spec: unknown key 'targte'; did you mean 'target'?"),
        (
            with_(target={"uri": "/x", "storage": {}}),
            "target: unknown key 'storage'; did you mean 'storage_options'?",
        ),
        (
            with_(source={"uri": "/x", "fromat": "csv"}),
            "source: unknown key 'fromat'; did you mean 'format'?",
        ),
        (
            with_(options={"materialise_source": "all"}),
            "options: unknown option 'materialise_source'; did you mean 'materialize_source'?",
        ),
        (
            with_(options={"schema_evoluton": True}),
            "options: unknown option 'schema_evoluton'; did you mean 'schema_evolution'?",
        ),
        (
            with_(options={"nope": True}),
            "options: unknown option 'nope'; expected options among materialize_source, "
            "materialize_storage_level, schema_evolution, target_file_size, store_assignment_policy, "
            "resolve_structs_by_name, shuffle_partitions, dry_run, engine",
        ),
        (with_(run={"app": "x"}), "run: unknown key 'app'; did you mean 'app_id'?"),
        (
            with_(
                merge_sql=None,
                condition="target.k = source.k",
                clauses=[{"when": "matched", "action": "delete", "condtion": "s.x"}],
            ),
            "clauses[0]: unknown key 'condtion'; did you mean 'condition'?",
        ),
        (
            with_(
                merge_sql=None,
                condition="target.k = source.k",
                clauses=[{"when": "matched", "action": "delete", "x": 1}],
            ),
            "clauses[0]: unknown key 'x'; expected keys among when, condition, action, set, values",
        ),
        (
            with_(expected_metrics={"numTargetRowsUpdate": {"leq_to": 1}}),
            "expected_metrics: unknown metric 'numTargetRowsUpdate'; did you mean 'numTargetRowsUpdated'?",
        ),
        (with_(target=None), "spec: expected key(s) target, found them missing"),
        (with_(target={"storage_options": {}}), "target: expected key(s) uri, found them missing"),
    ],
)
def test_unknown_and_missing_keys_at_every_level(data: dict[str, Any], message: str) -> None:
    assert error_of(data) == message


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (["not", "an", "object"], "spec: expected a JSON object, found ['not', 'an', 'object'] (list)"),
        (with_(target="/x"), "target: expected a JSON object, found '/x' (str)"),
        (with_(target={"uri": ""}), "target.uri: expected a non-empty path or URI, found '' (str)"),
        (with_(target={"uri": "   "}), "target.uri: expected a non-empty path or URI, found '   ' (str)"),
        (with_(target={"uri": 5}), "target.uri: expected a non-empty path or URI, found 5 (int)"),
        (
            with_(target={"uri": "/x", "storage_options": {"k": 1}}),
            "target.storage_options.k: expected a string value (options are passed to Spark as strings), "
            "found 1 (int)",
        ),
        (
            with_(source={"uri": "s3://b/x", "storage_options": {"AWS_REGION": 1}}),
            "source.storage_options.AWS_REGION: expected a string value (options are passed to Spark as "
            "strings), found 1 (int)",
        ),
        (
            # Only the keys: the values are secrets.
            with_(source={"query": "SELECT 1", "storage_options": {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}}),
            'source.storage_options: expected nothing with source.query, found "keys '
            "['AWS_SECRET_ACCESS_KEY']\" (str)",
        ),
        (with_(source={"uri": ""}), "source.uri: expected a non-empty path or URI, found '' (str)"),
        (
            with_(source={"uri": "/x", "format": "avro"}),
            "source.format: expected one of delta, parquet, csv, json, orc, found 'avro' (str)",
        ),
        (
            with_(source={"uri": "/x", "query": "SELECT 1"}),
            "source: expected exactly one of uri and query, found both",
        ),
        (with_(source={"format": "delta"}), "source: expected exactly one of uri and query, found neither"),
        (
            with_(source={"uri": "/x", "format": "parquet", "version": 3}),
            "source.version: expected a version only with format 'delta', found 'parquet' (str)",
        ),
        (
            with_(source={"uri": "/x", "format": "delta", "version": -1}),
            "source.version: expected an integer >= 0, found -1 (int)",
        ),
        (
            with_(source={"query": "SELECT * FROM v", "format": "delta"}),
            "source.format: expected nothing with source.query (put it in the query), found 'delta' (str)",
        ),
        (
            with_(source={"query": "DROP TABLE v"}),
            "source.query: expected a query (SELECT, WITH, FROM, VALUES or TABLE), found 'DROP TABLE v' "
            "(str)",
        ),
        (
            with_(source={"query": "SELECT * FROM v; DROP TABLE v"}),
            "source.query: expected a single statement or expression, found ';' at line 1, column 16",
        ),
        (
            with_(source={"query": "SELECT '${env:SECRET}'"}),
            "source.query: expected no '${' in SQL text, found it at offset 8: Spark substitutes ${...} "
            "variables (including ${env:...}) in SQL text before parsing it",
        ),
        (
            with_(options={"materialize_source": "sometimes"}),
            "options.materialize_source: expected one of auto, all, none, found 'sometimes' (str)",
        ),
        (
            with_(options={"materialize_storage_level": "MEMORY"}),
            "options.materialize_storage_level: expected one of DISK_ONLY, DISK_ONLY_2, DISK_ONLY_3, "
            "MEMORY_AND_DISK, MEMORY_AND_DISK_2, MEMORY_AND_DISK_DESER, MEMORY_ONLY, MEMORY_ONLY_2, "
            "OFF_HEAP, "
            "found 'MEMORY' (str); did you mean 'MEMORY_ONLY'?",
        ),
        (
            with_(options={"store_assignment_policy": "ansi"}),
            "options.store_assignment_policy: expected one of ANSI, LEGACY, STRICT, found 'ansi' (str); "
            "did you mean 'ANSI'?",
        ),
        (
            with_(options={"schema_evolution": "false"}),
            "options.schema_evolution: expected true or false, found 'false' (str)",
        ),
        (with_(options={"dry_run": 1}), "options.dry_run: expected true or false, found 1 (int)"),
        (
            with_(options={"target_file_size": 0}),
            "options.target_file_size: expected an integer >= 1 or null, found 0 (int)",
        ),
        (
            with_(options={"shuffle_partitions": True}),
            "options.shuffle_partitions: expected an integer >= 1 or null, found True (bool)",
        ),
        (
            with_(run={"app_id": "a"}),
            "run: expected app_id and app_version or neither, found app_id only",
        ),
        (
            with_(run={"app_version": 1}),
            "run: expected app_id and app_version or neither, found app_version only",
        ),
        (
            with_(run={"app_id": "", "app_version": 1}),
            "run.app_id: expected a non-empty application id, found '' (str)",
        ),
        (
            with_(run={"app_id": "a", "app_version": -1}),
            "run.app_version: expected an integer >= 0, found -1 (int)",
        ),
        (
            with_(run={"commit_metadata": {"k": float("nan")}}),
            "run.commit_metadata.k: expected a finite number, found nan (float)",
        ),
        (with_(run={"commit_metadata": []}), "run.commit_metadata: expected a JSON object, found [] (list)"),
    ],
)
def test_wrong_types_and_values(data: Any, message: str) -> None:
    assert error_of(data) == message


def test_commit_metadata_must_be_plain_json() -> None:
    spec = MergeSpec.from_dict(EXAMPLE)
    run = RunSpec(commit_metadata={"when": (1, 2)})
    bad = MergeSpec(target=spec.target, source=spec.source, merge_sql=spec.merge_sql, run=run)
    with pytest.raises(MergeSpecError) as error:
        bad.validate()
    assert error.value.bare_message == (
        "run.commit_metadata.when: expected a JSON value (object, array, string, number, true, false or "
        "null), "
        "found (1, 2) (tuple)"
    )


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        (
            {"numTargetRowsUpdated": {"more_than": 1}},
            "expected_metrics.numTargetRowsUpdated: expected one of equal_to, greater_than, less_than, "
            "geq_to, "
            "leq_to, tolerance, found 'more_than' (str)",
        ),
        (
            {"numTargetRowsUpdated": {"equal_to": "1"}},
            "expected_metrics.numTargetRowsUpdated.equal_to: expected a finite number, found '1' (str)",
        ),
        (
            {"numTargetRowsUpdated": {"equal_to": True}},
            "expected_metrics.numTargetRowsUpdated.equal_to: expected a finite number, found True (bool)",
        ),
        (
            {"numTargetRowsUpdated": {"tolerance": 1}},
            "expected_metrics.numTargetRowsUpdated.tolerance: expected a number >= 0 alongside equal_to, "
            "found {'tolerance': 1} (dict)",
        ),
        (
            {"numTargetRowsUpdated": {}},
            "expected_metrics.numTargetRowsUpdated: expected an object of comparator (equal_to, "
            "greater_than, "
            "less_than, geq_to, leq_to, tolerance): number, found {} (dict)",
        ),
        (
            {"numTargetRowsUpdated": 3},
            "expected_metrics.numTargetRowsUpdated: expected an object of comparator (equal_to, "
            "greater_than, "
            "less_than, geq_to, leq_to, tolerance): number, found 3 (int)",
        ),
    ],
)
def test_expected_metrics(metrics: dict[str, Any], message: str) -> None:
    assert error_of(with_(expected_metrics=metrics)) == message


def test_expected_metrics_accepted() -> None:
    metrics = {"numTargetRowsUpdated": {"equal_to": 10, "tolerance": 0.5}, "numOutputRows": {"geq_to": 1.5}}
    assert MergeSpec.from_dict(with_(expected_metrics=metrics)).expected_metrics == metrics


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"merge_sql": None},
            "merge_sql: expected either merge_sql or the structural form (condition and clauses), found "
            "neither",
        ),
        (
            {"condition": "t.id = s.id", "clauses": [{"when": "matched", "action": "delete"}]},
            "merge_sql: expected either merge_sql or the structural form, found merge_sql and condition, "
            "clauses",
        ),
        (
            {"merge_sql": None, "clauses": [{"when": "matched", "action": "delete"}]},
            "condition: expected the ON condition of the structural form, found nothing",
        ),
        ({"merge_sql": ""}, "merge_sql: expected a MERGE INTO statement, found '' (str)"),
        (
            {"merge_sql": None, "condition": "a = b", "clauses": {"when": "matched"}},
            "clauses: expected a JSON array of WHEN clauses, found {'when': 'matched'} (dict)",
        ),
        (
            {"merge_sql": None, "condition": "a = b", "clauses": [{"when": "matched", "action": "merge"}]},
            "clauses[0].action: expected one of update, update_all, delete, insert, insert_all, found "
            "'merge' (str)",
        ),
        (
            {"merge_sql": None, "condition": "a = b", "clauses": [{"when": "always", "action": "delete"}]},
            "clauses[0].when: expected one of matched, not_matched, not_matched_by_source, found 'always' "
            "(str)",
        ),
        (
            {
                "merge_sql": None,
                "condition": "a = b",
                "clauses": [{"when": "matched", "action": "delete", "set": {}}],
            },
            "clauses[0].set: expected no 'set' for action 'delete', found {} (dict)",
        ),
        (
            {
                "merge_sql": None,
                "condition": "a = b",
                "clauses": [{"when": "matched", "action": "update", "values": {}}],
            },
            "clauses[0].values: expected no 'values' for action 'update', found {} (dict)",
        ),
        (
            {
                "merge_sql": None,
                "condition": "a = b",
                "clauses": [{"when": "matched", "action": "update", "set": ["a"]}],
            },
            "clauses[0].set: expected a JSON object of column: expression, found ['a'] (list)",
        ),
        (
            {
                "merge_sql": None,
                "condition": "a = b",
                "clauses": [{"when": "matched", "action": "delete", "condition": 1}],
            },
            "clauses[0].condition: expected a Spark SQL condition or nothing, found 1 (int)",
        ),
        (
            {"merge_sql": None, "condition": "", "clauses": [{"when": "matched", "action": "delete"}]},
            "condition: expected a non-empty string, found '' (str)",
        ),
    ],
)
def test_merge_form(changes: dict[str, Any], message: str) -> None:
    assert error_of(with_(**changes)) == message


def test_from_json_errors() -> None:
    with pytest.raises(
        MergeSpecError, match=r"^spec: expected a JSON object, found invalid JSON \(Expecting"
    ):
        MergeSpec.from_json("{not json")
    with pytest.raises(MergeSpecError, match=r"^spec: expected a JSON object, found 'x' \(str\)"):
        MergeSpec.from_json('"x"')


def test_python_built_specs_are_checked_too() -> None:
    spec = MergeSpec(
        target=TargetSpec(uri="/t"),
        source=SourceSpec(uri="/s"),
        condition="target.k = source.k",
        clauses=(MergeClause("matched", "update", None, (Assignment(("v",), 1),)),),  # type: ignore[arg-type]
    )
    with pytest.raises(MergeSpecError) as error:
        spec.validate()
    expected = "clauses[0].assignments v: expected a Spark SQL expression, found 1 (int)"
    assert error.value.bare_message == expected
    wrong = MergeSpec(target="/t", source=SourceSpec(uri="/s"), merge_sql="x")  # type: ignore[arg-type]
    with pytest.raises(MergeSpecError, match=r"^target: expected a TargetSpec, found '/t' \(str\)$"):
        wrong.validate()


def test_validate_returns_the_parsed_merge_and_parsed_needs_no_validation() -> None:
    spec = MergeSpec.from_dict(
        with_(
            merge_sql=None,
            condition="target.id == source.id",
            clauses=[
                {"when": "matched", "condition": "source.op = 'D'", "action": "delete"},
                {"when": "matched", "action": "update", "set": {"target.v": "source.v"}},
            ],
        )
    )
    assert spec.validate() == spec.parsed()
    assert spec.parsed().condition == "target.id == source.id"  # as written: Spark runs this text
    assert spec.parsed().clauses[1].assignments == (Assignment(("v",), "source.v"),)


def test_source_query_may_carry_comments_and_a_trailing_semicolon() -> None:
    source = SourceSpec(query="-- changes of the day\nWITH c AS (SELECT * FROM v) SELECT * FROM c;")
    source.validate()


def test_source_storage_options_round_trip_and_stay_out_of_repr() -> None:
    source = SourceSpec.from_dict(
        {"uri": "s3://b/x", "format": "parquet", "storage_options": {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}}
    )
    source.validate()
    assert source.to_dict()["storage_options"] == {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    assert SourceSpec.from_dict(source.to_dict()) == source
    assert "s3cr3t" not in repr(source)
    assert "storage_options" not in SourceSpec(uri="/x").to_dict()


def test_source_format_may_be_omitted() -> None:
    assert MergeSpec.from_dict(with_(source={"uri": "/x"})).source == SourceSpec(uri="/x")


def test_the_statement_is_parsed_and_checked_once_per_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    import spark_jobs.delta_merge.spec as spec_module

    parses: list[str] = []
    real_parse = spec_module.parse_merge_sql

    def counting_parse(sql: str) -> Any:
        parses.append(sql)
        return real_parse(sql)

    monkeypatch.setattr(spec_module, "parse_merge_sql", counting_parse)
    spec = MergeSpec.from_dict(with_())
    first = spec.validate()  # the job's entry point checks the spec before starting Spark ...
    assert spec.validate() is first  # ... and run_merge gets the same parsed statement back
    assert len(parses) == 1
    assert MergeSpec.from_dict(spec.to_dict()) == spec  # the kept statement is no part of the contract


def test_where_the_credentials_came_from_round_trips_and_is_left_out_when_unknown() -> None:
    named = "aws_conn_id='lake_s3'"
    target = TargetSpec.from_dict({"uri": "s3://b/t", "credentials_from": named})
    source = SourceSpec.from_dict({"uri": "s3://b/x", "credentials_from": named})
    assert (target.credentials_from, source.credentials_from) == (named, named)
    assert TargetSpec.from_dict(target.to_dict()) == target
    assert SourceSpec.from_dict(source.to_dict()) == source
    assert "credentials_from" not in TargetSpec(uri="s3://b/t").to_dict()
    assert "credentials_from" not in SourceSpec(uri="s3://b/x").to_dict()
    with pytest.raises(MergeSpecError, match=r"target.credentials_from: expected where the credentials came"):
        TargetSpec.from_dict({"uri": "s3://b/t", "credentials_from": 3})
