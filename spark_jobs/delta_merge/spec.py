"""The merge spec: the JSON contract between the Airflow operator and the Spark job (stdlib + sqlglot only).

It depends one way on the parser (``merge_sql``), which depends on the parsed statement (``parsed_merge``).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Protocol, TypeVar

from spark_jobs.delta_merge.errors import MergeSpecError
from spark_jobs.delta_merge.field_checks import check_choice as _check_choice
from spark_jobs.delta_merge.field_checks import check_str as _check_str
from spark_jobs.delta_merge.field_checks import fail as _fail
from spark_jobs.delta_merge.field_checks import keys_of as _keys
from spark_jobs.delta_merge.metrics import MergeMetrics
from spark_jobs.delta_merge.statement.expression_guard import tokenize_checked
from spark_jobs.delta_merge.statement.merge_rules import check_parsed_merge, parse_structural
from spark_jobs.delta_merge.statement.merge_sql import parse_merge_sql
from spark_jobs.delta_merge.statement.parsed_merge import (
    ActionKind,
    Assignment,
    ClauseKind,
    MergeClause,
    ParsedMerge,
    format_column_path,
    parse_column_path,
)

__all__ = [
    "ENGINES",
    "NATIVE_ONLY_OPTIONS",
    "ActionKind",
    "Assignment",
    "ClauseKind",
    "MergeClause",
    "MergeOptions",
    "MergeSpec",
    "ParsedMerge",
    "RunSpec",
    "SourceSpec",
    "TargetSpec",
    "format_column_path",
    "parse_column_path",
]

_SOURCE_FORMATS = ("delta", "parquet", "csv", "json", "orc")
ENGINES = ("native", "delta")

# What only the native job does, by the spec's field, and why Delta's MERGE cannot: refused before anything
# runs (and by the operator when it is built).
NATIVE_ONLY_OPTIONS: dict[str, str] = {
    "options.dry_run": "Delta's MERGE has no dry run: it computes its metrics only by committing",
    "expected_metrics": "Delta's MERGE commits before its metrics are known: there is no moment to check "
    "them before the commit",
    "options.target_file_size": "Delta's MERGE sizes its files by its own write (optimized writes and the "
    "table's delta.targetFileSize), not per merge",
    "target.storage_options": "Delta opens the table through the cluster's Hadoop file system settings "
    "(spark.hadoop.fs.s3a.*, fs.azure.*, ...), not per-table storage options; configure those in "
    "spark_conf or on the cluster",
}

# pyspark.StorageLevel's names (the job looks the level up there), NONE left out: it would not materialize.
_STORAGE_LEVELS = (
    "DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3", "MEMORY_AND_DISK", "MEMORY_AND_DISK_2",
    "MEMORY_AND_DISK_DESER", "MEMORY_ONLY", "MEMORY_ONLY_2", "OFF_HEAP",
)  # fmt: skip
_COMPARATORS = ("equal_to", "greater_than", "less_than", "geq_to", "leq_to", "tolerance")
# The metrics expected_metrics may check: the numbers of MergeMetrics (its flags count as 0 or 1).
_CHECKABLE_METRICS = tuple(f.name for f in fields(MergeMetrics) if f.type in ("int", "bool"))
_QUERY_STARTS = ("SELECT", "WITH", "FROM", "VALUES", "TABLE", "L_PAREN")


@dataclass(frozen=True)
class TargetSpec:
    """The target Delta table.

    :param credentials_from: where the credentials in ``storage_options`` came from when they did not
        come from the spec's author (the provider's ``"aws_conn_id='lake_s3'"``): storage errors name it.
    """

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict)
    credentials_from: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, field: str = "target") -> TargetSpec:
        """``{"uri", "storage_options"?, "credentials_from"?}``."""
        return _build(cls, data, field, required=("uri",))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        data = _plain(self)
        if self.credentials_from is None:
            del data["credentials_from"]
        return data

    def validate(self, *, field: str = "target") -> None:
        """Check types and values."""
        _check_str(self.uri, f"{field}.uri", "a non-empty path or URI")
        _check_str_map(self.storage_options, f"{field}.storage_options")
        if self.credentials_from is not None:
            _check_str(self.credentials_from, f"{field}.credentials_from", "where the credentials came from")


@dataclass(frozen=True)
class SourceSpec:
    """The source: a path or URI with a format and reader options, or a Spark SQL query.

    :param format: ``delta``, ``parquet``, ``csv``, ``json`` or ``orc`` (None: parquet).
    :param version: for ``format="delta"``, the table version to read (None: the latest).
    :param storage_options: how to reach a source on an object store, as deltalake takes them
        (``AWS_ENDPOINT_URL``, keys, region, ``AWS_ALLOW_HTTP``; on Azure ``azure_storage_account_name``
        with ``azure_storage_account_key`` or ``azure_storage_sas_token``). A Delta source also takes them
        from ``options``, where they were given before this field existed.
    :param credentials_from: as the target's: where the credentials in ``storage_options`` came from.
    """

    uri: str | None = None
    format: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    query: str | None = None
    version: int | None = None
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    credentials_from: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, field: str = "source") -> SourceSpec:
        """``{"uri", "format"?, "options"?, "version"?, "storage_options"?, "credentials_from"?}`` or
        ``{"query"}``."""
        return _build(cls, data, field)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: only the keys of the form in use."""
        data: dict[str, Any] = {} if self.uri is None else {"uri": self.uri}
        if self.format is not None:
            data["format"] = self.format
        if self.uri is not None or self.options:
            data["options"] = dict(self.options)
        optional: dict[str, Any] = {"query": self.query, "version": self.version,
                                    "credentials_from": self.credentials_from}  # fmt: skip
        if self.storage_options:
            optional["storage_options"] = dict(self.storage_options)
        return data | {key: value for key, value in optional.items() if value is not None}

    def validate(self, *, field: str = "source") -> None:
        """Check types and values; a query must be one SELECT-like statement."""
        if (self.uri is None) == (self.query is None):
            found = "neither" if self.uri is None else "both"
            raise MergeSpecError(f"{field}: expected exactly one of uri and query, found {found}")
        _check_str_map(self.options, f"{field}.options")
        _check_str_map(self.storage_options, f"{field}.storage_options")
        if self.credentials_from is not None:
            _check_str(self.credentials_from, f"{field}.credentials_from", "where the credentials came from")
        if self.query is not None:
            _check_str(self.query, f"{field}.query", "a Spark SQL query")
            for key, value in (("format", self.format), ("version", self.version), ("options", self.options)):
                if value:
                    raise _fail(f"{field}.{key}", "nothing with source.query (put it in the query)", value)
            if self.storage_options:
                # Keys only: the values hold secrets.
                raise _fail(f"{field}.storage_options", "nothing with source.query",
                            f"keys {sorted(self.storage_options)}")  # fmt: skip
            # Comments are fine here: the query is run as written, never spliced into other SQL.
            tokens = tokenize_checked(
                self.query, field=f"{field}.query", allow_trailing_semicolon=True, comments=True
            )
            if tokens[0].token_type.name not in _QUERY_STARTS:
                raise _fail(f"{field}.query", "a query (SELECT, WITH, FROM, VALUES or TABLE)", self.query)
            return
        _check_str(self.uri, f"{field}.uri", "a non-empty path or URI")
        if self.format is not None:
            _check_choice(self.format, f"{field}.format", _SOURCE_FORMATS)
        if self.version is not None:
            _check_int(self.version, f"{field}.version", minimum=0)
            if self.format != "delta":
                raise _fail(f"{field}.version", "a version only with format 'delta'", self.format)


@dataclass(frozen=True)
class MergeOptions:
    """Execution options.

    :param materialize_source: ``auto``, ``all`` or ``none`` (Delta's ``merge.materializeSource``).
    :param materialize_storage_level: Spark storage level of the materialized source.
    :param schema_evolution: Delta's ``spark.databricks.delta.schema.autoMerge.enabled``.
    :param target_file_size: bytes per written file (default: the table's ``delta.targetFileSize``).
    :param store_assignment_policy: ``ANSI`` (default), ``LEGACY`` or ``STRICT``, as Spark's
        ``spark.sql.storeAssignmentPolicy``.
    :param resolve_structs_by_name: Delta's ``resolveMergeUpdateStructsByName.enabled``.
    :param shuffle_partitions: ``spark.sql.shuffle.partitions`` during the merge (None: chosen by size).
    :param dry_run: compute the metrics without writing or committing anything.
    :param engine: ``native`` (default): the job's own MERGE pipeline, on any Spark; ``delta``: Delta's own
        ``MERGE INTO``, on a session that has Delta (:mod:`spark_jobs.delta_merge.delta_engine`).
    """

    materialize_source: Literal["auto", "all", "none"] = "auto"
    materialize_storage_level: str = "MEMORY_AND_DISK"
    schema_evolution: bool = False
    target_file_size: int | None = None
    store_assignment_policy: Literal["ANSI", "LEGACY", "STRICT"] = "ANSI"
    resolve_structs_by_name: bool = True
    shuffle_partitions: int | None = None
    dry_run: bool = False
    engine: Literal["native", "delta"] = "native"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, field: str = "options") -> MergeOptions:
        """Keys are the field names; absent keys keep their defaults."""
        return _build(cls, data, field, what="option")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, every option spelled out."""
        return _plain(self)

    def validate(self, *, field: str = "options") -> None:
        """Check types and values."""
        _check_choice(self.materialize_source, f"{field}.materialize_source", ("auto", "all", "none"))
        _check_choice(self.materialize_storage_level, f"{field}.materialize_storage_level", _STORAGE_LEVELS)
        policies = ("ANSI", "LEGACY", "STRICT")
        _check_choice(self.store_assignment_policy, f"{field}.store_assignment_policy", policies)
        _check_choice(self.engine, f"{field}.engine", ENGINES)
        for name in ("schema_evolution", "resolve_structs_by_name", "dry_run"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(f"{field}.{name}", "true or false", getattr(self, name))
        for name in ("target_file_size", "shuffle_partitions"):
            if getattr(self, name) is not None:
                _check_int(getattr(self, name), f"{field}.{name}", minimum=1, absent="or null")


@dataclass(frozen=True)
class RunSpec:
    """Identity of one application of the merge (the idempotency key) and what to record with it."""

    app_id: str | None = None
    app_version: int | None = None
    commit_metadata: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, field: str = "run") -> RunSpec:
        """``{"app_id"?, "app_version"?, "commit_metadata"?}``."""
        return _build(cls, data, field)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return _plain(self)

    def validate(self, *, field: str = "run") -> None:
        """Check types and values; app_id and app_version come together or not at all."""
        if self.app_id is not None:
            _check_str(self.app_id, f"{field}.app_id", "a non-empty application id")
        if self.app_version is not None:
            _check_int(self.app_version, f"{field}.app_version", minimum=0)
        if (self.app_id is None) != (self.app_version is None):
            given = "app_id" if self.app_version is None else "app_version"
            raise MergeSpecError(f"{field}: expected app_id and app_version or neither, found {given} only")
        if not isinstance(self.commit_metadata, Mapping):
            raise _fail(f"{field}.commit_metadata", "a JSON object", self.commit_metadata)
        _check_json(self.commit_metadata, f"{field}.commit_metadata")


@dataclass(frozen=True)
class MergeSpec:
    """One merge: target, source, the statement (SQL or structural) and options.

    Give either ``merge_sql`` or the structural form (``condition`` and ``clauses``, with optional
    ``target_alias`` / ``source_alias``, "target" and "source" by default). ``parsed()`` turns both into
    the same :class:`ParsedMerge`.
    """

    target: TargetSpec
    source: SourceSpec
    merge_sql: str | None = None
    target_alias: str | None = None
    source_alias: str | None = None
    condition: str | None = None
    clauses: tuple[MergeClause, ...] = ()
    options: MergeOptions = field(default_factory=MergeOptions)
    run: RunSpec = field(default_factory=RunSpec)
    expected_metrics: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MergeSpec:
        """Build from the JSON form, refusing unknown keys and wrong types (validate() checks the SQL)."""
        keys = _keys(data, "spec", allowed=[f.name for f in fields(cls)], required=("target", "source"))
        clauses = keys.get("clauses", [])
        if not isinstance(clauses, list):
            raise _fail("clauses", "a JSON array of WHEN clauses", clauses)
        spec = cls(
            target=TargetSpec.from_dict(keys["target"]),
            source=SourceSpec.from_dict(keys["source"]),
            merge_sql=keys.get("merge_sql"),
            target_alias=keys.get("target_alias"),
            source_alias=keys.get("source_alias"),
            condition=keys.get("condition"),
            clauses=tuple(MergeClause.from_dict(c, field=f"clauses[{i}]") for i, c in enumerate(clauses)),
            options=MergeOptions.from_dict(keys.get("options", {})),
            run=RunSpec.from_dict(keys.get("run", {})),
            expected_metrics=_copy(keys.get("expected_metrics", {})),
        )
        spec._check_fields()
        return spec

    @classmethod
    def from_json(cls, text: str | bytes) -> MergeSpec:
        """Build from JSON text."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as error:
            raise MergeSpecError(f"spec: expected a JSON object, found invalid JSON ({error})") from error
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; ``MergeSpec.from_dict(spec.to_dict()) == spec``."""
        data: dict[str, Any] = {"target": self.target.to_dict(), "source": self.source.to_dict()}
        optional = {
            "merge_sql": self.merge_sql,
            "target_alias": self.target_alias,
            "source_alias": self.source_alias,
            "condition": self.condition,
        }
        data |= {key: value for key, value in optional.items() if value is not None}
        if self.clauses:
            data["clauses"] = [clause.to_dict() for clause in self.clauses]
        data["options"] = self.options.to_dict()
        data["run"] = self.run.to_dict()
        data["expected_metrics"] = _copy(self.expected_metrics)
        return data

    def to_json(self, *, indent: int | None = None) -> str:
        """JSON text; ``MergeSpec.from_json(spec.to_json()) == spec``."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def parsed(self) -> ParsedMerge:
        """The merge in one normal form, from either ``merge_sql`` or the structural form.

        :raises MergeSpecError: when the statement or an expression does not parse.
        """
        self._check_form()
        if self.merge_sql is not None:
            return parse_merge_sql(self.merge_sql)
        return parse_structural(
            target_alias=self.target_alias or "target",
            source_alias=self.source_alias or "source",
            condition=str(self.condition),
            clauses=self.clauses,
        )

    def validate(self) -> ParsedMerge:
        """Check everything: fields, Delta's MERGE rules, and every expression through the guard.

        The statement is parsed and checked once per spec: the parsed merge is kept with the spec, and a
        later call (the job's entry point, then ``run_merge``) returns it again.

        :returns: the parsed merge.
        :raises MergeSpecError: naming the field, what was expected and what was found.
        """
        checked: ParsedMerge | None = self.__dict__.get("_checked_statement")
        if checked is not None:
            return checked
        self._check_fields()
        parsed = self.parsed()
        check_parsed_merge(parsed, sql_form=self.merge_sql is not None)
        object.__setattr__(self, "_checked_statement", parsed)
        return parsed

    def _check_form(self) -> None:
        names = ("target_alias", "source_alias", "condition")
        structural = [name for name in names if getattr(self, name) is not None]
        structural += ["clauses"] if self.clauses else []
        if self.merge_sql is not None:
            _check_str(self.merge_sql, "merge_sql", "a MERGE INTO statement")
            if structural:
                raise MergeSpecError(
                    f"merge_sql: expected either merge_sql or the structural form, found merge_sql and "
                    f"{', '.join(structural)}"
                )
        elif not structural:
            raise MergeSpecError(
                "merge_sql: expected either merge_sql or the structural form (condition and clauses), "
                "found neither"
            )
        elif self.condition is None:
            raise MergeSpecError("condition: expected the ON condition of the structural form, found nothing")

    def _check_fields(self) -> None:
        parts: dict[str, type[TargetSpec | SourceSpec | MergeOptions | RunSpec]] = {
            "target": TargetSpec, "source": SourceSpec, "options": MergeOptions, "run": RunSpec
        }  # fmt: skip
        for name, kind in parts.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise _fail(name, f"a {kind.__name__}", value)
            value.validate(field=name)
        self._check_form()
        for name in ("target_alias", "source_alias", "condition"):
            if getattr(self, name) is not None:
                _check_str(getattr(self, name), name, "a non-empty string")
        if not isinstance(self.clauses, tuple):
            raise _fail("clauses", "a tuple of MergeClause", self.clauses)
        for index, clause in enumerate(self.clauses):
            if not isinstance(clause, MergeClause):
                raise _fail(f"clauses[{index}]", "a MergeClause", clause)
            clause.validate(field=f"clauses[{index}]")
        _check_expected_metrics(self.expected_metrics)
        if self.options.engine == "delta":
            _check_delta_engine(self)


class _Part(Protocol):
    def validate(self, *, field: str) -> None: ...


_P = TypeVar("_P", bound=_Part)


def _build(cls: type[_P], data: object, field: str, *, required: Sequence[str] = (), what: str = "key") -> _P:
    allowed = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    # Copies, so that a spec never shares a mutable dict with the caller's data.
    given = _keys(data, field, allowed=allowed, required=required, what=what)
    kwargs = {key: _copy(value) for key, value in given.items()}
    part = cls(**kwargs)
    part.validate(field=field)
    return part


def _plain(part: object) -> dict[str, Any]:
    return {f.name: _copy(getattr(part, f.name)) for f in fields(part)}  # type: ignore[arg-type]


def _copy(value: Any) -> Any:
    return copy.deepcopy(dict(value)) if isinstance(value, Mapping) else value


def _check_int(value: object, field: str, *, minimum: int, absent: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(field, f"an integer >= {minimum} {absent}".strip(), value)


def _check_str_map(value: object, field: str) -> None:
    if not isinstance(value, Mapping):
        raise _fail(field, "a JSON object of string: string", value)
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise _fail(f"{field}.{key}", "a string value (options are passed to Spark as strings)", item)


def _check_json(value: object, field: str) -> None:
    # Exactly JSON's types, so that the spec survives a JSON round trip unchanged.
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _fail(field, "string keys", key)
            _check_json(item, f"{field}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{field}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise _fail(field, "a finite number", value)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise _fail(field, "a JSON value (object, array, string, number, true, false or null)", value)


def _check_expected_metrics(value: object) -> None:
    if not isinstance(value, Mapping):
        raise _fail("expected_metrics", "a JSON object of metric: {comparator: number}", value)
    _keys(value, "expected_metrics", allowed=_CHECKABLE_METRICS, what="metric")
    for metric, checks in value.items():
        where = f"expected_metrics.{metric}"
        if not isinstance(metric, str) or not metric:
            raise _fail("expected_metrics", "metric names as keys", metric)
        if not isinstance(checks, Mapping) or not checks:
            raise _fail(where, f"an object of comparator ({', '.join(_COMPARATORS)}): number", checks)
        for comparator, number in checks.items():
            _check_choice(comparator, where, _COMPARATORS)
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
                raise _fail(f"{where}.{comparator}", "a finite number", number)
        if "tolerance" in checks and ("equal_to" not in checks or checks["tolerance"] < 0):
            raise _fail(f"{where}.tolerance", "a number >= 0 alongside equal_to", dict(checks))


def _check_delta_engine(spec: MergeSpec) -> None:
    """Refuse what Delta's MERGE cannot honour, naming the spec's field.

    :raises MergeSpecError: before anything runs.
    """
    asked = {
        "options.dry_run": spec.options.dry_run,
        "expected_metrics": bool(spec.expected_metrics),
        "options.target_file_size": spec.options.target_file_size is not None,
        "target.storage_options": bool(spec.target.storage_options),
    }
    refused = [name for name, given in asked.items() if given]
    if refused:
        reasons = "; ".join(f"{name}: {NATIVE_ONLY_OPTIONS[name]}" for name in refused)
        raise MergeSpecError(
            f"options.engine 'delta' cannot honour {', '.join(refused)} ({reasons}). Leave them out, or use "
            "the native engine (options.engine 'native'), which does."
        )
    if spec.run.app_id is None:
        raise MergeSpecError(
            "run: options.engine 'delta' needs run.app_id and run.app_version: Delta records them as the "
            "commit's app transaction, which is how the merge's commit (and its metrics) is found in the log"
        )
