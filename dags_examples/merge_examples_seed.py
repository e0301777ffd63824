"""Seeds the data ``merge_upsert_daily`` reads: the accounts table and landing files for its first days.

Trigger it once on a fresh ``docker compose up`` (or any Airflow where the examples' data dir is empty). It
writes ``<data dir>/accounts``, a Delta table of 1000 accounts in 4 files, and for each of ``SEED_DAYS``
(the upsert's first catchup days) a Parquet file of 20 updated and 10 new accounts under
``<landing dir>/accounts/<day>/``. It never overwrites: a table or a day that already exists is left as it
is, so running it again after merges changes nothing.

Paths as in ``merge_upsert_daily`` (local paths only: it writes with pyarrow and renames into place).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pendulum
from airflow.sdk import DAG, task

DATA_DIR = os.environ.get("MERGE_EXAMPLES_DATA_DIR", "/data/tables")
# Read when the task runs: the Variable if set, else the DAG's default_landing_dir macro.
LANDING_DIR = "{{ var.value.get('merge_examples_landing_dir', default_landing_dir) }}"
ACCOUNTS = f"{DATA_DIR}/accounts"
# merge_upsert_daily's start date and the next two days: its first catchup runs find their files.
SEED_DAYS = ("2024-01-01", "2024-01-02", "2024-01-03")
ACCOUNT_COUNT = 1000
TABLE_FILES = 4
# Per day: every 25th account of the first 500 is updated (so 2 of the 4 files are rewritten), and 10 are new.
UPDATES_PER_DAY = 20
INSERTS_PER_DAY = 10


def _accounts(ids: list[int], *, balance_offset: float, updated_at: pendulum.DateTime) -> Any:
    import pyarrow as pa

    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("name", pa.string()),
            pa.field("balance", pa.float64()),
            pa.field("updated_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    return pa.table(
        {
            "id": ids,
            "name": [f"account-{i:05d}" for i in ids],
            "balance": [round(i * 10.5 + balance_offset, 2) for i in ids],
            "updated_at": [updated_at.add(seconds=i) for i in ids],
        },
        schema=schema,
    )


def _staging(final: str) -> str:
    """A sibling of ``final`` to write into: renamed into place when complete, so a seed that dies half way
    leaves no partial table or day behind (a hidden name, so Spark never reads it as a source file)."""
    head, tail = os.path.split(final)
    return os.path.join(head, f".{tail}.seeding-{uuid.uuid4().hex}")


with DAG(
    dag_id="merge_examples_seed",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["delta-merge", "example"],
    user_defined_macros={"default_landing_dir": f"{DATA_DIR}/landing"},
):

    @task
    def seed_accounts_table(table: str) -> dict[str, Any]:
        """Create the accounts table unless it exists; return its path, version and whether it was created."""
        from deltalake import DeltaTable, write_deltalake

        if DeltaTable.is_deltatable(table):
            version = DeltaTable(table).version()
            print(f"{table} exists (v{version}): left as it is")
            return {"table": table, "created": False, "version": version}
        staging = _staging(table)
        created = pendulum.datetime(2024, 1, 1, tz="UTC")
        per_file = ACCOUNT_COUNT // TABLE_FILES
        # One append per file: the upsert then rewrites only the files its updates touch.
        for start in range(1, ACCOUNT_COUNT + 1, per_file):
            ids = list(range(start, start + per_file))
            write_deltalake(staging, _accounts(ids, balance_offset=0.0, updated_at=created), mode="append")
        os.rename(staging, table)
        version = DeltaTable(table).version()
        print(f"{table} created (v{version}): {ACCOUNT_COUNT} accounts in {TABLE_FILES} files")
        return {"table": table, "created": True, "version": version}

    @task
    def seed_landing_files(landing_dir: str) -> dict[str, int]:
        """Write each seed day's updates and inserts unless the day exists; return rows written per day."""
        import pyarrow.parquet as pq

        written: dict[str, int] = {}
        for index, day in enumerate(SEED_DAYS):
            final = os.path.join(landing_dir, "accounts", day)
            if os.path.exists(final):
                print(f"{final} exists: left as it is")
                continue
            updated = list(range(index + 1, 501, 500 // UPDATES_PER_DAY))
            first_new = ACCOUNT_COUNT + index * INSERTS_PER_DAY + 1
            inserted = list(range(first_new, first_new + INSERTS_PER_DAY))
            changed = pendulum.from_format(day, "YYYY-MM-DD", tz="UTC")
            rows = _accounts(updated + inserted, balance_offset=100.0 * (index + 1), updated_at=changed)
            staging = _staging(final)
            os.makedirs(staging)
            pq.write_table(rows, os.path.join(staging, "part-00000.parquet"))
            os.rename(staging, final)
            written[day] = rows.num_rows
            print(f"{final}: {len(updated)} updates, {len(inserted)} new accounts")
        return written

    seed_accounts_table(ACCOUNTS)
    seed_landing_files(LANDING_DIR)
