# Shared by the sbatch scripts: checks the variables every job of a run needs and waits for Redis.
: "${RUN:?set RUN, the run name every job of the run shares}"
: "${CONFIG:?set CONFIG, the TOML config every job of the run reads}"
: "${SHARED:?set SHARED, a folder every node sees (Redis data, its URL, outputs)}"
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
cd "$REPO"
# shellcheck disable=SC1091
[ -f .venv/bin/activate ] && source .venv/bin/activate

wait_for_redis() {
    until [ -s "$SHARED/redis_url" ]; do sleep 5; done
    REDIS_URL=$(cat "$SHARED/redis_url")
    export REDIS_URL
}
