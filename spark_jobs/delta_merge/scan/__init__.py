"""Reading the target's live files: Spark's and pyarrow's scans, and data skipping by partition values and
file statistics."""
