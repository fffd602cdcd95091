#!/usr/bin/env bash
# Idempotent setup: .venv with torch, cosmos_primitives (editable) and its test extras, plus the
# system programs the tests use (redis-server, ffmpeg). Python packages come from the lock
# (requirements/lock.txt: the versions the suite last passed with), so a new machine gets what CI
# tested. Re-running is a no-op unless pyproject.toml, the lock or this script changed.
#
#   COSMOS_LOCK         constraints file to install with (default requirements/lock.txt, used on
#                       x86_64 Python 3.11, which it was written for); "none": the newest versions
#                       pyproject.toml allows (what scripts/check_latest.sh tries)
#   COSMOS_VENV         the virtual environment to create or update (default .venv)
#   COSMOS_TORCH_SPEC   override the torch / torchvision requirement (e.g. for a CUDA index)
#   PYTHON              interpreter used to create the venv (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${COSMOS_VENV:-.venv}"
stamp="$venv/.cosmos-setup-stamp"
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] && python="$venv/bin/python"

lock="${COSMOS_LOCK-}"
if [ -z "$lock" ]; then
  lock=requirements/lock.txt
  where="$(uname -m) Python $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [ "$where" != "x86_64 Python 3.11" ]; then
    echo "setup: requirements/lock.txt is for x86_64 Python 3.11, this is $where: installing the newest" \
         "versions pyproject.toml allows (COSMOS_LOCK=requirements/lock.txt to use the lock anyway)"
    lock=none
  fi
fi
if [ "$lock" != none ] && [ ! -f "$lock" ]; then
  echo "setup: COSMOS_LOCK=$lock does not exist (a constraints file, or 'none' for the newest versions)" >&2
  exit 2
fi

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v ffmpeg >/dev/null 2>&1 || missing+=(ffmpeg)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${missing[*]} with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing system programs: ${missing[*]}" >&2
    echo "setup: install them with:  sudo apt-get install -y ${missing[*]}" >&2
    echo "setup:                  or: conda install -c conda-forge ${missing[*]}" >&2
  fi
fi

want="$( (cat pyproject.toml scripts/setup.sh; echo "lock=$lock torch=${COSMOS_TORCH_SPEC-}";
          [ "$lock" = none ] || cat "$lock") | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# --no-compile: pip byte-compiles every file it installs (21,000, 45 s of a new venv's 95 s, most of them in
# modules nothing imports); Python compiles and caches what is imported, once (the Makefile keeps that on)
pip_install=("$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile)
"${pip_install[@]}" --upgrade pip
case "$(uname -m)" in
  # The Qwen2.5-VL video processor needs torchvision; these two are built for each other.
  x86_64) torch_spec="torch==2.14.1 torchvision==0.29.1" ;;
  *) torch_spec="torch>=2.11,<2.15 torchvision" ;;
esac
torch_spec="${COSMOS_TORCH_SPEC:-$torch_spec}"
echo "setup: installing $torch_spec"
# shellcheck disable=SC2086
"${pip_install[@]}" $torch_spec
if [ "$lock" = none ]; then
  # pip keeps what the venv already holds: in a new venv (check_latest.sh) this is the newest allowed
  echo "setup: installing cosmos_primitives[dev] without a lock (newest allowed versions)"
  "${pip_install[@]}" -e ".[dev]"
else
  echo "setup: installing cosmos_primitives[dev] with the versions in $lock"
  "${pip_install[@]}" -c "$lock" -e ".[dev]"
  "$venv/bin/python" scripts/lock_versions.py verify "$lock" "$venv/bin/python"
fi
echo "$want" > "$stamp"
echo "setup: done ($("$venv/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
