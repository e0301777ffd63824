#!/usr/bin/env bash
# Prerequisites and virtualenv for scripts/test and scripts/run-example.
#
# Sourced by those scripts: checks Python 3.10+ and Java 17+, creates .venv in the repository root when it is
# missing, installs the project into it with `pip install -e .` (`.[dev]` for scripts/test, which sets
# AMP_EXTRAS=dev; again only when pyproject.toml changed), then puts .venv/bin first on PATH and points
# PYSPARK_PYTHON at the venv's python.
# Run directly: `scripts/bootstrap.sh` does the same; `scripts/bootstrap.sh --check` only checks.
# PYTHON=/path/to/python3.x picks the interpreter the virtualenv is created from.
#
# The checks use bash builtins only, so that they give their own message on a machine that lacks the tools.

amp_die() {
  printf 'bootstrap: %s\n' "$*" >&2
  exit 1
}

# Prints "MAJOR.MINOR HAS_ENSUREPIP" for the interpreter $1, or nothing when it does not run.
amp_python_probe() {
  "$1" -c 'import importlib.util as u, sys; print("%d.%d %d" % (sys.version_info[0], sys.version_info[1], u.find_spec("ensurepip") is not None))' 2>/dev/null
}

amp_version_at_least() { # amp_version_at_least MAJOR.MINOR WANT_MAJOR WANT_MINOR
  local major=${1%%.*} minor=${1#*.}
  [[ $major =~ ^[0-9]+$ && $minor =~ ^[0-9]+$ ]] || return 1
  ((major > $2 || (major == $2 && minor >= $3)))
}

# Sets AMP_PYTHON to a Python 3.10+ that can create a virtualenv.
amp_find_python() {
  local candidates=() found=() cand path probe version
  if [[ -n ${PYTHON:-} ]]; then
    candidates=("$PYTHON")
  else
    candidates=(python3.11 python3.12 python3.13 python3.10 python3.14 python3 python)
  fi
  for cand in "${candidates[@]}"; do
    path=$(type -P "$cand") || continue
    probe=$(amp_python_probe "$path") || probe=""
    if [[ -z $probe ]]; then
      found+=("$cand at $path (does not run)")
      continue
    fi
    version=${probe% *}
    if ! amp_version_at_least "$version" 3 10; then
      found+=("$cand $version at $path")
      continue
    fi
    if [[ ${probe#* } != 1 ]]; then
      found+=("$cand $version at $path (no venv/ensurepip module: apt-get install python$version-venv)")
      continue
    fi
    AMP_PYTHON=$path
    return 0
  done
  local what="no python3 on PATH"
  [[ -n ${PYTHON:-} ]] && what="PYTHON=$PYTHON is not an executable"
  if ((${#found[@]})); then
    what="found ${found[0]}"
    local f
    for f in "${found[@]:1}"; do what+="; $f"; done
  fi
  amp_die "Python 3.10 or newer is required; $what." \
    "Install Python 3.10+ with its venv module (e.g. apt-get install python3 python3-venv, or pyenv install 3.11)" \
    "and put it on PATH, or set PYTHON=/path/to/python3.x."
}

# Prints the Java feature version (8, 11, 17, ...) of the java binary $1, or nothing.
amp_java_major() {
  local out
  out=$("$1" -version 2>&1) || true
  if [[ $out =~ version\ \"([0-9]+)(\.([0-9]+))? ]]; then
    if [[ ${BASH_REMATCH[1]} == 1 ]]; then
      printf '%s\n' "${BASH_REMATCH[3]}" # 1.8.0_292 is Java 8
    else
      printf '%s\n' "${BASH_REMATCH[1]}"
    fi
  fi
}

# Sets AMP_JAVA to the java Spark will run (JAVA_HOME's, else the one on PATH) after checking it is 17+.
amp_check_java() {
  local java major where hint="" cand cand_major
  if [[ -n ${JAVA_HOME:-} ]]; then
    java=$JAVA_HOME/bin/java
    [[ -x $java ]] || amp_die "Java 17 or newer is required for Spark; JAVA_HOME is set to $JAVA_HOME" \
      "but $java does not exist. Point JAVA_HOME at a JDK or JRE 17+ or unset it."
    where="$java (from JAVA_HOME)"
  else
    java=$(type -P java) || java=""
    where=$java
  fi
  if [[ -n $java ]]; then
    major=$(amp_java_major "$java")
    if [[ $major =~ ^[0-9]+$ ]] && ((major >= 17)); then
      AMP_JAVA=$java
      return 0
    fi
  fi
  for cand in /usr/lib/jvm/*/bin/java; do
    [[ -x $cand ]] || continue
    cand_major=$(amp_java_major "$cand")
    if [[ $cand_major =~ ^[0-9]+$ ]] && ((cand_major >= 17)); then
      hint=" Java $cand_major is installed at ${cand%/bin/java}: export JAVA_HOME=${cand%/bin/java}"
      break
    fi
  done
  if [[ -z $java ]]; then
    amp_die "Java 17 or newer is required for Spark; no java found on PATH and JAVA_HOME is not set." \
      "Install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless) and put it on PATH or set JAVA_HOME.$hint"
  fi
  amp_die "Java 17 or newer is required for Spark; found ${major:-an unknown version} at $where." \
    "Install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless) and put it on PATH or set JAVA_HOME.$hint"
}

# Runs "$@" with its output (stdout and stderr) on stderr, and returns its exit status. Whenever the output
# has been quiet for AMP_WATCH_SECONDS (15), prints "bootstrap: still <$1> (<n>s so far)": venv's
# --upgrade-deps prints nothing, and pip prints nothing while it builds pyspark's sdist (~30 s) or unpacks
# and compiles ~200 packages after "Installing collected packages" (over a minute on 2 cores).
amp_watch() {
  local what=$1
  shift
  "$@" 2>&1 | {
    local line partial="" started=$SECONDS
    while :; do
      if IFS= read -r -t "${AMP_WATCH_SECONDS:-15}" line; then
        printf '%s%s\n' "$partial" "$line" >&2
        partial=""
      elif (($? > 128)); then # timed out; read keeps any partial line in $line
        partial+=$line
        printf 'bootstrap: still %s (%ds so far)\n' "$what" $((SECONDS - started)) >&2
      else
        break
      fi
    done
    [[ -z $partial$line ]] || printf '%s%s\n' "$partial" "$line" >&2 # a last line without a newline
  }
  return "${PIPESTATUS[0]}"
}

# Sets AMP_VENV_PYTHON, creating .venv from a Python 3.10+ when there is no usable one.
amp_ensure_venv() {
  local venv=$AMP_REPO_ROOT/.venv probe
  if [[ -x $venv/bin/python ]]; then
    probe=$(amp_python_probe "$venv/bin/python") || probe=""
    if [[ -n $probe ]] && amp_version_at_least "${probe% *}" 3 10; then
      AMP_VENV_PYTHON=$venv/bin/python
      return 0
    fi
    [[ -f $venv/pyvenv.cfg ]] || amp_die "$venv exists but is not a usable virtualenv; move it away and re-run."
    printf 'bootstrap: %s is broken or older than Python 3.10; recreating it\n' "$venv" >&2
    rm -rf -- "$venv"
  fi
  amp_find_python
  printf 'bootstrap: creating %s with %s\n' "$venv" "$AMP_PYTHON" >&2
  amp_watch "creating $venv" "$AMP_PYTHON" -m venv --upgrade-deps "$venv" ||
    amp_die "could not create $venv with $AMP_PYTHON"
  AMP_VENV_PYTHON=$venv/bin/python
}

# Installs the project into the venv unless it was installed from this checkout's pyproject.toml already.
# AMP_EXTRAS names the extras to install with it: scripts/test sets `dev` (linters, docs, test servers);
# the example needs none. A venv installed with the dev extras serves both.
amp_install() {
  local stamp_file=$AMP_REPO_ROOT/.venv/.airflow-merge-provider-install stamp installed
  local extras=${AMP_EXTRAS:-} target=.
  [[ -n $extras ]] && target=".[$extras]"
  stamp=$("$AMP_VENV_PYTHON" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest(), sys.argv[2])' \
    "$AMP_REPO_ROOT/pyproject.toml" "$AMP_REPO_ROOT") || amp_die "could not read $AMP_REPO_ROOT/pyproject.toml"
  if [[ -f $stamp_file ]]; then
    installed=$(<"$stamp_file")
    if [[ $installed == "$stamp [$extras]" || $installed == "$stamp [dev]" ]]; then
      return 0
    fi
  fi
  printf "bootstrap: installing the project into .venv (pip install -e '%s'; the first time takes a few minutes)\n" "$target" >&2
  # Not --quiet: on a fresh machine this downloads a few hundred MB, and pip's Collecting/Downloading/Installing
  # lines are the only sign of progress. --progress-bar off: pip's bars draw nothing useful into a pipe or CI
  # log. The -W filter drops setuptools' informational "Editable installation." banner (about shadowing
  # folders in the working directory), which pip re-raises as a warning on every editable install; errors
  # still show. Not --no-compile: where PYTHONDONTWRITEBYTECODE is set (CI images often set it) Python never
  # writes bytecode, so every process would compile Airflow's and pyspark's modules again (17 s against 3 s
  # to import them, measured); pip compiles them once here.
  (cd "$AMP_REPO_ROOT" && amp_watch "installing the project into .venv" \
    "$AMP_VENV_PYTHON" -W 'ignore:Editable installation:UserWarning' -m pip install \
    --disable-pip-version-check --progress-bar off -e "$target") ||
    amp_die "pip install -e '$target' failed (see pip's output above)"
  printf 'bootstrap: installed the project into .venv\n' >&2
  printf '%s [%s]\n' "$stamp" "$extras" >"$stamp_file"
}

amp_bootstrap() {
  local here=${BASH_SOURCE[0]%/*}
  [[ $here == "${BASH_SOURCE[0]}" ]] && here=.
  AMP_REPO_ROOT=$(cd "$here/.." && pwd -P) || amp_die "cannot find the repository root from $here"
  amp_check_java
  if [[ ${1:-} == --check ]]; then
    amp_ensure_python_only
    return 0
  fi
  amp_ensure_venv
  amp_install
  export AMP_REPO_ROOT AMP_VENV_PYTHON
  export VIRTUAL_ENV=$AMP_REPO_ROOT/.venv
  export PATH=$VIRTUAL_ENV/bin:$PATH
  export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$AMP_VENV_PYTHON}
  export PYSPARK_DRIVER_PYTHON=${PYSPARK_DRIVER_PYTHON:-$AMP_VENV_PYTHON}
}

# --check: a usable .venv counts as the Python prerequisite, as it does for the full bootstrap.
amp_ensure_python_only() {
  local probe
  if [[ -x $AMP_REPO_ROOT/.venv/bin/python ]]; then
    probe=$(amp_python_probe "$AMP_REPO_ROOT/.venv/bin/python") || probe=""
    [[ -n $probe ]] && amp_version_at_least "${probe% *}" 3 10 && return 0
  fi
  amp_find_python
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  amp_bootstrap "$@"
  printf 'bootstrap: ok (python %s, java %s)\n' "${AMP_VENV_PYTHON:-${AMP_PYTHON:-.venv/bin/python}}" "$AMP_JAVA"
else
  amp_bootstrap # not "$@": a sourced file sees its caller's arguments
fi
