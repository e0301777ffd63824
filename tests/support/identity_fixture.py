"""Turn a deltalake-made table into one with an identity column, by a hand-written commit.

deltalake cannot create identity columns, so the next version is written here per PROTOCOL.md "Identity
Columns": a protocol action (writer version 6, or 3/7 with the ``identityColumns`` writer feature) and a
metaData action whose schema gives the column ``delta.identity.*`` metadata.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def _latest(log: Path) -> int:
    return max(int(p.stem) for p in log.glob("*.json"))


def _last_metadata(log: Path) -> dict[str, Any]:
    metadata = None
    for version in range(_latest(log) + 1):
        for line in (log / f"{version:020d}.json").read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                metadata = action["metaData"]
    assert metadata is not None
    return dict(metadata)


def make_identity_column(
    table: Path, column: str, *, start: int = 1, step: int = 1, always: bool = True,
    high_water_mark: int | None = None, table_features: bool = False,
) -> int:
    """Commit the next version making ``column`` (a BIGINT column) an identity column.

    :param always: GENERATED ALWAYS (``allowExplicitInsert`` false) or BY DEFAULT.
    :param high_water_mark: the mark to record; None means no value was generated yet.
    :param table_features: protocol 3/7 with the ``identityColumns`` writer feature instead of 1/6.
    :returns: the version committed.
    """
    log = table / "_delta_log"
    metadata = _last_metadata(log)
    schema = json.loads(metadata["schemaString"])
    identity: dict[str, Any] = {
        "delta.identity.start": start, "delta.identity.step": step,
        "delta.identity.allowExplicitInsert": not always,
    }
    if high_water_mark is not None:
        identity["delta.identity.highWaterMark"] = high_water_mark
    fields = [f["name"] for f in schema["fields"]]
    assert column in fields, fields
    for field in schema["fields"]:
        if field["name"] == column:
            field["metadata"] = {**field.get("metadata", {}), **identity}
    metadata["schemaString"] = json.dumps(schema)
    if table_features:
        protocol: dict[str, Any] = {
            "minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": [],
            "writerFeatures": ["appendOnly", "invariants", "identityColumns"],
        }
    else:
        protocol = {"minReaderVersion": 1, "minWriterVersion": 6}
    actions = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "CHANGE COLUMN"}},
        {"protocol": protocol},
        {"metaData": metadata},
    ]
    version = _latest(log) + 1
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    return version


def identity_metadata(table: Path, column: str) -> dict[str, Any]:
    """The ``delta.identity.*`` metadata of ``column`` in the latest metaData action of the log."""
    schema = json.loads(_last_metadata(table / "_delta_log")["schemaString"])
    field = next(f for f in schema["fields"] if f["name"] == column)
    return {k: v for k, v in field.get("metadata", {}).items() if k.startswith("delta.identity.")}


def commit_high_water_mark(table: Path, column: str, mark: int) -> int:
    """Commit the next version with only a metaData action moving ``column``'s mark, as a concurrent
    writer that generated values up to ``mark`` does; returns the version."""
    log = table / "_delta_log"
    metadata = _last_metadata(log)
    schema = json.loads(metadata["schemaString"])
    for field in schema["fields"]:
        if field["name"] == column:
            field["metadata"]["delta.identity.highWaterMark"] = mark
    metadata["schemaString"] = json.dumps(schema)
    actions = [
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE"}},
        {"metaData": metadata},
    ]
    version = _latest(log) + 1
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    return version
