"""Schema evolution for MERGE: which source columns and struct fields join the target schema."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, DataType, MapType, NullType, StructField, StructType

from spark_jobs.delta_merge.spec import ParsedMerge
from spark_jobs.delta_merge.store_assignment import find_field

__all__ = ["evolve_schema"]


def _merge_types(target: DataType, source: DataType) -> DataType:
    """The target type widened by the source's extra struct fields; existing types are kept."""
    if isinstance(target, StructType) and isinstance(source, StructType):
        fields = [
            StructField(f.name, _merge_types(f.dataType, s.dataType) if (s := find_field(source, f.name)) else
                        f.dataType, f.nullable, f.metadata)
            for f in target.fields
        ]
        fields += [
            StructField(s.name, s.dataType, True)
            for s in source.fields
            if find_field(target, s.name) is None and not isinstance(s.dataType, NullType)
        ]
        return StructType(fields)
    if isinstance(target, ArrayType) and isinstance(source, ArrayType):
        return ArrayType(_merge_types(target.elementType, source.elementType), target.containsNull)
    if isinstance(target, MapType) and isinstance(source, MapType):
        return MapType(
            _merge_types(target.keyType, source.keyType),
            _merge_types(target.valueType, source.valueType),
            target.valueContainsNull,
        )
    return target


def evolve_schema(
    parsed: ParsedMerge, target: StructType, source: StructType, *, enabled: bool
) -> StructType:
    """The table schema after the merge.

    Like Delta's ``resolveReferencesAndSchema`` with ``schema.autoMerge.enabled``: ``*`` actions bring
    every source column (and nested struct field) the target lacks; an explicit assignment brings the
    source column of the same name. New columns come after the existing ones, in source order, and the
    types of existing columns never change. Without evolution the target schema stays as it is.
    """
    if not enabled:
        return target
    has_star = any(c.action in ("update_all", "insert_all") for c in parsed.clauses)
    assigned = {a.column[0].lower() for c in parsed.clauses for a in c.assignments if len(a.column) >= 1}
    fields: list[StructField] = []
    for field in target.fields:
        source_field = find_field(source, field.name)
        if has_star and source_field is not None:
            fields.append(
                StructField(field.name, _merge_types(field.dataType, source_field.dataType), field.nullable,
                            field.metadata)
            )
        else:
            fields.append(field)
    for source_field in source.fields:
        if find_field(target, source_field.name) is not None or isinstance(source_field.dataType, NullType):
            continue
        if has_star or source_field.name.lower() in assigned:
            fields.append(StructField(source_field.name, source_field.dataType, True))
    return StructType(fields)
