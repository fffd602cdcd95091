#!/usr/bin/env bash
# Idempotent setup: .venv with torch, cosmos_primitives (editable) and its test extras, plus the
# system programs the tests use (redis-server, ffmpeg). Re-running is a no-op unless
# pyproject.toml or this script changed.
#
#   COSMOS_TORCH_SPEC   override the torch / torchvision requirement (e.g. for a CUDA index)
#   PYTHON              interpreter used to create .venv (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv
stamp="$venv/.cosmos-setup-stamp"

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

want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
case "$(uname -m)" in
  # The Qwen2.5-VL video processor needs torchvision; these two are built for each other.
  x86_64) torch_spec="torch==2.14.1 torchvision==0.29.1" ;;
  *) torch_spec="torch>=2.11,<2.15 torchvision" ;;
esac
torch_spec="${COSMOS_TORCH_SPEC:-$torch_spec}"
echo "setup: installing $torch_spec"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q --disable-pip-version-check $torch_spec
echo "setup: installing cosmos_primitives[dev]"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]"
echo "$want" > "$stamp"
echo "setup: done ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
