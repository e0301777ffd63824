"""Which Hadoop connector a Spark read of an object-store path needs, and how to say so.

pip's pyspark ships no object-store connector. The job reads Parquet and Delta on object stores without
one (see ``arrow_scan``), but other formats and ``source.query`` go through Spark's own readers, which fail
deep in Hadoop ("No FileSystem for scheme", a ClassNotFoundException). These helpers turn that into the
package to add, matched to the Hadoop version Spark was built with.
"""

from __future__ import annotations

import re

from pyspark.sql import SparkSession

from spark_jobs.delta_merge.session_facts import hadoop_version

__all__ = ["connector_advice", "missing_connector_scheme"]

# URI scheme -> (the connector's Maven coordinates without version, the Hadoop FileSystem class it brings).
_CONNECTORS = {
    "s3": ("org.apache.hadoop:hadoop-aws", "org.apache.hadoop.fs.s3a.S3AFileSystem"),
    "s3a": ("org.apache.hadoop:hadoop-aws", "org.apache.hadoop.fs.s3a.S3AFileSystem"),
    "s3n": ("org.apache.hadoop:hadoop-aws", "org.apache.hadoop.fs.s3a.S3AFileSystem"),
    "abfs": ("org.apache.hadoop:hadoop-azure", "org.apache.hadoop.fs.azurebfs.AzureBlobFileSystem"),
    "abfss": ("org.apache.hadoop:hadoop-azure", "org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem"),
    "wasb": ("org.apache.hadoop:hadoop-azure", "org.apache.hadoop.fs.azure.NativeAzureFileSystem"),
    "wasbs": ("org.apache.hadoop:hadoop-azure", "org.apache.hadoop.fs.azure.NativeAzureFileSystem$Secure"),
    "adl": ("org.apache.hadoop:hadoop-azure-datalake", "org.apache.hadoop.fs.adl.AdlFileSystem"),
    "gs": (
        "com.google.cloud.bigdataoss:gcs-connector",
        "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
    ),
}
# Object-store schemes Hadoop has no file system for under that name: what it calls the same store.
_HADOOP_NAMES = {"az": "abfss", "azure": "abfss", "gcs": "gs"}
_CLASS_SCHEMES = {cls.rsplit(".", 1)[-1]: scheme for scheme, (_, cls) in _CONNECTORS.items()}
_NO_FILESYSTEM = re.compile(r'No FileSystem for scheme "?([A-Za-z0-9+.-]+)"?')
_CLASS_NOT_FOUND = re.compile(r"ClassNotFoundException: Class ([\w.$]+) not found")


def missing_connector_scheme(error: BaseException) -> str | None:
    """The object-store scheme whose Hadoop connector Spark lacked when it raised ``error``, or None.

    Looks through the Java stack trace pyspark keeps on the error (with its "Caused by" chain), where the
    real cause is; the error's own message only says the plan could not be made.
    """
    text = "\n".join(filter(None, (str(error), getattr(error, "_stackTrace", None) or "")))
    for match in _NO_FILESYSTEM.finditer(text):
        if match.group(1).lower() in _CONNECTORS or match.group(1).lower() in _HADOOP_NAMES:
            return match.group(1).lower()
    for match in _CLASS_NOT_FOUND.finditer(text):
        scheme = _CLASS_SCHEMES.get(match.group(1).rsplit(".", 1)[-1])
        if scheme:
            return scheme
    return None


def connector_advice(spark: SparkSession, scheme: str) -> str:
    """What to add so that Spark's readers can read ``scheme://`` paths, e.g. ``Add
    org.apache.hadoop:hadoop-aws:3.4.1 with --packages (spark.jars.packages) ...``."""
    scheme = scheme.lower()
    if scheme in _HADOOP_NAMES:
        hadoop_scheme = _HADOOP_NAMES[scheme]
        artifact = _CONNECTORS[hadoop_scheme][0]
        return (
            f"Spark's readers know no {scheme}:// file system: Hadoop names that store {hadoop_scheme}:// "
            f"and reads it through {artifact} ({connector_advice(spark, hadoop_scheme)})"
        )
    artifact, filesystem = _CONNECTORS.get(scheme, _CONNECTORS["s3a"])
    version = (
        hadoop_version(spark) or "<the Hadoop version of your Spark build>"
        if artifact.startswith("org.apache.hadoop")
        else "<a release for Hadoop 3>"
    )
    advice = (
        f"Spark reads {scheme}:// paths only through a Hadoop connector ({filesystem.rsplit('.', 1)[-1]}), "
        f"which this Spark has not. Add {artifact}:{version} with --packages (spark.jars.packages)"
    )
    if scheme in ("s3", "s3n"):
        advice += f" and set spark.hadoop.fs.{scheme}.impl={filesystem}"
    return advice + "."
