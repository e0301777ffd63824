"""Sensors of the Delta Lake MERGE provider."""
