"""Delta's PROTOCOL.md: the log and the snapshot, file actions, deletion vectors, column mapping, row
tracking, identity columns, table features, statistics and partition values."""
