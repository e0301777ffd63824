"""The path a GCS table's files take with ``google_*`` storage options: pyarrow over obstore's fsspec store
(``arrow_store.gcs_filesystem``), the calls the job's readers and writers make, on a real object store.

No GCS emulator installable here serves object_store's GCS client (fake-gcs-server's wheel answers its XML
uploads with 400; gcp-storage-emulator sends no ETag and ignores ``x-goog-if-generation-match``), so the
same file system is opened here with the ``s3`` protocol on the S3 API server: everything but the store's
wire protocol is what a GCS table runs through. The GCS options themselves are checked without a server in
tests/unit/airflow_merge_provider/hooks/test_gcs_credentials.py."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from spark_jobs.delta_merge.errors import StoragePermissionError
from spark_jobs.delta_merge.source.object_store import _parquet_paths
from spark_jobs.delta_merge.storage.arrow_store import gcs_filesystem
from spark_jobs.delta_merge.storage.storage_errors import storage_failure
from tests.support.s3_server import S3Server

WRONG_SECRET = "wrong-secret-9hTq2Lx7VbN4cWz"


def test_the_jobs_file_calls_through_obstores_fsspec_store(s3_server: S3Server, bucket: str) -> None:
    fs = gcs_filesystem(s3_server.storage_options(), protocol="s3")
    rows = pa.table({"id": list(range(5000)), "name": [f"n{i}" for i in range(5000)]})
    # As the task writer writes a data file: a stream, then a Parquet writer over it.
    with (fs.open_output_stream(f"{bucket}/orders/part-00000.parquet", compression=None) as stream,
          pq.ParquetWriter(stream, rows.schema) as writer):  # fmt: skip
        writer.write_table(rows, row_group_size=1000)
    with fs.open_output_stream(f"{bucket}/orders/_delta_log/00000000000000000000.json") as stream:
        stream.write(b"{}\n")
    # As the scans read one: random access by row group.
    with fs.open_input_file(f"{bucket}/orders/part-00000.parquet") as handle:
        parquet = pq.ParquetFile(handle)
        assert parquet.metadata.num_row_groups == 5
        assert parquet.read_row_group(3).column("id").to_pylist() == list(range(3000, 4000))
    # As a Parquet source is listed (hidden folders left out) and the commit checks files exist.
    assert _parquet_paths(fs, f"{bucket}/orders") == [f"{bucket}/orders/part-00000.parquet"]
    infos = fs.get_file_info([f"{bucket}/orders/part-00000.parquet", f"{bucket}/orders/gone.parquet"])
    assert [info.type for info in infos] == [pafs.FileType.File, pafs.FileType.NotFound]
    assert infos[0].size > 0
    # As a failed task removes its partial file.
    fs.delete_file(f"{bucket}/orders/part-00000.parquet")
    assert fs.get_file_info(f"{bucket}/orders/part-00000.parquet").type == pafs.FileType.NotFound
    with pytest.raises(FileNotFoundError):
        _parquet_paths(fs, f"{bucket}/nothing-here")


def test_a_refused_key_through_it_is_the_stores_refusal_not_a_missing_file(
    s3_server: S3Server, bucket: str
) -> None:
    s3_server.client().put_object(Bucket=bucket, Key="src/data.parquet", Body=b"x")
    options = s3_server.storage_options(AWS_SECRET_ACCESS_KEY=WRONG_SECRET)
    fs = gcs_filesystem(options, protocol="s3")
    # pyarrow's own fsspec handler would say the file is missing; the store's 403 comes through instead,
    # and is judged as a bare 403 from pyarrow's S3 file system is (a HEAD answer has no error code).
    with pytest.raises(Exception, match="403") as raised:
        fs.open_input_file(f"{bucket}/src/data.parquet").read()
    assert not isinstance(raised.value, FileNotFoundError)
    error = storage_failure(f"s3://{bucket}/src", "reading the source", raised.value, options)
    assert isinstance(error, StoragePermissionError), str(error)
    assert "403 Forbidden" in str(error)
    assert "are wrong or may not do this" in str(error)
    assert WRONG_SECRET not in str(error)
