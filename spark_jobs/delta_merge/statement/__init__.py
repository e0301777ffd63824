"""The MERGE statement: its SQL parsed, its clauses, Delta's rules on them, the expression guard.

Plain Python (sqlglot, no pyspark): the provider parses a DAG's statement with it at parse time.
"""
