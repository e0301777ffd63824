"""Delta column mapping (PROTOCOL.md "Column Mapping"): logical column names <-> physical names and ids.

In a column-mapped table (``delta.columnMapping.mode`` ``name`` or ``id``) every column and nested field
has a logical (display) name, a physical name (``delta.columnMapping.physicalName``) and an id
(``delta.columnMapping.id``). Parquet files, ``partitionValues`` keys and ``stats`` keys use the physical
name, and Parquet field ids carry the id; a rename changes only the logical name and a dropped column
stays in old files. This job reads files by physical name (``name`` mode) or by field id (``id`` mode),
works on logical names in Spark, and writes physical names and field ids. The ``element``, ``key`` and
``value`` fields of arrays and maps have ids too where the table gives them
(``delta.columnMapping.nested.ids`` on their nearest struct field, as Delta keeps them for
IcebergCompatV2): those go into the Parquet schema as well, and fields a merge adds get them on such tables.

Hand-written because nothing on this job's path does it: delta-spark is not used, and deltalake only
translates partition values (``get_add_actions`` gives them by logical name, stats by physical name).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from spark_jobs.delta_merge.sql_names import quoted_name

__all__ = [
    "ARROW_FIELD_ID_KEY",
    "COLUMN_ID_KEY",
    "MAX_COLUMN_ID_PROPERTY",
    "MODES",
    "MODE_PROPERTY",
    "NESTED_IDS_KEY",
    "assign_column_mapping",
    "logical_column",
    "map_new_fields",
    "mapping_mode",
    "max_column_id_update",
    "partition_keys",
    "physical_arrow_schema",
    "physical_name",
    "physical_path",
    "physical_read_schema",
]

MODE_PROPERTY = "delta.columnMapping.mode"
MAX_COLUMN_ID_PROPERTY = "delta.columnMapping.maxColumnId"
COLUMN_ID_KEY = _ID_KEY = "delta.columnMapping.id"
_PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
# {"<physical name>.element" | ".key" | ".value" (chained for deeper levels): id}, on the nearest struct
# field: where Delta keeps the ids of array elements and map keys and values (PROTOCOL.md, IcebergCompatV2).
NESTED_IDS_KEY = "delta.columnMapping.nested.ids"
# Spark's Parquet reader matches a requested field by this id (spark.sql.parquet.fieldId.read.enabled).
_SPARK_FIELD_ID_KEY = "parquet.field.id"
# pyarrow's Parquet writer turns this Arrow field metadata into the field_id of the Parquet schema.
ARROW_FIELD_ID_KEY = b"PARQUET:field_id"
MODES = ("none", "name", "id")


def mapping_mode(configuration: Mapping[str, str], *, supported: bool = True) -> str:
    r"""The table's column mapping mode, lower-cased: ``none`` when the property is unset, or when the
    protocol does not ``support``\ column mapping (PROTOCOL.md "Column Mapping": writer version 5 or 6,
    or 7 with the ``columnMapping`` feature). Then the property has no effect and the files hold logical
    names, as deltalake writes a table created with the property on protocol 3/7 without the feature."""
    if not supported:
        return "none"
    for key, value in configuration.items():
        if key.lower() == MODE_PROPERTY.lower():
            return str(value).lower()
    return "none"


def physical_name(field: StructField, mode: str) -> str:
    """The name of ``field`` in Parquet files, ``partitionValues`` and stats."""
    if mode == "none":
        return field.name
    return str(field.metadata.get(_PHYSICAL_NAME_KEY, field.name))


def partition_keys(schema: StructType, partition_columns: Sequence[str], mode: str) -> dict[str, str]:
    """``partitionValues`` key by partition column (logical name), in partition order."""
    return {c: physical_name(schema[c], mode) for c in partition_columns}


def physical_path(schema: StructType, path: Sequence[str], mode: str) -> tuple[str, ...]:
    """The physical form of a path of logical field names through structs (as stats leaves are)."""
    out: list[str] = []
    struct: DataType = schema
    for name in path:
        if not isinstance(struct, StructType):
            raise ValueError(f"column path {list(path)} does not go through structs only")
        field = struct[name]
        out.append(physical_name(field, mode))
        struct = field.dataType
    return tuple(out)


def physical_read_schema(schema: StructType, mode: str) -> StructType:
    """The schema to hand Spark's Parquet reader for files of ``schema``: physical names at every level,
    and in ``id`` mode the field ids Spark matches by instead of names."""
    if mode == "none":
        return schema
    return StructType([_physical_field(f, mode) for f in schema.fields])


def _physical_field(field: StructField, mode: str) -> StructField:
    metadata: dict[str, Any] = {}
    if mode == "id" and _ID_KEY in field.metadata:
        metadata[_SPARK_FIELD_ID_KEY] = int(field.metadata[_ID_KEY])
    name = physical_name(field, mode)
    return StructField(name, _physical_type(field.dataType, mode), field.nullable, metadata)


def _physical_type(data_type: DataType, mode: str) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([_physical_field(f, mode) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(_physical_type(data_type.elementType, mode), data_type.containsNull)
    if isinstance(data_type, MapType):
        return MapType(_physical_type(data_type.keyType, mode), _physical_type(data_type.valueType, mode),
                       data_type.valueContainsNull)
    return data_type


def logical_column(field: StructField, mode: str) -> Column:
    """The column read by :func:`physical_read_schema`, back under ``field``'s logical names.

    Nested fields are renamed by a cast, which maps struct fields by position; the target type is all
    nullable, as Spark reads every file column.
    """
    column = F.col(quoted_name(physical_name(field, mode)))
    if mode != "none" and _has_struct(field.dataType):
        column = column.cast(_nullable(field.dataType))
    return column.alias(field.name)


def _has_struct(data_type: DataType) -> bool:
    if isinstance(data_type, StructType):
        return True
    if isinstance(data_type, ArrayType):
        return _has_struct(data_type.elementType)
    if isinstance(data_type, MapType):
        return _has_struct(data_type.keyType) or _has_struct(data_type.valueType)
    return False


def _nullable(data_type: DataType) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(_nullable(data_type.keyType), _nullable(data_type.valueType), True)
    return data_type


def physical_arrow_schema(schema: StructType, arrow: pa.Schema, mode: str) -> pa.Schema:
    """``arrow`` (the Arrow form of some of ``schema``'s columns, by logical name) with physical names
    and, from ``delta.columnMapping.id``, Parquet field ids at every level (PROTOCOL.md asks for both in
    either mode)."""
    if mode == "none":
        return arrow
    return pa.schema([_arrow_field(schema[f.name], f, mode) for f in arrow])


def _arrow_field(field: StructField, arrow: pa.Field, mode: str) -> pa.Field:
    name = physical_name(field, mode)
    nested = field.metadata.get(NESTED_IDS_KEY) or {}
    return _with_field_id(pa.field(name, _arrow_type(field.dataType, arrow.type, mode, nested, name),
                                   nullable=arrow.nullable), field.metadata.get(_ID_KEY))


def _with_field_id(arrow: pa.Field, field_id: object) -> pa.Field:
    return arrow if field_id is None else arrow.with_metadata({ARROW_FIELD_ID_KEY: str(field_id).encode()})


def _arrow_type(
    data_type: DataType, arrow: pa.DataType, mode: str, nested: Mapping[str, Any], prefix: str
) -> pa.DataType:
    if isinstance(data_type, StructType):
        return pa.struct([_arrow_field(f, arrow.field(i), mode) for i, f in enumerate(data_type.fields)])
    if isinstance(data_type, ArrayType):
        key = f"{prefix}.element"
        return pa.list_(_nested_arrow_field(data_type.elementType, arrow.value_field, mode, nested, key))
    if isinstance(data_type, MapType):
        key = _nested_arrow_field(data_type.keyType, arrow.key_field, mode, nested, f"{prefix}.key")
        item = _nested_arrow_field(data_type.valueType, arrow.item_field, mode, nested, f"{prefix}.value")
        return pa.map_(key, item)
    return arrow


def _nested_arrow_field(
    data_type: DataType, arrow: pa.Field, mode: str, nested: Mapping[str, Any], key: str
) -> pa.Field:
    typed = arrow.with_type(_arrow_type(data_type, arrow.type, mode, nested, key))
    return _with_field_id(typed, nested.get(key))


def assign_column_mapping(
    old: StructType, new: StructType, max_column_id: int, *, nested_ids: bool = False
) -> tuple[StructType, int]:
    """``new`` (``old`` evolved) with every field that ``old`` lacks given the next free id and a fresh
    ``col-<uuid>`` physical name, at any depth; returns it and the new highest id.

    Fields of ``old`` keep their mapping. Mapping metadata a new field brought along (from a column-mapped
    source) is replaced: ids and physical names belong to this table.

    :param nested_ids: also give the arrays and maps of new fields ids for their element, key and value
        (:data:`NESTED_IDS_KEY`), after the fields' own ids, as Delta does on IcebergCompatV2 tables.
    """
    counter = [max_column_id]
    fields = [_assigned(f, _field(old, f.name), counter) for f in new.fields]
    assigned = StructType(fields)
    if nested_ids:
        assigned = StructType([_with_nested_ids(f, _field(old, f.name), counter) for f in assigned.fields])
    return assigned, counter[0]


def _with_nested_ids(field: StructField, old: StructField | None, counter: list[int]) -> StructField:
    data_type = _nested_ids_within(field.dataType, old.dataType if old is not None else None, counter)
    metadata = dict(field.metadata)
    if old is None:
        ids = {}
        for key in _nested_id_keys(field.dataType, str(metadata.get(_PHYSICAL_NAME_KEY, field.name))):
            counter[0] += 1
            ids[key] = counter[0]
        metadata[NESTED_IDS_KEY] = ids
    return StructField(field.name, data_type, field.nullable, metadata)


def _nested_ids_within(data_type: DataType, old: DataType | None, counter: list[int]) -> DataType:
    """``data_type`` with nested ids for the new struct fields inside it (at any depth)."""
    if isinstance(data_type, StructType):
        return StructType([_with_nested_ids(f, _field(old, f.name), counter) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        old_element = old.elementType if isinstance(old, ArrayType) else None
        element = _nested_ids_within(data_type.elementType, old_element, counter)
        return ArrayType(element, data_type.containsNull)
    if isinstance(data_type, MapType):
        old_key = old.keyType if isinstance(old, MapType) else None
        old_value = old.valueType if isinstance(old, MapType) else None
        key = _nested_ids_within(data_type.keyType, old_key, counter)
        return MapType(key, _nested_ids_within(data_type.valueType, old_value, counter),
                       data_type.valueContainsNull)
    return data_type


def _nested_id_keys(data_type: DataType, prefix: str) -> list[str]:
    """The :data:`NESTED_IDS_KEY` keys of a field's arrays and maps, down to the next struct."""
    if isinstance(data_type, ArrayType):
        return [f"{prefix}.element", *_nested_id_keys(data_type.elementType, f"{prefix}.element")]
    if isinstance(data_type, MapType):
        return [f"{prefix}.key", f"{prefix}.value", *_nested_id_keys(data_type.keyType, f"{prefix}.key"),
                *_nested_id_keys(data_type.valueType, f"{prefix}.value")]
    return []


def _field(struct: DataType | None, name: str) -> StructField | None:
    if not isinstance(struct, StructType):
        return None
    return next((f for f in struct.fields if f.name.lower() == name.lower()), None)


def _assigned(field: StructField, old: StructField | None, counter: list[int]) -> StructField:
    # A column-mapped source read in id mode carries Spark's field ids: they are no table metadata.
    metadata = {k: v for k, v in field.metadata.items() if k != _SPARK_FIELD_ID_KEY}
    if old is not None:
        # An existing column's files already use its mapping (or, lacking one, its name): keep it.
        for key in (_ID_KEY, _PHYSICAL_NAME_KEY):
            metadata.pop(key, None)
            if key in old.metadata:
                metadata[key] = old.metadata[key]
    else:
        counter[0] += 1
        metadata[_ID_KEY] = counter[0]
        metadata[_PHYSICAL_NAME_KEY] = f"col-{uuid.uuid4()}"
    old_type = old.dataType if old is not None else None
    data_type = _assigned_type(field.dataType, old_type, counter)
    return StructField(field.name, data_type, field.nullable, metadata)


def _assigned_type(data_type: DataType, old: DataType | None, counter: list[int]) -> DataType:
    if isinstance(data_type, StructType):
        return StructType([_assigned(f, _field(old, f.name), counter) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        old_element = old.elementType if isinstance(old, ArrayType) else None
        return ArrayType(_assigned_type(data_type.elementType, old_element, counter), data_type.containsNull)
    if isinstance(data_type, MapType):
        old_key = old.keyType if isinstance(old, MapType) else None
        old_value = old.valueType if isinstance(old, MapType) else None
        return MapType(_assigned_type(data_type.keyType, old_key, counter),
                       _assigned_type(data_type.valueType, old_value, counter), data_type.valueContainsNull)
    return data_type


def map_new_fields(
    configuration: Mapping[str, str], old: StructType, new: StructType, *, mode: str, nested_ids: bool = False
) -> StructType:
    """For a column-mapped table (``mode`` not ``none``): ``new`` (``old`` evolved) with mapping for its
    new fields; as it is otherwise. Ids continue from the larger of ``delta.columnMapping.maxColumnId``
    and the ids in use, so a table whose property lags behind its schema never gets an id twice.

    :param nested_ids: the table keeps ids for array elements and map keys and values (IcebergCompatV2).
    """
    if mode == "none":
        return new
    current = max(int(configuration.get(MAX_COLUMN_ID_PROPERTY, "0") or 0), _max_id(old))
    return assign_column_mapping(old, new, current, nested_ids=nested_ids)[0]


def max_column_id_update(
    configuration: Mapping[str, str], schema: StructType, *, mode: str
) -> dict[str, str]:
    """The ``delta.columnMapping.maxColumnId`` to commit with ``schema`` of a table in column mapping
    ``mode``: PROTOCOL.md wants it moved in the commit that introduces the columns. Nothing when the
    property already covers every id."""
    if mode == "none":
        return {}
    highest = _max_id(schema)
    if highest <= int(configuration.get(MAX_COLUMN_ID_PROPERTY, "0") or 0):
        return {}
    return {MAX_COLUMN_ID_PROPERTY: str(highest)}


def _field_ids(field: StructField) -> int:
    """The highest id a field holds: its own, or one of its nested ids (which ``maxColumnId`` counts too)."""
    nested = field.metadata.get(NESTED_IDS_KEY) or {}
    return max([int(field.metadata.get(_ID_KEY, 0)), *(int(i) for i in nested.values())])


def _max_id(data_type: DataType) -> int:
    if isinstance(data_type, StructType):
        return max((max(_field_ids(f), _max_id(f.dataType)) for f in data_type.fields), default=0)
    if isinstance(data_type, ArrayType):
        return _max_id(data_type.elementType)
    if isinstance(data_type, MapType):
        return max(_max_id(data_type.keyType), _max_id(data_type.valueType))
    return 0


