"""load_snapshot against real deltalake tables, and add.path <-> URI normalization."""

from __future__ import annotations

import datetime as dt
import json
import os
import struct
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Schema, write_deltalake

from spark_jobs.delta_merge.errors import MergeAnalysisError, MergeExecutionError
from spark_jobs.delta_merge.protocol.files import FileStats
from spark_jobs.delta_merge.protocol.snapshot import (
    TargetSnapshot,
    load_snapshot,
    relative_path_from_uri,
)

TRICKY = ["a b", "x=y", "50%", "a/b", "ünï", None, "plain", "%20", "+plus"]


def _tricky_table(root: Path) -> Path:
    n = len(TRICKY)
    data = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "p": pa.array(TRICKY, pa.string()),
            "d": pa.array([dt.date(2024, 1, 2)] * (n - 1) + [None], pa.date32()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, 123456)] * (n - 2) + [dt.datetime(2024, 5, 6), None],
                pa.timestamp("us", tz="UTC"),
            ),
            "v": pa.array([f"v{i}" for i in range(n)]),
            "t": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 123000)] * n, pa.timestamp("us", tz="UTC")),
            "s": pa.array(
                [{"x": i, "y": None} for i in range(n)], pa.struct([("x", pa.int32()), ("y", pa.string())])
            ),
            "f": pa.array([1.5] * n, pa.float64()),
        }
    )
    write_deltalake(root, data, partition_by=["p", "d", "ts"])
    return root


def _log_adds(root: Path) -> dict[str, dict[str, Any]]:
    adds: dict[str, dict[str, Any]] = {}
    for commit in sorted((root / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                adds[action["add"]["path"]] = action["add"]
            if "remove" in action:
                adds.pop(action["remove"]["path"], None)
    return adds


@pytest.fixture(scope="module")
def tricky_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tricky_table(tmp_path_factory.mktemp("dir with space ü %") / "tricky table")


@pytest.fixture(scope="module")
def tricky(tricky_root: Path) -> TargetSnapshot:
    return load_snapshot(str(tricky_root))


def test_files_match_the_log_exactly(tricky_root: Path, tricky: TargetSnapshot) -> None:
    adds = _log_adds(tricky_root)
    assert sorted(f.path for f in tricky.files) == sorted(adds)
    for f in tricky.files:
        add = adds[f.path]
        assert f.size == add["size"]
        assert f.modification_time == add["modificationTime"]
        assert dict(f.partition_values) == add["partitionValues"]
        raw = json.loads(add["stats"])
        assert f.stats == FileStats(raw["numRecords"], raw["minValues"], raw["maxValues"], raw["nullCount"])
        assert not f.has_deletion_vector


def test_snapshot_metadata(tricky_root: Path, tricky: TargetSnapshot) -> None:
    assert tricky.table_uri == "file://" + quote(str(tricky_root))
    assert tricky.version == 0
    assert tricky.partition_columns == ("p", "d", "ts")
    assert tricky.schema.fieldNames() == ["id", "p", "d", "ts", "v", "t", "s", "f"]
    assert json.loads(tricky.schema_json)["fields"][0]["name"] == "id"
    assert tricky.protocol.min_reader_version >= 1
    assert tricky.metadata_id
    assert "files" not in repr(tricky)


def test_file_uri_is_the_decoded_path_spark_reads(tricky: TargetSnapshot) -> None:
    for f in tricky.files:
        uri = tricky.file_uri(f)
        assert uri.startswith("file:///")
        assert os.path.isfile(uri[len("file://") :])


def _java_style_uri(path: str) -> str:
    # What Hadoop's Path.toUri().toString() gives: '%' and spaces encoded, non-ASCII kept raw.
    return "file:" + "".join(c if ord(c) > 127 else quote(c, safe="/=+-_.~:@!$&'()*,;") for c in path)


def test_relative_path_from_spark_style_uris(tricky: TargetSnapshot) -> None:
    for f in tricky.files:
        local = tricky.file_uri(f)[len("file://") :]
        assert relative_path_from_uri(tricky, _java_style_uri(local)) == f.path
        assert relative_path_from_uri(tricky, "file://" + quote(local)) == f.path
        assert relative_path_from_uri(tricky, "s3a://" + quote(local)) == f.path  # the scheme is ignored


def test_relative_path_rejects_unknown_files(tricky: TargetSnapshot) -> None:
    f = tricky.files[0]
    with pytest.raises(MergeExecutionError, match="not a live file"):
        # the decoded form is not a URI: '%3D' on disk would read as '='
        relative_path_from_uri(tricky, "file:" + tricky.file_uri(f)[len("file://") :] + ".gone")


def test_version_pinning(tmp_path: Path) -> None:
    write_deltalake(tmp_path, pa.table({"id": pa.array([1], pa.int64())}))
    write_deltalake(tmp_path, pa.table({"id": pa.array([2], pa.int64())}), mode="append")
    assert len(load_snapshot(str(tmp_path), version=0).files) == 1
    latest = load_snapshot(f"file://{tmp_path}")
    assert (latest.version, len(latest.files)) == (1, 2)


def test_empty_table(tmp_path: Path) -> None:
    DeltaTable.create(
        tmp_path,
        schema=Schema.from_json(
            '{"type":"struct","fields":[{"name":"id","type":"long","nullable":false,"metadata":{}}]}'
        ),
    )
    snapshot = load_snapshot(str(tmp_path))
    assert snapshot.files == ()
    assert not snapshot.schema["id"].nullable


def test_missing_path(tmp_path: Path) -> None:
    missing = r"^\[DELTA_MISSING_DELTA_TABLE\] .*nope is not a Delta table\. .*nope does not exist"
    with pytest.raises(MergeAnalysisError, match=missing):
        load_snapshot(str(tmp_path / "nope"))


def test_not_a_delta_table(tmp_path: Path) -> None:
    with pytest.raises(
        MergeAnalysisError, match=r"is not a Delta table\. No _delta_log/ found.*write_deltalake"
    ):
        load_snapshot(str(tmp_path))
    (tmp_path / "_delta_log").mkdir()
    with pytest.raises(MergeAnalysisError, match=r"is not a Delta table\. No commits found"):
        load_snapshot(str(tmp_path))


def test_corrupt_log(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / "00000000000000000000.json").write_text("{not json\n")
    with pytest.raises(
        MergeAnalysisError, match=r"Cannot read the Delta log of target .*_delta_log/ is intact"
    ) as err:
        load_snapshot(str(tmp_path))
    assert "backtrace" not in str(err.value)
    assert "\n" not in str(err.value)


def test_version_beyond_latest(tmp_path: Path) -> None:
    write_deltalake(tmp_path, pa.table({"id": pa.array([1], pa.int64())}))
    with pytest.raises(MergeAnalysisError, match="has no version 5: the latest version is 0"):
        load_snapshot(str(tmp_path), version=5)


_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _inline_dv(rows: list[int]) -> tuple[str, int]:
    """An inline deletion vector (Delta's RoaringBitmapArray, one array container), Z85-encoded."""
    container = b"".join(struct.pack("<H", r) for r in sorted(rows))
    bitmap = struct.pack("<IIHHI", 12346, 1, 0, len(rows) - 1, 16) + container
    data = struct.pack("<iqi", 1681511377, 1, 0) + bitmap  # Z85 needs len % 4 == 0: even row counts
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        out.append("".join(_Z85[value // 85**k % 85] for k in range(4, -1, -1)))
    return "".join(out), len(data)


def test_deletion_vectors_are_detected(tmp_path: Path) -> None:
    root = tmp_path / "dv table %"
    write_deltalake(
        root,
        pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "p": ["a b", "a b", "c", "c"]}),
        partition_by=["p"],
    )
    target = next(a for a in _log_adds(root).values() if a["partitionValues"]["p"] == "a b")
    encoded, size = _inline_dv([0, 1])
    dv_add = {
        **target,
        "deletionVector": {
            "storageType": "i",
            "pathOrInlineDv": encoded,
            "sizeInBytes": size,
            "cardinality": 2,
        },
    }
    remove = {"path": target["path"], "deletionTimestamp": 1, "dataChange": True}
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["deletionVectors"],
    }
    lines = [
        {"commitInfo": {"operation": "DELETE"}},
        {"protocol": protocol},
        {"remove": remove},
        {"add": dv_add},
    ]
    (root / "_delta_log" / "00000000000000000001.json").write_text(
        "".join(json.dumps(a) + "\n" for a in lines)
    )
    snapshot = load_snapshot(str(root))
    assert snapshot.protocol.reader_features == frozenset({"deletionVectors"})
    flagged = {f.path: f.has_deletion_vector for f in snapshot.files}
    assert flagged == {p: p == target["path"] for p in _log_adds(root)}
def test_spark_reads_file_uri_and_maps_metadata_file_path_back(spark: Any, tricky: TargetSnapshot) -> None:
    by_uri = {tricky.file_uri(f): f.path for f in tricky.files}
    df = spark.read.parquet(*by_uri).select("id", "_metadata.file_path")
    rows = df.collect()
    assert len(rows) == len(TRICKY)
    assert {relative_path_from_uri(tricky, r.file_path) for r in rows} == set(by_uri.values())
