"""Universal Format (UniForm), one unit: after a merge commits, the Iceberg metadata of the version it
committed, as Delta's ``IcebergConverter`` writes it as a post-commit hook.

``iceberg_schema`` maps Delta's schema, partitioning and file statistics to Iceberg's; ``iceberg_metadata``
writes the snapshot and the metadata file. pyiceberg is imported only for tables that ask for Iceberg
metadata (``delta.universalFormat.enabledFormats`` naming ``iceberg``), so other merges never load it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_jobs.delta_merge.protocol.snapshot import TargetSnapshot

__all__ = ["ENABLED_FORMATS_PROPERTY", "uniform_iceberg_enabled", "write_iceberg_metadata"]

ENABLED_FORMATS_PROPERTY = "delta.universalFormat.enabledFormats"

log = logging.getLogger("delta_merge")


def uniform_iceberg_enabled(configuration: Mapping[str, str]) -> bool:
    """``delta.universalFormat.enabledFormats`` names ``iceberg``: every version gets Iceberg metadata."""
    config = {key.lower(): value for key, value in configuration.items()}
    formats = config.get(ENABLED_FORMATS_PROPERTY.lower(), "")
    return "iceberg" in {part.strip().lower() for part in formats.split(",")}


def write_iceberg_metadata(snapshot: TargetSnapshot, *, commit_timestamp_ms: int | None = None) -> str | None:
    """Write the Iceberg metadata of ``snapshot``'s version; return its location (None when the newest
    Iceberg metadata already holds this version or a later one).

    A failure is logged, not raised, as Delta's converter (which runs after the commit) does: the Delta
    version is committed, and failing the task would invite a retry that, without an app transaction, would
    apply the merge twice. Iceberg readers keep the previous version until the next conversion, which
    catches up (each conversion diffs the Iceberg files against the Delta version's).
    """
    from spark_jobs.delta_merge.uniform.iceberg_metadata import convert_to_iceberg

    try:
        converted = convert_to_iceberg(snapshot, commit_timestamp_ms=commit_timestamp_ms)
    except Exception as exc:  # the commit stands; see the docstring
        log.error(
            "UniForm: Delta version %d of %s is committed, but its Iceberg metadata could not be written "
            "(%s: %s). Iceberg readers see the previous version until the next merge into the table (or a "
            "rerun of this one with the same app_id) writes it.",
            snapshot.version,
            snapshot.table_uri,
            type(exc).__name__,
            exc,
        )
        return None
    if converted is None:
        log.info("UniForm: the Iceberg metadata already holds Delta version %d or later", snapshot.version)
        return None
    log.info(
        "UniForm: Iceberg metadata of Delta version %d written to %s (%s, %d files added, %d deleted)",
        converted.delta_version,
        converted.metadata_location,
        converted.operation or "no snapshot",
        converted.added_files,
        converted.deleted_files,
    )
    return converted.metadata_location
