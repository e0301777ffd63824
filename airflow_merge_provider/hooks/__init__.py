"""Hooks of the Delta Lake MERGE provider."""
