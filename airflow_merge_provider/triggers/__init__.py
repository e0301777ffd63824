"""Triggers of the Delta Lake MERGE provider."""
