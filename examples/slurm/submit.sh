#!/bin/bash
# Submit one run: the Redis job, the trainer job and N rollout jobs (default 2).
#   RUN=exp42 CONFIG=/shared/my.toml SHARED=/shared/runs/exp42 bash examples/slurm/submit.sh 4
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
N=${1:-2}
: "${RUN:?set RUN}" "${CONFIG:?set CONFIG}" "${SHARED:?set SHARED}"
mkdir -p "$SHARED"
export RUN CONFIG SHARED
REDIS_JOB=$(sbatch --parsable --output "$SHARED/redis_%j.log" "$HERE/redis.sbatch")
# the others start once the Redis job runs; they also wait for its URL file
sbatch --dependency "after:$REDIS_JOB" --output "$SHARED/trainer_%j.log" "$HERE/trainer.sbatch"
for _ in $(seq "$N"); do
    sbatch --dependency "after:$REDIS_JOB" --output "$SHARED/rollout_%j.log" "$HERE/rollout.sbatch"
done
echo "submitted run $RUN: redis job $REDIS_JOB, a trainer job and $N rollout jobs; status:"
echo "  COSMOS_REDIS_URL=\$(cat $SHARED/secrets/redis_url) python -m cosmos_primitives.queue.status --run $RUN"
