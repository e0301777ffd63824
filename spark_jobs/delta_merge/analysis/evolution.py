"""Schema evolution for MERGE: which source columns and struct fields join the target schema."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql.types import ArrayType, DataType, MapType, NullType, StructField, StructType

from spark_jobs.delta_merge.analysis.store_assignment import find_field
from spark_jobs.delta_merge.errors import MergeAnalysisError
from spark_jobs.delta_merge.statement.parsed_merge import ParsedMerge

__all__ = ["evolve_schema"]

Path = tuple[str, ...]


def _merge_types(target: DataType, source: DataType) -> DataType:
    """The target type widened by the source's extra struct fields; existing types are kept."""
    if isinstance(target, StructType) and isinstance(source, StructType):
        return _merge_structs(target, source)
    if isinstance(target, ArrayType) and isinstance(source, ArrayType):
        return ArrayType(_merge_types(target.elementType, source.elementType), target.containsNull)
    if isinstance(target, MapType) and isinstance(source, MapType):
        return MapType(
            _merge_types(target.keyType, source.keyType),
            _merge_types(target.valueType, source.valueType),
            target.valueContainsNull,
        )
    return target


def _merge_structs(target: StructType, source: StructType) -> StructType:
    # As Delta's SchemaMergingUtils.mergeSchemas: target fields first, in order, with their types (a
    # VOID source field takes the target's type); then the source's new fields, VOID ones included
    # (evolve_schema refuses those, as Delta does).
    fields = [
        StructField(f.name, _merge_types(f.dataType, s.dataType) if (s := find_field(source, f.name)) else
                    f.dataType, f.nullable, f.metadata)
        for f in target.fields
    ]
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
    parsed: ParsedMerge, target: StructType, source: StructType, *, enabled: bool
) -> StructType:
    """The table schema after the merge.

    Like Delta's ``resolveReferencesAndSchema`` with schema evolution: the source is filtered to the
    columns and nested fields that MATCHED and NOT MATCHED clauses assign (every one with ``*``; an
    explicit assignment names the target column by the source's name for it; NOT MATCHED BY SOURCE
    clauses see no source and add nothing), then merged into the target schema: new columns and fields
    come after the existing ones, in source order, and the types of existing columns never change.
    Without evolution the target schema stays as it is.

    :raises MergeAnalysisError: (``DELTA_MERGE_ADD_VOID_COLUMN``) evolution would add a VOID (NULL-typed)
        column or field, which Delta refuses.
    """
    if not enabled:
        return target
    clauses = [c for c in parsed.clauses if c.when != "not_matched_by_source"]
    star = any(c.action in ("update_all", "insert_all") for c in clauses)
    assigned = [tuple(part.lower() for part in a.column) for c in clauses for a in c.assignments]
    evolved = _merge_structs(target, _assigned_source_fields(source, assigned, star=star))
    void = _void_column(evolved)
    if void is not None:
        name = ".".join(f"`{part.replace('`', '``')}`" for part in void)
        raise MergeAnalysisError(
            f"Cannot add column {name} with type VOID. Please explicitly specify a non-void type.",
            error_class="DELTA_MERGE_ADD_VOID_COLUMN",
        )
    return evolved
