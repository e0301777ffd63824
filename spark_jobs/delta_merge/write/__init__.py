"""Writing the merge output: Parquet files with Delta stats and partition values."""
