"""Schema evolution for MERGE: which source columns and struct fields join the target schema."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.delta_merge.analysis.store_assignment import find_field
from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.protocol.type_widening import (
    WideningRule,
    with_recorded_type_changes,
)
from spark_jobs.delta_merge.sql_names import quoted_path
from spark_jobs.delta_merge.statement.parsed_merge import ParsedMerge

__all__ = ["evolve_schema"]

Path = tuple[str, ...]


def _merge_types(target: DataType, source: DataType, *, widen: WideningRule | None) -> DataType:
    """The target type widened by the source's extra struct fields; existing types are kept, unless
    ``widen`` (a type-widening table's rule) takes the source's type as one Delta widens the target's to.

    :raises _IncompatibleTypes: the source type has no implicit cast to the target's.
    """
    if isinstance(target, StructType) and isinstance(source, StructType):
        return _merge_structs(target, source, widen=widen)
    if isinstance(target, ArrayType) and isinstance(source, ArrayType):
        element = _merge_types(target.elementType, source.elementType, widen=widen)
        return ArrayType(element, target.containsNull)
    if isinstance(target, MapType) and isinstance(source, MapType):
        return MapType(
            _merge_types(target.keyType, source.keyType, widen=widen),
            _merge_types(target.valueType, source.valueType, widen=widen),
            target.valueContainsNull,
        )
    if widen is not None and widen(target, source):
        return source
    if not _implicitly_castable(source, target):
        raise _IncompatibleTypes(target, source)
    return target


class _IncompatibleTypes(Exception):
    def __init__(self, target: DataType, source: DataType) -> None:
        names = f"{_scala_name(target)} and {_scala_name(source)}"
        super().__init__(f"Failed to merge incompatible data types {names}")


_NUMERIC = (ByteType, ShortType, IntegerType, LongType, FloatType, DoubleType, DecimalType)


def _implicitly_castable(source: DataType, target: DataType) -> bool:
    """Whether Spark's ``TypeCoercion.implicitCast`` turns a value of ``source`` into ``target``: the test
    Delta's mergeSchemas makes (``allowImplicitConversions``, as MERGE calls it) before it keeps the
    target's type. Structs, arrays and maps are merged field by field before this is asked."""
    if source == target or isinstance(source, NullType):
        return True
    if isinstance(source, _NUMERIC) and isinstance(target, _NUMERIC):
        return True
    if isinstance(source, StringType):
        return isinstance(target, (*_NUMERIC, DateType, TimestampType, BinaryType, StringType))
    if isinstance(source, DateType) and isinstance(target, TimestampType):
        return True
    atomic = not isinstance(source, (StructType, ArrayType, MapType))
    return atomic and isinstance(target, StringType)


def _scala_name(data_type: DataType) -> str:
    """The type as Delta's message prints it (Scala's toString): ``BooleanType``, ``DecimalType(10,2)``."""
    if isinstance(data_type, DecimalType):
        return f"DecimalType({data_type.precision},{data_type.scale})"
    if isinstance(data_type, (StructType, ArrayType, MapType)):
        return data_type.simpleString()
    return type(data_type).__name__


def _merge_structs(target: StructType, source: StructType, *, widen: WideningRule | None) -> StructType:
    # As Delta's SchemaMergingUtils.mergeSchemas: target fields first, in order, with their types (a
    # VOID source field takes the target's type; a source type with no implicit cast to the target's is
    # refused; on a type-widening table a wider source type widens the field, recorded in its
    # delta.typeChanges); then the source's new fields, VOID ones included (evolve_schema refuses those, as
    # Delta does).
    fields = []
    for f in target.fields:
        s = find_field(source, f.name)
        if s is None:
            fields.append(f)
            continue
        try:
            merged = _merge_types(f.dataType, s.dataType, widen=widen)
        except _IncompatibleTypes as incompatible:
            raise MergeAnalysisError(
                f"Failed to merge fields '{f.name}' and '{s.name}'. {incompatible}",
                error_class="DELTA_FAILED_TO_MERGE_FIELDS",
            ) from None
        fields.append(with_recorded_type_changes(f, merged) if merged != f.dataType
                      else StructField(f.name, merged, f.nullable, f.metadata))  # fmt: skip
    fields += [
        StructField(s.name, s.dataType, True) for s in source.fields if find_field(target, s.name) is None
    ]
    return StructType(fields)


def _is_prefix(prefix: Path, path: Path) -> bool:
    return len(prefix) <= len(path) and path[:len(prefix)] == prefix


def _assigned_source_fields(
    source: StructType, assigned: Sequence[Path], *, star: bool, base: Path = ()
) -> StructType:
    """Delta's ``filterSchema``: the source fields some clause assigns (a struct assigned as a whole
    keeps all its fields; a struct some of whose fields are assigned keeps those), or all with ``*``."""
    fields: list[StructField] = []
    for field in source.fields:
        path = (*base, field.name.lower())
        if path in assigned or star:
            fields.append(field)
        elif isinstance(field.dataType, StructType) and any(_is_prefix(path, a) for a in assigned):
            nested = _assigned_source_fields(field.dataType, assigned, star=star, base=path)
            fields.append(StructField(field.name, nested, field.nullable, field.metadata))
    return StructType(fields)


def _void_column(data_type: DataType, path: Path = ()) -> Path | None:
    """The path of the first VOID column or field (Delta's ``SchemaUtils.findNullTypeColumn``)."""
    if isinstance(data_type, NullType):
        return path
    if isinstance(data_type, StructType):
        for field in data_type.fields:
            found = _void_column(field.dataType, (*path, field.name))
            if found is not None:
                return found
    if isinstance(data_type, ArrayType):
        return _void_column(data_type.elementType, path)
    if isinstance(data_type, MapType):
        return _void_column(data_type.keyType, path) or _void_column(data_type.valueType, path)
    return None


def evolve_schema(
    parsed: ParsedMerge, target: StructType, source: StructType, *, enabled: bool,
    widen_types: WideningRule | None = None,
) -> StructType:
    """The table schema after the merge.

    Like Delta's ``resolveReferencesAndSchema`` with schema evolution: the source is filtered to the
    columns and nested fields that MATCHED and NOT MATCHED clauses assign (every one with ``*``; an
    explicit assignment names the target column by the source's name for it; NOT MATCHED BY SOURCE
    clauses see no source and add nothing), then merged into the target schema: new columns and fields
    come after the existing ones, in source order, and the types of existing columns never change, except
    with ``widen_types`` (a table with ``delta.enableTypeWidening``), where a wider source type widens them
    (``delta.typeChanges`` records it). Without evolution the target schema stays as it is.

    :raises MergeAnalysisError: (``DELTA_MERGE_ADD_VOID_COLUMN``) evolution would add a VOID (NULL-typed)
        column or field, which Delta refuses.
    """
    if not enabled:
        return target
    clauses = [c for c in parsed.clauses if c.when != "not_matched_by_source"]
    star = any(c.action in ("update_all", "insert_all") for c in clauses)
    assigned = [tuple(part.lower() for part in a.column) for c in clauses for a in c.assignments]
    evolved = _merge_structs(target, _assigned_source_fields(source, assigned, star=star), widen=widen_types)
    void = _void_column(evolved)
    if void is not None:
        name = quoted_path(void)
        raise MergeAnalysisError(
            f"Cannot add column {name} with type VOID. Please explicitly specify a non-void type.",
            error_class="DELTA_MERGE_ADD_VOID_COLUMN",
        )
    return evolved
