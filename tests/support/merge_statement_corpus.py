"""MERGE statements Spark SQL refuses: other dialects' forms, missing keywords, trailing text, smuggled text.

Each entry is (statement, a piece of the operator-side message). The operator must refuse every one before
launch, quoting the text Spark does not take; Spark's own parser must refuse every one as well.
"""

from __future__ import annotations

HEAD = "MERGE INTO target t USING source s ON t.id = s.id "

INVALID_STATEMENTS: list[tuple[str, str]] = [
    # Postgres / SQL Server / Snowflake forms that a lenient parser silently shortens.
    (HEAD + "WHEN MATCHED THEN UPDATE SET balance = -1 WHERE t.id < 0", "'WHERE t.id < 0'"),
    (HEAD + "WHEN MATCHED THEN DELETE WHERE s.deleted", "'WHERE s.deleted'"),
    (HEAD + "WHEN MATCHED AND s.op = 'D' THEN DELETE WHERE t.v > 0", "'WHERE t.v > 0'"),
    (HEAD + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v) WHERE s.v > 0", "'WHERE s.v > 0'"),
    (HEAD + "WHEN MATCHED THEN DELETE RETURNING *", "'RETURNING *'"),
    (HEAD + "WHEN MATCHED THEN UPDATE SET v = s.v RETURNING t.id", "'RETURNING t.id'"),
    (HEAD + "WHEN MATCHED THEN DELETE OUTPUT $action, inserted.*", "'OUTPUT $action, inserted.*'"),
    (HEAD + "WHEN MATCHED THEN UPDATE SET v = s.v OUTPUT deleted.v", "'OUTPUT deleted.v'"),
    (HEAD + "WHEN NOT MATCHED THEN DO NOTHING", "'DO NOTHING'"),
    (HEAD + "WHEN MATCHED THEN DO NOTHING", "'DO NOTHING'"),
    (HEAD + "WHEN MATCHED THEN UPDATE v = s.v", "'v = s.v'"),
    (HEAD + "WHEN MATCHED THEN UPDATE", "the end of the statement"),
    (HEAD + "WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v)", "'VALUES (s.id, s.v)'"),
    (HEAD + "WHEN NOT MATCHED THEN INSERT ROW", "'ROW'"),
    (
        HEAD + "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v), (s.id + 1, s.v)",
        "', (s.id + 1, s.v)'",
    ),
    (HEAD + "WHEN NOT MATCHED THEN INSERT (id) SELECT s.id", "'SELECT s.id'"),
    (HEAD + "WHEN NOT MATCHED BY TARGET THEN INSERT DEFAULT VALUES", "'DEFAULT VALUES'"),
    (HEAD + "WHEN MATCHED THEN UPDATE SET v = s.v, WHEN NOT MATCHED THEN INSERT *", "'WHEN NOT MATCHED"),
    (HEAD + "WHEN MATCHED THEN UPDATE SET (v, w) = (s.v, s.w)", "'(v, w) = (s.v, s.w)'"),
    (HEAD + "WHEN MATCHED THEN UPDATE SET v := s.v", "':= s.v'"),
    # Missing keywords.
    ("MERGE target t USING source s ON t.id = s.id WHEN MATCHED THEN DELETE", "'target t USING source s"),
    ("MERGE INTO target t USING source s WHEN MATCHED THEN DELETE", "'WHEN MATCHED THEN DELETE'"),
    ("MERGE INTO target t source s ON t.id = s.id WHEN MATCHED THEN DELETE", "'source s ON"),
    (HEAD + "WHEN MATCHED UPDATE SET v = s.v", "'UPDATE SET v = s.v'"),
    (HEAD + "WHEN MATCHED DELETE", "'DELETE'"),
    (HEAD + "WHEN NOT MATCHED INSERT *", "'INSERT *'"),
    (HEAD + "MATCHED THEN DELETE", "'MATCHED THEN DELETE'"),
    (HEAD + "WHEN NOT MATCHED BY THEN INSERT *", "'THEN INSERT *'"),
    (HEAD + "WHEN MATCHED AND THEN DELETE", "'THEN DELETE'"),
    ("MERGE INTO target t USING source s ON WHEN MATCHED THEN DELETE", "'WHEN MATCHED THEN DELETE'"),
    # Dialect-specific clauses in the statement's head.
    ("MERGE INTO target AS t USING source AS s ON (t.id = s.id) WHEN MATCHED THEN DELETE; ;x", "';'"),
    ("MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN DELETE LIMIT 10", "'LIMIT 10'"),
    ("MERGE TOP (10) INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN DELETE", "'TOP (10) INTO"),
    ("MERGE INTO target WITH (HOLDLOCK) t USING source s ON t.id = s.id WHEN MATCHED THEN DELETE", "'WITH"),
    (
        "MERGE INTO target t USING source s VERSION AS OF 3 ON t.id = s.id WHEN MATCHED THEN DELETE",
        "'VERSION AS OF 3",
    ),
    ("MERGE INTO target t (id, v) USING source s ON t.id = s.id WHEN MATCHED THEN DELETE", "Column aliases"),
    ("MERGE INTO target t USING source s(id, v) ON t.id = s.id WHEN MATCHED THEN DELETE", "Column aliases"),
    (
        "MERGE INTO target t USING LATERAL (SELECT 1 AS id) s ON t.id = s.id WHEN MATCHED THEN DELETE",
        "'(SELECT",
    ),
    # Spark's clause order: MATCHED, then NOT MATCHED, then NOT MATCHED BY SOURCE.
    (HEAD + "WHEN NOT MATCHED THEN INSERT * WHEN MATCHED THEN DELETE", "Spark's order"),
    (HEAD + "WHEN NOT MATCHED BY SOURCE THEN DELETE WHEN NOT MATCHED THEN INSERT *", "Spark's order"),
    # Actions a clause kind does not have.
    (HEAD + "WHEN MATCHED THEN INSERT *", "'INSERT *'"),
    (HEAD + "WHEN NOT MATCHED THEN UPDATE SET v = s.v", "'UPDATE SET v = s.v'"),
    (HEAD + "WHEN NOT MATCHED BY SOURCE THEN UPDATE SET *", "'*'"),
    # Two statements, trailing junk, text hidden in comments, unbalanced parentheses.
    (HEAD + "WHEN MATCHED THEN DELETE; SELECT 1", "';'"),
    (HEAD + "WHEN MATCHED THEN DELETE; DROP TABLE target", "';'"),
    (HEAD + "WHEN MATCHED THEN DELETE GO", "'GO'"),
    (HEAD + "WHEN MATCHED THEN DELETE )", "')'"),
    (HEAD + "WHEN MATCHED THEN UPDATE SET v = (s.v", "closing ')'"),
    (HEAD + "WHEN MATCHED THEN DELETE -- WHEN NOT MATCHED THEN INSERT *", "comment"),
    (HEAD + "WHEN MATCHED /* AND s.op = 'D' */ THEN DELETE", "comment"),
    (
        "MERGE INTO target t USING source s ON t.id = s.id -- AND t.tenant = s.tenant\n"
        "WHEN MATCHED THEN DELETE",
        "comment",
    ),
    # Not a MERGE at all.
    ("UPDATE target SET v = 1 WHERE id = 2", "'UPDATE target SET v = 1"),
    ("INSERT INTO target SELECT * FROM source", "'INSERT INTO target"),
    ("UPSERT INTO target SELECT * FROM source", "'UPSERT INTO target"),
]
