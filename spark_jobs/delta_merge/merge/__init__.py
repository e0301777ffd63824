"""The MERGE strategies: touched files, rewrite or merge-on-read, insert-only, and what prunes the join."""
