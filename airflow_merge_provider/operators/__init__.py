"""Operators of the Delta Lake MERGE provider."""
