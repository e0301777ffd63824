"""Commit a merge under Delta's conflict rules: check what landed since the read, then compare-and-swap."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.delta_merge.commit.actions import CommitPlan, attempt_commit
from spark_jobs.delta_merge.commit.conflicts import AlreadyApplied, ReadSet, added_file, check_winning_commit
from spark_jobs.delta_merge.errors import ConcurrentModificationError, MergeExecutionError
from spark_jobs.delta_merge.protocol.delta_log import latest_version, read_commit_actions
from spark_jobs.delta_merge.protocol.files import LiveFile

__all__ = ["CommitOutcome", "commit_serializably"]

log = logging.getLogger("delta_merge")

# Rounds of "probe for new commits, check them" before a swap is tried anyway.
_MAX_CHECK_ROUNDS = 20


@dataclass(frozen=True)
class CommitOutcome:
    """Where the merge landed; ``already_applied`` when a concurrent attempt with the same app id won."""

    version: int
    already_applied: bool = False
    commit_info: Mapping[str, Any] = field(default_factory=dict)


def commit_serializably(
    plan: CommitPlan,
    read: ReadSet,
    *,
    matches_read: Callable[[Sequence[LiveFile]], Sequence[LiveFile]],
    storage_options: Mapping[str, str] | None = None,
    max_attempts: int = 10,
    sleep: Callable[[float], None] = time.sleep,
) -> CommitOutcome:
    """Commit ``plan`` on the latest version once no commit since the read conflicts with it.

    Every commit after the read version is checked once against Delta's rules
    (:func:`check_winning_commit`); then the commit is a compare-and-swap on the latest version. When
    another writer wins that race, only its new commits are checked and the swap is tried again, with
    jittered backoff, up to ``max_attempts`` times.

    :raises ConcurrentModificationError: a conflicting commit landed (names its version and the rule),
        or the swap kept losing.
    """
    checked = plan.read_version
    started = time.monotonic()
    for attempt in range(max_attempts):
        # Check until a probe finds nothing new, so that the swap follows the last check closely: a busy
        # writer that commits while a check runs would otherwise win every swap.
        for _ in range(_MAX_CHECK_ROUNDS):
            latest = latest_version(plan.table_uri, known=checked, storage_options=storage_options)
            if latest == checked:
                break
            applied = _check_commits(plan, read, checked + 1, latest, matches_read, storage_options)
            if applied is not None:
                log.info("app transaction already applied by version %d", applied.version)
                return CommitOutcome(applied.version, already_applied=True, commit_info=applied.commit_info)
            log.info("versions %d..%d committed meanwhile; none conflicts", checked + 1, latest)
            checked = latest
        try:
            return CommitOutcome(attempt_commit(plan, base_version=checked, storage_options=storage_options))
        except ConcurrentModificationError:
            # Lost the race for version checked + 1: check the winner, then try on top of it.
            sleep(random.uniform(0.5, 1.5) * min(2.0, 0.05 * 2**attempt))
    raise ConcurrentModificationError(
        f"This commit has failed as it has been tried {max_attempts} times but did not succeed. This can be "
        "caused by the Delta table being committed continuously by many concurrent commits.\n"
        f"Commit started at version: {plan.read_version}\n"
        f"Commit failed at version: {checked + 1}\n"
        f"Number of actions attempted to commit: {len(plan.removes) + len(plan.adds)}\n"
        f"Total time spent attempting this commit: {int((time.monotonic() - started) * 1000)} ms\n"
        f"Other writers committed to {plan.table_uri} first every time. Nothing was committed; re-run the "
        "merge.",
        error_class="DELTA_MAX_COMMIT_RETRIES_EXCEEDED",
    )


def _check_commits(
    plan: CommitPlan, read: ReadSet, first: int, last: int,
    matches_read: Callable[[Sequence[LiveFile]], Sequence[LiveFile]],
    storage_options: Mapping[str, str] | None,
) -> AlreadyApplied | None:
    """Check versions ``first..last`` in order; the first conflict raises, the first own app txn returns."""
    commits: list[tuple[int, list[dict[str, Any]]]] = []
    for version in range(first, last + 1):
        actions = read_commit_actions(plan.table_uri, version, storage_options=storage_options)
        if actions is None:
            raise MergeExecutionError(
                f"Commit file of version {version} of {plan.table_uri} is missing while checking for "
                "conflicts (log cleaned up during the merge?). Nothing was committed; re-run the merge."
            )
        commits.append((version, actions))
    check = matches_read
    if len(commits) > 1 and not read.whole_table:
        # Evaluating the read predicates costs a Spark job: ask once for all files these commits add. When
        # none falls into what the merge read, no single commit's files can either.
        added = [added_file(a["add"]) for _, actions in commits for a in actions if "add" in a]
        if not added or not matches_read(added):
            check = _matches_nothing
    for version, actions in commits:
        applied = check_winning_commit(version, actions, read, matches_read=check)
        if applied is not None:
            return applied
    return None


def _matches_nothing(files: Sequence[LiveFile]) -> Sequence[LiveFile]:
    return ()
