#!/usr/bin/env bash
# Every GPU check of a session that is lent a GPU machine, in one command on that machine (it has
# torch and transformers, no package index): the memory options on one GPU, the tests marked gpu
# (all in tests/test_data_packing.py; collecting every module would need packages the machine lacks),
# then the GPU validation pack in the time left of TOTAL_S (default 590 s, inside the device tool's
# 10-minute command). Each step is time-boxed and leaves its output in OUT_DIR (default $OUT) before
# the next starts; the pack rewrites its report after every part, so a run cut short still returns
# what finished.
#
#   here, once:        bash benchmarks/gpu_wheels.sh
#   on the machine:    bash benchmarks/gpu_session.sh        (carrying .whl)
#
# On an H200 (2026-11-27) the memory runs took about 200 s (a process, a float32 0.5B model built on
# the host and two steps each; the offload run about 50 s) and the pack about 320 s: the whole fits the
# device tool's 10-minute command only just. With less time, run the pack alone.
#
# Files written (6, within the device tool's 8): bench_memory.log, bench_memory.json, gpu_tests.log,
# gpu_suite.json, gpu_suite.md, gpu_suite.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT_DIR:-${OUT:?set OUT_DIR or OUT}}"
total="${TOTAL_S:-590}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -m pip install -q --no-index --no-deps .whl/*.whl || exit 1
echo "gpu_session: wheels installed at ${SECONDS} s"

timeout 220 python3 benchmarks/bench_memory.py --device cuda --json "$out/bench_memory.json" \
  > "$out/bench_memory.log" 2>&1
echo "gpu_session: bench_memory exit $? at ${SECONDS} s"; tail -9 "$out/bench_memory.log"

timeout 45 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_data_packing.py > "$out/gpu_tests.log" 2>&1
echo "gpu_session: gpu tests exit $? at ${SECONDS} s"; tail -4 "$out/gpu_tests.log"

timeout $((total - SECONDS)) python3 benchmarks/gpu_suite.py --out "$out"
echo "gpu_session: gpu_suite exit $? at ${SECONDS} s"
