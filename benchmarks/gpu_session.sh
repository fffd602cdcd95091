#!/usr/bin/env bash
# One device command of a session lent a GPU machine (it has torch and transformers, no package
# index): install the carried wheels, then the GPU pack's parts of command N
# (benchmarks/gpu_suite_parts.py COMMANDS), each time-boxed, the whole inside 6 minutes.
#
#   here, once:        bash benchmarks/gpu_wheels.sh
#   on the machine:    bash benchmarks/gpu_session.sh 1      (carrying .whl), then, while it is warm:
#                      bash benchmarks/gpu_session.sh 2
#
# Command 1 decides most: what the machine offers (versions, varlen / fused-optimizer / compile APIs),
# attention variants at the SFT shape with the profiler's kernel names, the log-prob heads, and the SFT
# ablations (baseline, + fused AdamW, + varlen attention, + reshard choice, + compile, baseline again).
# Command 2: the 2B world-model step's memory with and without checkpointing, rollout tokens/s and a
# GRPO step. Command 3 re-checks what earlier sessions measured (weight sync, FlowGRPO at a quarter of
# the frames, the recipes in bf16).
#
# Files written to $OUT (4, within the device tool's 8): gpu_suite.json, gpu_suite.md, gpu_suite.log,
# gpu_tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
command="${1:?usage: gpu_session.sh 1|2|3|4}"
out="${OUT_DIR:-${OUT:?set OUT_DIR or OUT}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -m pip install -q --no-index --no-deps .whl/*.whl || exit 1
echo "gpu_session: wheels installed at ${SECONDS} s"
total="${TOTAL_S:-350}"
timeout $((total - SECONDS)) python3 benchmarks/gpu_suite.py --command "$command" --out "$out"
echo "gpu_session: command $command exit $? at ${SECONDS} s"

# then the tests marked gpu of this command's fixes, in the time left (each test file's CPU twin runs in CI)
case "$command" in
  1) tests=(tests/test_varlen_attention.py tests/test_logprobs.py tests/test_host_syncs.py) ;;
  2) tests=(tests/test_compile.py tests/test_policy_optim.py tests/test_rollout_hf_static_cache.py) ;;
  4) tests=(tests/test_varlen_attention.py tests/test_compile.py) ;;
  *) tests=(tests/test_data_packing.py) ;;
esac
left=$((total - SECONDS))
if [ "$left" -gt 20 ]; then
  timeout "$left" python3 -m pytest -q -m gpu -p no:cacheprovider "${tests[@]}" > "$out/gpu_tests.log" 2>&1
  echo "gpu_session: gpu tests exit $? at ${SECONDS} s"; tail -5 "$out/gpu_tests.log"
else
  echo "gpu_session: no time left for the gpu tests (${left} s)"
fi
