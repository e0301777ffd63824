"""The README's main-job command, run exactly as written in a fresh clone with a clean environment.

The test clones the repository these tests run from (its committed HEAD: that is what CI has, so
uncommitted changes are not part of the check) into a temp dir, and runs the first ``bash`` block of the
README's set-up section there with a fresh HOME and XDG cache, a fresh TMPDIR, and a PATH without any
virtualenv. A step that leans on something those commands do not install (our .venv, a package installed
by hand, a variable of ours) fails here. pip's cache is the machine's own: it holds only what pip
downloaded or built for requirements it was given, so it spares the test the ~430 MB download and
pyspark's build without letting in anything the commands do not ask for. The README's test command gets
the same treatment from CI, which runs it from a clean clone; running the suite inside the suite would
only double that.

Speed is not asserted (the project's rule: no timed thresholds in tests). The wall times of the whole
command, of the install and of the run after it, and the longest silent gap in the output, are printed,
recorded as test properties, and written to ``fresh_clone_report.json`` in pytest's basetemp.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.delta_reader import read_rows, table_version

ROOT = Path(__file__).resolve().parents[2]
SETUP_SECTION = "## Set up, run, test"

# Machine-level settings that every process on such a machine has (where Java is, the machine's pip index,
# certificates and proxies): not ours, so they pass. PIP_NO_CACHE_DIR does not; PIP_CACHE_DIR is set to the
# machine's pip cache (see the module docstring).
MACHINE_VARIABLES = (
    "JAVA_HOME",
    "PIP_FIND_LINKS",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)

# A first install downloads ~430 MB (pyspark, Airflow, ...); the whole command takes a few minutes on
# 2 cores. These bound a hung run, they do not judge speed.
COMMAND_DEADLINE_S = 1400
TAIL_LINES = 80

# The example's table and what one merge makes of it (README: 1000 rows in 4 appends, versions 0-3; the
# merge updates 70 rows, inserts 30 and commits version 4, removing 2 files and adding 1).
TABLE = Path(".example", "tables", "accounts")
ROWS_AFTER_MERGE = 1030
VERSION_AFTER_MERGE = 4
CHANGED_ROWS = 70 + 30


# The stages that come from the merge task while `airflow dags test` runs.
JOB_STAGES = (
    "the job reads the table",
    "the job scans for matches",
    "the job rewrites",
    "the job commits",
    "the task logs the summary line",
)


@dataclass(frozen=True)
class Line:
    """One line of the command's output and when it arrived (seconds since the command started)."""

    at: float
    text: str


@dataclass(frozen=True)
class Run:
    """How the command ended (None: killed at the deadline), its output, and its wall time."""

    returncode: int | None
    lines: list[Line]
    wall_s: float
    log: Path


@dataclass(frozen=True)
class Stage:
    """A step the output must show, and how to recognise its line."""

    name: str
    matches: Callable[[str], bool]


def _readme_main_command(readme: Path) -> str:
    """The first ``bash`` block under the README's set-up heading, as written."""
    text = readme.read_text(encoding="utf-8")
    _, found, section = text.partition(f"\n{SETUP_SECTION}\n")
    assert found, f"{readme} has no {SETUP_SECTION!r} section"
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert blocks, f"{readme}: no bash block under {SETUP_SECTION!r}"
    assert blocks[0].strip(), f"{readme}: the first bash block under {SETUP_SECTION!r} is empty"
    return str(blocks[0])


def _git(*args: str, cwd: Path) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"git {' '.join(args)} failed in {cwd}:\n{result.stderr}"
    return result.stdout.strip()


def _clone_head(dest: Path) -> tuple[str, list[str]]:
    """Clone the committed HEAD of the repository the tests run from; returns its commit and what is not
    committed (left out of the check)."""
    assert shutil.which("git"), "git is not on PATH: the fresh-clone check clones the repository with git"
    toplevel = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    not_a_checkout = (
        f"{ROOT} is not the root of a git checkout ({toplevel.stderr.strip() or toplevel.stdout.strip()}): "
        "the fresh-clone check clones the repository the tests run from, so run the tests from a git clone"
    )
    assert toplevel.returncode == 0, not_a_checkout
    assert Path(toplevel.stdout.strip()).resolve() == ROOT.resolve(), not_a_checkout
    commit = _git("rev-parse", "HEAD", cwd=ROOT)
    uncommitted = _git("status", "--porcelain", "--untracked-files=normal", cwd=ROOT).splitlines()
    _git("clone", "--quiet", "--no-hardlinks", str(ROOT), str(dest), cwd=dest.parent)
    # A detached HEAD (CI's checkout of a pull request) is cloned detached at the same commit; make sure.
    assert _git("rev-parse", "HEAD", cwd=dest) == commit, f"the clone is not at {ROOT}'s HEAD {commit}"
    return commit, uncommitted


def _system_path() -> str:
    """This process's PATH without any virtualenv's bin dir and without anything inside this checkout."""
    root = ROOT.resolve()
    kept: list[str] = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or entry in kept:
            continue
        directory = Path(entry).resolve()
        if (directory.parent / "pyvenv.cfg").exists() or directory.is_relative_to(root):
            continue
        kept.append(entry)
    return os.pathsep.join(kept)


def _machine_pip_cache() -> Path:
    """Where pip caches downloads and built wheels for this machine's user (as ``pip cache dir`` says)."""
    configured = os.environ.get("PIP_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip"


def _clean_env(base: Path) -> dict[str, str]:
    """A machine's environment, built from nothing: none of our virtualenv or settings; pip's cache only."""
    for name in ("home", "cache", "tmp"):
        (base / name).mkdir(parents=True)
    env = {
        "HOME": str(base / "home"),
        "LANG": "C.UTF-8",
        "PATH": _system_path(),
        "PIP_CACHE_DIR": str(_machine_pip_cache()),
        "XDG_CACHE_HOME": str(base / "cache"),
        # Spark's scratch space and the operator's job zip (<tempdir>/airflow-merge-provider/) start empty.
        "TMPDIR": str(base / "tmp"),
    }
    env.update({name: os.environ[name] for name in MACHINE_VARIABLES if name in os.environ})
    return env


def _run_streamed(argv: Sequence[str], *, cwd: Path, env: dict[str, str], log: Path) -> Run:
    """Run the command, timestamping its output as it arrives, into ``log`` and memory.

    Each chunk read from the pipe gets one timestamp, shared by the lines it completes: output a process
    holds back and writes at once arrives with one time, so a later check can tell it from a stream.
    """
    lines: list[Line] = []
    start = time.monotonic()
    deadline = start + COMMAND_DEADLINE_S
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a hung run is killed with Spark and Airflow
    )  # fmt: skip
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pending = b""
    try:
        with log.open("w", encoding="utf-8") as out, selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not selector.select(timeout=min(left, 30)):
                    continue
                chunk = os.read(fd, 65536)
                at = time.monotonic() - start
                if not chunk:
                    break
                *complete, pending = (pending + chunk).split(b"\n")
                for raw in complete:
                    text = raw.decode("utf-8", errors="replace").rstrip("\r")
                    lines.append(Line(at, text))
                    out.write(f"{at:8.2f} {text}\n")
                out.flush()
            if pending:
                lines.append(Line(time.monotonic() - start, pending.decode("utf-8", errors="replace")))
                out.write(f"{lines[-1].at:8.2f} {lines[-1].text}\n")
            try:
                returncode: int | None = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                returncode = None
            wall = time.monotonic() - start
            out.write(f"{wall:8.2f} [exit {returncode}]\n")
    finally:
        # A deadline, or pytest-timeout, must not leave a JVM or an Airflow process behind.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
    return Run(returncode=returncode, lines=lines, wall_s=wall, log=log)


def _tail(run: Run) -> str:
    return "\n".join(f"{line.at:8.2f} {line.text}" for line in run.lines[-TAIL_LINES:])


def _stages(clone: Path) -> list[Stage]:
    """What the output must show, in this order: bootstrap, install, the demo's Airflow run, the check."""
    venv = clone / ".venv"
    table = clone / TABLE

    def starts(prefix: str) -> Callable[[str], bool]:
        return lambda text: text.startswith(prefix)

    def has(part: str) -> Callable[[str], bool]:
        return lambda text: part in text

    return [
        Stage("bootstrap creates the clone's .venv", starts(f"bootstrap: creating {venv} with ")),
        Stage("bootstrap starts the install", starts("bootstrap: installing the project into .venv")),
        Stage("pip shows what it collects", starts("Collecting ")),
        Stage("pip installs", starts("Successfully installed ")),
        Stage("bootstrap finishes the install", starts("bootstrap: installed the project into .venv")),
        Stage("the demo writes its table", starts(f"target table : {table} ")),
        Stage("Airflow's database is set up", starts("setting up Airflow's metadata database")),
        Stage(
            "airflow dags test runs from the clone's .venv",
            starts(f"$ {venv / 'bin' / 'airflow'} dags test merge_upsert_daily 2024-06-01"),
        ),
        Stage("the job reads the table", has(f"[delta-merge] MERGE into {table} at version 3")),
        Stage("the job scans for matches", has("[delta-merge] MERGE operation - scanning files for matches")),
        Stage("the job rewrites", has("[delta-merge] MERGE operation - Rewriting 2 files")),
        Stage("the job commits", has(f"[delta-merge] MERGE committed version {VERSION_AFTER_MERGE}")),
        Stage("the task logs the summary line", has(f"MERGE into {table} v{VERSION_AFTER_MERGE}: ")),
        Stage("run-example checks the metrics", starts("run-example: ok: 70 accounts updated, 30 inserted")),
    ]


def _find_in_order(lines: list[Line], stages: list[Stage]) -> tuple[dict[str, Line], list[str]]:
    """The first line of each stage after the previous stage's line, and the stages not found that way."""
    found: dict[str, Line] = {}
    missing: list[str] = []
    position = 0
    for stage in stages:
        index = next((i for i in range(position, len(lines)) if stage.matches(lines[i].text)), None)
        if index is None:
            missing.append(stage.name)
            continue
        found[stage.name] = lines[index]
        position = index + 1
    return found, missing


def _longest_gap(run: Run) -> dict[str, Any]:
    """The longest stretch without output, from the start to the exit, and the lines around it."""
    times = [0.0, *(line.at for line in run.lines), run.wall_s]
    texts = ["<start>", *(line.text for line in run.lines), "<exit>"]
    i = max(range(1, len(times)), key=lambda k: times[k] - times[k - 1])
    return {
        "seconds": round(times[i] - times[i - 1], 2),
        "from_s": round(times[i - 1], 2),
        "after": texts[i - 1][:200],
        "before": texts[i][:200],
    }


def _commit_actions(table: Path, version: int) -> list[dict[str, Any]]:
    commit = table / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in commit.read_text(encoding="utf-8").splitlines() if line.strip()]


def _python_in(clone: Path, env: dict[str, str], code: str) -> str:
    result = subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-c", code],
        cwd=clone, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _report_timings(
    run: Run,
    at: dict[str, float],
    *,
    command: str,
    commit: str,
    uncommitted: list[str],
    path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Print the wall times and the longest silent gap, record them, and write them to ``path`` as JSON."""
    installing = at.get("bootstrap starts the install")
    installed = at.get("bootstrap finishes the install")
    report: dict[str, Any] = {
        "command": command,
        "commit": commit,
        "uncommitted_changes_not_checked": uncommitted,
        "returncode": run.returncode,
        "wall_s": round(run.wall_s, 2),
        "venv_s": None if installing is None else round(installing, 2),
        "install_s": None if installing is None or installed is None else round(installed - installing, 2),
        "run_after_install_s": None if installed is None else round(run.wall_s - installed, 2),
        "longest_silent_gap": _longest_gap(run),
        "stage_at_s": {name: round(t, 2) for name, t in at.items()},
        "output_lines": len(run.lines),
        "log": str(run.log),
    }
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for name in ("wall_s", "venv_s", "install_s", "run_after_install_s", "longest_silent_gap"):
        record_property(f"fresh_clone_{name}", report[name])
    gap = report["longest_silent_gap"]

    def seconds(name: str) -> str:
        return "n/a" if report[name] is None else f"{report[name]}s"

    print(
        f"\nfresh clone of {commit[:12]}: `{command}` exited {run.returncode} in {run.wall_s:.1f}s "
        f"(venv {seconds('venv_s')}, install {seconds('install_s')}, run after install "
        f"{seconds('run_after_install_s')}); longest silent gap {gap['seconds']}s from {gap['from_s']}s, "
        f"after {gap['after']!r}\nreport: {path}\nlog: {run.log}"
    )
    if uncommitted:
        print(f"note: {len(uncommitted)} uncommitted change(s) in {ROOT} are not part of this check")


@pytest.mark.timeout(1500)
def test_readme_main_command_runs_in_a_fresh_clone(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, record_property: Callable[[str, object], None]
) -> None:
    commit, uncommitted = _clone_head(tmp_path / "clone")
    # The scripts name paths as `pwd -P` and Path.resolve() see them.
    clone = (tmp_path / "clone").resolve()
    command = _readme_main_command(clone / "README.md")
    env = _clean_env(tmp_path / "machine")

    # bash -e: a block of several commands fails at its first failing one, as a reader would stop there.
    run = _run_streamed(["bash", "-e", "-c", command], cwd=clone, env=env, log=tmp_path / "command.log")

    found, missing = _find_in_order(run.lines, _stages(clone))
    at = {name: line.at for name, line in found.items()}
    _report_timings(
        run, at, command=command.strip(), commit=commit, uncommitted=uncommitted,
        path=tmp_path_factory.getbasetemp() / "fresh_clone_report.json", record_property=record_property,
    )  # fmt: skip

    returncode = run.returncode
    ended = f"exited {returncode}"
    if returncode is None:
        ended = f"was killed at the {COMMAND_DEADLINE_S}s deadline"
    assert returncode == 0, (
        f"`{command.strip()}` in a fresh clone {ended} after {run.wall_s:.0f}s; full log {run.log}, "
        f"last lines:\n{_tail(run)}"
    )
    assert not missing, (
        f"the output lacks, in order: {missing} (found: {list(found)}); full log {run.log}, last lines:\n"
        f"{_tail(run)}"
    )
    # Progress while it runs, not a dump at the end: the job's stage lines and the summary reach the output
    # in earlier reads of the pipe than the command's last line.
    last_at = run.lines[-1].at
    late = [name for name in JOB_STAGES if at[name] >= last_at]
    assert not late, f"{late} arrived in the same read as the command's last line; see {run.log}"
    assert at["the job reads the table"] < at["the task logs the summary line"], (
        f"the job's first stage line arrived in the same read as the summary line; see {run.log}"
    )

    # The bootstrap made and used the clone's own virtualenv, not ours.
    venv = clone / ".venv"
    assert (venv / "pyvenv.cfg").is_file()
    stamp = (venv / ".airflow-merge-provider-install").read_text(encoding="utf-8").split()
    # The example needs the project alone: no extra installed (scripts/test adds the dev extra).
    assert stamp[1:] == [str(clone), "[]"], f"install stamp {stamp} does not name the clone"
    installed_from = _python_in(
        clone, env, "import airflow_merge_provider, spark_jobs; print(airflow_merge_provider.__file__); "
        "print(spark_jobs.__file__)",
    )  # fmt: skip
    for path in installed_from.splitlines():
        assert Path(path).resolve().is_relative_to(clone), f"{path} is not the clone's code"

    # The table, read back with deltalake: 1000 rows + 30 inserted, the 70 updated and 30 inserted rows
    # carrying the landing file's balances, one merge commit on top of the 4 appends.
    table = clone / TABLE
    assert table_version(table) == VERSION_AFTER_MERGE
    rows = read_rows(table, columns=["id", "balance"])
    assert sorted(row[0] for row in rows) == list(range(1, ROWS_AFTER_MERGE + 1))
    assert sum(1 for row_id, balance in rows if balance == round(row_id * 10.5 + 100.0, 2)) == CHANGED_ROWS
    actions = _commit_actions(table, VERSION_AFTER_MERGE)
    (info,) = [action["commitInfo"] for action in actions if "commitInfo" in action]
    assert info["mergeOperation"] == "MERGE"
    assert info["readVersion"] == VERSION_AFTER_MERGE - 1
    assert sum("remove" in action for action in actions) == 2
    assert sum("add" in action for action in actions) == 1

    # Passed: drop the ~2 GB of virtualenv and caches; the log and the report stay in basetemp.
    shutil.rmtree(venv)
    shutil.rmtree(tmp_path / "machine")
