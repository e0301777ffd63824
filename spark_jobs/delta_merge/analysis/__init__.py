"""The statement resolved against the target and the source: the merge plan, schema evolution, store
assignment, column defaults and constraints."""
