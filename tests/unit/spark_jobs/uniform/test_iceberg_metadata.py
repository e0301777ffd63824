"""The Iceberg metadata a conversion writes for a Delta version: its files, snapshots and properties, read
back with pyiceberg. The Delta snapshots are built by hand (only their log side matters here: the files a
version holds); tests/unit/spark_jobs/test_uniform_tables.py merges real tables and reads their rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import StaticTable

from spark_jobs.delta_merge.protocol.delta_schema import spark_schema_from_delta
from spark_jobs.delta_merge.protocol.files import FileStats, LiveFile
from spark_jobs.delta_merge.protocol.snapshot import TableProtocol, TargetSnapshot
from spark_jobs.delta_merge.uniform import uniform_iceberg_enabled
from spark_jobs.delta_merge.uniform.iceberg_metadata import convert_to_iceberg, latest_metadata_location

CONFIGURATION = {
    "delta.columnMapping.mode": "name",
    "delta.enableIcebergCompatV2": "true",
    "delta.universalFormat.enabledFormats": "iceberg",
    "delta.columnMapping.maxColumnId": "2",
    "delta.universalFormat.config.iceberg.write.metadata.previous-versions-max": "5",
}


def _field(name: str, type_json: str, field_id: int) -> dict[str, object]:
    return {
        "name": name,
        "type": type_json,
        "nullable": True,
        "metadata": {"delta.columnMapping.id": field_id, "delta.columnMapping.physicalName": f"col-{name}"},
    }


def _snapshot(root: Path, version: int, paths: list[str], *, columns: int = 2) -> TargetSnapshot:
    fields = [_field("id", "long", 1), _field("p", "string", 2), _field("extra", "string", 3)][:columns]
    schema_json = json.dumps({"type": "struct", "fields": fields})
    files = tuple(
        LiveFile(
            path=path,
            size=100 + i,
            partition_values={"col-p": path.split("/")[0].split("=")[1]},
            stats=FileStats(
                num_records=i + 1,
                min_values={"col-id": i},
                max_values={"col-id": i + 10},
                null_count={"col-id": 0},
            ),
            modification_time=0,
        )
        for i, path in enumerate(paths)
    )
    return TargetSnapshot(
        table_uri=str(root),
        version=version,
        schema=spark_schema_from_delta(schema_json),
        schema_json=schema_json,
        partition_columns=("p",),
        configuration=CONFIGURATION,
        protocol=TableProtocol(2, 7, frozenset(), frozenset({"columnMapping", "icebergCompatV2"})),
        metadata_id="m",
        files=files,
    )


def _entries(location: str) -> dict[str, tuple[ManifestEntryStatus, int | None]]:
    table = StaticTable.from_metadata(location)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        entry.data_file.file_path.rsplit("/", 1)[-1]: (entry.status, entry.sequence_number)
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
    }


def test_each_version_becomes_a_snapshot_diffed_against_the_last_one(tmp_path: Path) -> None:
    root = tmp_path / "my table"  # a space: Iceberg paths are the decoded ones
    first = convert_to_iceberg(
        _snapshot(root, 1, ["p=a/one.parquet", "p=b/two%20x.parquet"]), commit_timestamp_ms=7
    )
    assert first is not None
    assert first.operation == "append"
    assert first.metadata_location.endswith(".metadata.json")
    assert Path(first.metadata_location.removeprefix("file://")).name.startswith("00000-")
    table = StaticTable.from_metadata(first.metadata_location)
    assert table.metadata.format_version == 2
    assert table.properties["delta-version"] == "1"
    assert table.properties["delta-timestamp"] == "7"
    assert table.properties["write.metadata.previous-versions-max"] == "5"  # Delta's iceberg config, copied
    assert json.loads(table.properties["schema.name-mapping.default"])[0] == {"field-id": 1, "names": ["id"]}
    assert [(f.field_id, f.name) for f in table.schema().fields] == [(1, "id"), (2, "p")]
    assert [f.field_id for f in table.spec().fields] == [1000]
    files = {task.file.file_path: task.file for task in table.scan().plan_files()}
    assert set(files) == {f"file://{root}/p=a/one.parquet", f"file://{root}/p=b/two x.parquet"}
    assert files[f"file://{root}/p=b/two x.parquet"].record_count == 2

    # Version 2 removes one file and adds one; the kept file stays EXISTING with its sequence number.
    second = convert_to_iceberg(_snapshot(root, 2, ["p=a/one.parquet", "p=a/three.parquet"]))
    assert second is not None
    assert (second.operation, second.added_files, second.deleted_files) == ("overwrite", 1, 1)
    assert _entries(second.metadata_location) == {
        "one.parquet": (ManifestEntryStatus.EXISTING, 1),
        "two x.parquet": (ManifestEntryStatus.DELETED, 1),
        "three.parquet": (ManifestEntryStatus.ADDED, 2),
    }
    table = StaticTable.from_metadata(second.metadata_location)
    assert [s.parent_snapshot_id for s in table.metadata.snapshots][1] == table.metadata.snapshots[
        0
    ].snapshot_id
    assert [entry.metadata_file for entry in table.metadata.metadata_log] == [first.metadata_location]
    assert latest_metadata_location(str(root)) == second.metadata_location

    # A version already converted (or older) writes nothing; one without file changes writes no snapshot.
    assert convert_to_iceberg(_snapshot(root, 2, ["p=a/one.parquet"])) is None
    evolved = convert_to_iceberg(_snapshot(root, 3, ["p=a/one.parquet", "p=a/three.parquet"], columns=3))
    assert evolved is not None
    assert evolved.operation is None
    table = StaticTable.from_metadata(evolved.metadata_location)
    assert len(table.metadata.snapshots) == 2
    assert table.properties["delta-version"] == "3"
    assert [f.name for f in table.schema().fields] == ["id", "p", "extra"]
    assert table.schema().schema_id == 1

    # A version dropping every file is a delete.
    emptied = convert_to_iceberg(_snapshot(root, 4, []))
    assert emptied is not None
    assert emptied.operation == "delete"
    assert list(StaticTable.from_metadata(emptied.metadata_location).scan().plan_files()) == []


def test_of_two_metadata_files_with_one_number_the_later_delta_version_is_the_newest(tmp_path: Path) -> None:
    root = tmp_path / "t"
    base = convert_to_iceberg(_snapshot(root, 1, ["p=a/one.parquet"]))
    assert base is not None
    later = convert_to_iceberg(_snapshot(root, 3, ["p=a/one.parquet", "p=a/two.parquet"]))
    assert later is not None
    # Another converter, working from the same base at the same time, wrote its 00001 for version 2.
    (root / "metadata" / "later.json").write_text(
        Path(later.metadata_location.removeprefix("file://")).read_text()
    )
    Path(later.metadata_location.removeprefix("file://")).unlink()
    earlier = convert_to_iceberg(_snapshot(root, 2, ["p=a/one.parquet"]))
    assert earlier is not None
    shutil.move(root / "metadata" / "later.json", later.metadata_location.removeprefix("file://"))
    assert Path(earlier.metadata_location).name[:5] == Path(later.metadata_location).name[:5] == "00001"
    assert latest_metadata_location(str(root)) == later.metadata_location
    newest = FromInputFile.table_metadata(
        StaticTable.from_metadata(later.metadata_location).io.new_input(later.metadata_location)
    )
    assert newest.properties["delta-version"] == "3"


def test_iceberg_is_enabled_where_the_formats_name_it() -> None:
    assert uniform_iceberg_enabled({"delta.universalFormat.enabledFormats": "hudi, ICEBERG"})
    assert not uniform_iceberg_enabled({"delta.universalFormat.enabledFormats": "hudi"})
    assert not uniform_iceberg_enabled({})


def test_a_table_moved_with_its_iceberg_metadata_starts_a_new_iceberg_history(tmp_path: Path) -> None:
    """Its newest metadata lists manifests at the old root, which no longer exist."""
    old_root, new_root = tmp_path / "old", tmp_path / "new"
    first = convert_to_iceberg(_snapshot(old_root, 1, ["p=a/one.parquet"]))
    assert first is not None
    shutil.move(old_root, new_root)
    moved = convert_to_iceberg(_snapshot(new_root, 2, ["p=a/one.parquet", "p=a/two.parquet"]))
    assert moved is not None
    assert (moved.operation, moved.added_files, moved.deleted_files) == ("append", 2, 0)
    assert Path(moved.metadata_location).name.startswith("00001-")
    table = StaticTable.from_metadata(moved.metadata_location)
    assert list(table.metadata.metadata_log) == []
    assert {task.file.file_path for task in table.scan().plan_files()} == {
        f"file://{new_root}/p=a/one.parquet", f"file://{new_root}/p=a/two.parquet"
    }
