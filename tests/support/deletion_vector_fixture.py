"""Give files of a deltalake-made table deletion vectors (deltalake cannot write them).

The vectors are stored by the job's own writer (``deletion_vectors.write_deletion_vectors`` and
``inline_deletion_vector``); the commit around them is written here per PROTOCOL.md "Deletion Vectors":
protocol 3/7 with the ``deletionVectors`` feature, and each chosen file's ``add`` replaced by remove + add
carrying the vector's descriptor.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spark_jobs.delta_merge.protocol.deletion_vectors import inline_deletion_vector, write_deletion_vectors
from tests.support.table_feature_fixtures import listed_features, replay


def add_deletion_vectors(
    table: Path, vectors: Mapping[str, tuple[Iterable[int], str]], *, prefix: str = ""
) -> list[dict[str, Any]]:
    """Commit the next version giving each file of ``vectors`` (add.path -> (rows, "u" or "i")) a vector:
    the ``u`` ones in one DV file (under ``prefix``), the ``i`` ones inline, whatever their size.

    :returns: the descriptors written, in the order of ``vectors``.
    """
    version, adds, metadata, protocol, _ = replay(table)
    reader_features, writer_features = listed_features(protocol)
    config = {**metadata["configuration"], "delta.enableDeletionVectors": "true"}
    metadata = {**metadata, "configuration": config}
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": "DELETE"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": sorted({"deletionVectors", *reader_features}),
                      "writerFeatures": sorted({"deletionVectors", *writer_features})}},
        {"metaData": metadata},
    ]  # fmt: skip
    in_file = {path: rows for path, (rows, storage) in vectors.items() if storage == "u"}
    stored = write_deletion_vectors(str(table), None, in_file, inline_limit=0, prefix=prefix)
    descriptors = []
    for path, (rows, storage) in vectors.items():
        descriptor = stored[path].to_action() if storage == "u" else inline_deletion_vector(rows).to_action()
        add = adds[path]
        actions.append({"remove": {"path": path, "deletionTimestamp": now, "dataChange": True,
                                   "extendedFileMetadata": True, "partitionValues": add["partitionValues"],
                                   "size": add["size"]}})  # fmt: skip
        actions.append({"add": {**add, "dataChange": True, "deletionVector": descriptor}})
        descriptors.append(descriptor)
    body = "".join(json.dumps(a) + "\n" for a in actions)
    (table / "_delta_log" / f"{version + 1:020d}.json").write_text(body)
    return descriptors
