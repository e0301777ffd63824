"""Which Delta table features this job can write correctly, and the constraints it must enforce."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from pyspark.sql.types import StructField, StructType

from spark_jobs.delta_merge.errors import MergeAnalysisError, UnsupportedTableFeatureError
from spark_jobs.delta_merge.protocol.column_mapping import MODES
from spark_jobs.delta_merge.protocol.delta_schema import arrow_schema
from spark_jobs.delta_merge.protocol.file_stats import indexed_leaves
from spark_jobs.delta_merge.protocol.iceberg_compat import (
    ICEBERG_COMPAT_V2,
    iceberg_compat_problems,
    iceberg_compat_v2,
)
from spark_jobs.delta_merge.protocol.row_tracking import row_tracking
from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = [
    "SUPPORTED_FEATURES",
    "TableConstraints",
    "change_data_feed_enabled",
    "check_writable",
    "table_constraints",
]

# Features whose rules this job follows on every merge (constraints are enforced by the write stage).
# vacuumProtocolCheck only constrains VACUUM, which this job never runs. v2Checkpoint: deltalake 1.6.6
# reads V2 checkpoints and writes its own as classic-named V2 checkpoints carrying checkpointMetadata.
# changeDataFeed: merges into such tables write _change_data files and cdc actions, as Delta's.
# deletionVectors: files carrying one are read without their deleted rows and, when rewritten, removed with
# their descriptor; merges always rewrite (copy-on-write) and never write new vectors, whatever
# delta.enableDeletionVectors says (Delta's own writers may, too: the property only permits them).
# rowTracking: new files get baseRowId/defaultRowCommitVersion and the high-water mark moves (commit);
# with delta.enableRowTracking, rewritten rows keep their ids in the materialized columns (row_tracking).
# inCommitTimestamp: commitInfo carries a monotonic inCommitTimestamp (commit). clustering: merges write
# unclustered files (no clusteringProvider) with stats on the clustering columns, and leave the
# delta.clustering domain as it is.
# identityColumns: inserts draw new values beyond the high-water mark, which moves in the merge's own
# commit; explicit values and updates are refused as Delta does (identity_columns).
# columnMapping: files are read by physical name or field id and written with both (column_mapping.py).
# allowColumnDefaults: INSERT column lists leaving a column out, and `c = DEFAULT` assignments, take the
# column's CURRENT_DEFAULT expression as Spark's analyzer does (column_defaults).
# variantType: VARIANT columns are read by Spark's reader (or pyarrow's, as a struct of the value and
# metadata binaries) and written as that struct, with a nullCount and no bounds (file_stats); shredding
# (variantShredding-preview) is refused.
# materializePartitionColumns: new data and change data files hold the partition columns too, after the
# others (write/merge_output.py); readers, this job's scans included, take partition values from the log.
# checkpointProtection only binds log cleanup: commits and checkpoints before
# delta.requireCheckpointProtectionBeforeVersion may go only all at once. This job deletes no log file, and
# deltalake's create_checkpoint (commit.actions, every delta.checkpointInterval versions) writes the
# checkpoint of the version just committed and deletes nothing, even with delta.logRetentionDuration at
# zero (test_column_defaults checks the log).
# typeWidening (and its preview): files written before a column was widened are read up-cast to the
# schema's type and their narrower statistics are not used for skipping (scan); with
# delta.enableTypeWidening, schema evolution widens a column to a wider source type and records the change
# in delta.typeChanges, as Delta 4.4 does (protocol/type_widening).
# icebergCompatV2: merges keep its writer rules (protocol/iceberg_compat); where
# delta.universalFormat.enabledFormats names iceberg, each merge also writes the Iceberg metadata of the
# version it committed (uniform), as Delta's UniForm converter does after a commit.
SUPPORTED_FEATURES = frozenset(
    {
        "typeWidening",
        "typeWidening-preview",
        "appendOnly",
        "columnMapping",
        "changeDataFeed",
        "deletionVectors",
        "invariants",
        "checkConstraints",
        "generatedColumns",
        "timestampNtz",
        "domainMetadata",
        "vacuumProtocolCheck",
        "v2Checkpoint",
        "rowTracking",
        "inCommitTimestamp",
        "clustering",
        "identityColumns",
        "allowColumnDefaults",
        "checkpointProtection",
        "materializePartitionColumns",
        "variantType",
        "variantType-preview",
        ICEBERG_COMPAT_V2,
    }
)
_PROTOCOL = "protocol"
CLUSTERING_DOMAIN = "delta.clustering"
_APPEND_ONLY = "appendOnly"
# How Delta's messages name the writer ("... unsupported by Delta Lake "<version>"").
_ENGINE = "airflow-merge-provider merge job"

_WHY = {
    "icebergCompatV1": "IcebergCompatV1's rules (no arrays or maps, V1 Iceberg metadata) are not kept by "
    "this job; IcebergCompatV2 tables are merged",
    "variantShredding-preview": "shredded VARIANT files hold typed_value columns this job does not read",
}


@dataclass(frozen=True)
class TableConstraints:
    """What every written row must satisfy (enforced by the write stage).

    :param checks: CHECK constraints by name (``delta.constraints.<name>`` properties) plus legacy
        column invariants, named ``invariant:<dotted.path>``; values are Spark SQL boolean expressions.
    :param not_null: paths (struct field names from the root) of NOT NULL columns and fields.
    :param generated: generation expressions of generated (top-level) columns, by column name.
    """

    checks: Mapping[str, str] = field(default_factory=dict)
    not_null: tuple[tuple[str, ...], ...] = ()
    generated: Mapping[str, str] = field(default_factory=dict)


def check_writable(snapshot: TargetSnapshot, *, removes_files: bool) -> None:
    """Refuse, before anything is written, a merge this job cannot commit correctly.

    :param removes_files: the merge would remove (rewrite) files, i.e. it is not insert-only.
    :raises UnsupportedTableFeatureError: naming every problem found, why, and what to do.
    """
    problems = list(_problems(snapshot, removes_files=removes_files))
    if not problems:
        return
    error_class, head = _delta_refusal(snapshot, [feature for feature, _ in problems])
    listing = "\n".join(f"  - {problem}" for _, problem in problems)
    raise UnsupportedTableFeatureError(
        f"{head}\nTarget {snapshot.table_uri} (version {snapshot.version}) uses Delta features this merge "
        f"job cannot write correctly, so nothing was written:\n{listing}\n"
        "Run this merge with Delta Lake's own MERGE INTO instead (the operator's engine='delta', the spec's "
        "options.engine 'delta', on a Spark that has Delta), or change the table as suggested.",
        error_class=error_class,
    )


def _delta_refusal(snapshot: TargetSnapshot, features: list[str]) -> tuple[str, str]:
    """Delta's error class and text for the first check Delta would fail: protocol, features, appendOnly."""
    table = snapshot.table_uri
    protocol = snapshot.protocol
    if _PROTOCOL in features:
        return "DELTA_INVALID_PROTOCOL_VERSION", (
            f'Unsupported Delta protocol version: table "{table}" requires reader version '
            f"{protocol.min_reader_version} and writer version {protocol.min_writer_version}, but Delta Lake "
            f'"{_ENGINE}" supports reader versions 1-3 and writer versions 2-7. Please upgrade to a newer '
            "release."
        )
    unsupported = [f for f in features if f != _APPEND_ONLY]
    if unsupported and set(unsupported) == {ICEBERG_COMPAT_V2}:
        # The feature is supported; the table breaks one of its rules, which Delta reports so.
        return "DELTA_ICEBERG_COMPAT_VIOLATION", "The validation of IcebergCompatV2 has failed."
    if unsupported:
        return "DELTA_UNSUPPORTED_FEATURES_FOR_WRITE", (
            f'Unsupported Delta write feature: table "{table}" requires writer table feature(s) that are '
            f'unsupported by Delta Lake "{_ENGINE}": {", ".join(unsupported)}.'
        )
    return "DELTA_CANNOT_MODIFY_APPEND_ONLY", (
        "This table is configured to only allow appends. If you would like to permit updates or deletes, use "
        f"'ALTER TABLE delta.`{table}` SET TBLPROPERTIES (delta.appendOnly=false)'."
    )


def materializes_partition_columns(snapshot: TargetSnapshot) -> bool:
    """Every new file holds the partition columns: the ``materializePartitionColumns`` writer feature
    is on (PROTOCOL.md, "Materialize Partition Columns"), or IcebergCompatV2 is active, which asks the
    same (Iceberg readers take partition values from the files)."""
    writer_features = snapshot.protocol.writer_features
    return "materializePartitionColumns" in writer_features or iceberg_compat_v2(
        writer_features, snapshot.configuration
    )


def change_data_feed_enabled(snapshot: TargetSnapshot) -> bool:
    """``delta.enableChangeDataFeed`` is on: merges must write the rows they change (isCdcEnabled)."""
    config = {k.lower(): v for k, v in snapshot.configuration.items()}
    return config.get("delta.enablechangedatafeed", "false").lower() == "true"


def table_constraints(snapshot: TargetSnapshot) -> TableConstraints:
    """The CHECK constraints, invariants, NOT NULL paths and generated columns of the table."""
    prefix = "delta.constraints."
    checks = {
        key[len(prefix) :]: value for key, value in snapshot.configuration.items() if key.startswith(prefix)
    }
    not_null: list[tuple[str, ...]] = []
    generated: dict[str, str] = {}
    for path, struct_field in _struct_fields(snapshot.schema):
        if not struct_field.nullable:
            not_null.append(path)
        expression = struct_field.metadata.get("delta.generationExpression")
        if expression is not None and len(path) == 1:  # Delta has generated columns at the top level only
            generated[path[0]] = str(expression)
        invariant = struct_field.metadata.get("delta.invariants")
        if invariant is not None:
            checks[f"invariant:{'.'.join(path)}"] = _invariant_sql(path, invariant)
    return TableConstraints(checks=checks, not_null=tuple(not_null), generated=generated)


def _problems(snapshot: TargetSnapshot, *, removes_files: bool) -> Iterator[tuple[str, str]]:
    """(feature, why and what to do) per problem; the protocol version counts as feature ``protocol``."""
    protocol = snapshot.protocol
    config = {k.lower(): v for k, v in snapshot.configuration.items()}
    if protocol.min_reader_version > 3 or protocol.min_writer_version > 7:
        yield _PROTOCOL, (
            f"protocol version (reader {protocol.min_reader_version}, writer {protocol.min_writer_version}): "
            "newer than Delta's reader 3 / writer 7, whose rules this job knows."
        )
    mode = config.get("delta.columnmapping.mode", "none").lower()
    if mode not in MODES:
        yield "columnMapping", (
            f"columnMapping (delta.columnMapping.mode={mode}): not one of {', '.join(MODES)}, the modes "
            "Delta defines; fix the table property."
        )
    if removes_files and config.get("delta.appendonly", "false").lower() == "true":
        yield _APPEND_ONLY, (
            "appendOnly (delta.appendOnly=true): this merge updates or deletes rows, which removes files. "
            "Only insert-only merges are allowed; set delta.appendOnly=false to allow it."
        )
    yield from _row_tracking_problems(snapshot, config, removes_files=removes_files)
    yield from iceberg_compat_problems(protocol.writer_features, snapshot.configuration,
                                       column_mapping_mode=mode)  # fmt: skip
    yield from _clustering_problems(snapshot, config)
    unsupported = (protocol.reader_features | protocol.writer_features) - SUPPORTED_FEATURES
    for feature in sorted(unsupported):
        why = _WHY.get(feature, "this job does not know its rules")
        yield feature, f"{feature}: {why}."


def _row_tracking_problems(
    snapshot: TargetSnapshot, config: Mapping[str, str], *, removes_files: bool
) -> Iterator[tuple[str, str]]:
    tracking = row_tracking(snapshot)
    if tracking is not None and "domainMetadata" not in snapshot.protocol.writer_features:
        yield "rowTracking", (
            "rowTracking without domainMetadata in the protocol's writerFeatures: the row id high-water "
            "mark is a domainMetadata action, which this table does not allow. The protocol is invalid."
        )
    if tracking is None or config.get("delta.enablerowtracking", "false").lower() != "true":
        return
    if not tracking.preserves:
        yield "rowTracking", (
            "rowTracking (delta.enableRowTracking=true): the table names no materialized row id or row "
            "commit version column (delta.rowTracking.materializedRowIdColumnName / "
            "materializedRowCommitVersionColumnName), so rewritten rows could not keep their row ids."
        )


def _clustering_problems(snapshot: TargetSnapshot, config: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    # PROTOCOL.md "Clustered Table": every add must have statistics on the clustering columns.
    if "clustering" not in snapshot.protocol.writer_features or CLUSTERING_DOMAIN not in snapshot.domains:
        return
    try:
        columns = json.loads(snapshot.domains[CLUSTERING_DOMAIN])["clusteringColumns"]
    except (ValueError, KeyError, TypeError) as exc:
        raise MergeAnalysisError(
            f"Target {snapshot.table_uri} has a {CLUSTERING_DOMAIN} domain whose configuration is not "
            f'{{"clusteringColumns": [...]}}: {snapshot.domains[CLUSTERING_DOMAIN]!r}.'
        ) from exc
    data_schema = StructType([f for f in snapshot.schema.fields if f.name not in snapshot.partition_columns])
    indexed = {leaf.path for leaf in indexed_leaves(
        arrow_schema(data_schema), num_indexed_cols=int(config.get("delta.dataskippingnumindexedcols", "32"))
    )}  # fmt: skip
    paths = [tuple(c) if isinstance(c, list) else tuple(str(c).split(".")) for c in columns]
    if missing := [".".join(p) for p in paths if p not in indexed]:
        yield "clustering", (
            f"clustering (columns {', '.join(missing)}): writers must collect statistics on the clustering "
            "columns, but they are beyond delta.dataSkippingNumIndexedCols; raise it to cover them."
        )


def _struct_fields(schema: StructType) -> Iterator[tuple[tuple[str, ...], StructField]]:
    """Every field reachable through structs (Delta enforces nothing inside arrays and maps)."""
    stack: list[tuple[tuple[str, ...], StructType]] = [((), schema)]
    while stack:
        prefix, struct = stack.pop(0)
        for struct_field in struct.fields:
            path = (*prefix, struct_field.name)
            yield path, struct_field
            if isinstance(struct_field.dataType, StructType):
                stack.append((path, struct_field.dataType))


def _invariant_sql(path: tuple[str, ...], invariant: object) -> str:
    # Legacy invariants are stored as '{"expression": {"expression": "<sql>"}}'.
    try:
        value = json.loads(invariant) if isinstance(invariant, str) else invariant
        sql = value["expression"]["expression"]  # type: ignore[index]
    except (TypeError, KeyError, ValueError) as exc:
        raise MergeAnalysisError(
            f"Unrecognized invariant. Please upgrade your Spark version. Column {'.'.join(path)} has a "
            f'delta.invariants entry that is not {{"expression": {{"expression": "<sql>"}}}}: {invariant!r}.',
            error_class="DELTA_UNRECOGNIZED_INVARIANT",
        ) from exc
    return str(sql)
