# Shared by the sbatch scripts: checks the variables every job of a run needs and waits for Redis.
: "${RUN:?set RUN, the run name every job of the run shares}"
: "${CONFIG:?set CONFIG, the TOML config every job of the run reads}"
: "${SHARED:?set SHARED, a folder every node sees (Redis data, its URL, outputs)}"
REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
cd "$REPO"
# shellcheck disable=SC1091
[ -f .venv/bin/activate ] && source .venv/bin/activate

# The run's secrets, made once per run by whichever job comes first, readable by this user only:
# secrets/run_secret (signs the weight transfer and the stop flag) and secrets/redis_password.
ensure_run_secrets() {
    (umask 077; mkdir -p "$SHARED/secrets"
     for name in run_secret redis_password; do
         if [ ! -s "$SHARED/secrets/$name" ]; then
             python -c "import secrets; print(secrets.token_hex(32))" > "$SHARED/secrets/$name.$$"
             mv -n "$SHARED/secrets/$name.$$" "$SHARED/secrets/$name"
             rm -f "$SHARED/secrets/$name.$$"
         fi
     done)
    export COSMOS_RUN_SECRET_FILE="$SHARED/secrets/run_secret"
}

# The jobs get the Redis URL (with its password) and the run secret through the environment, not argv.
wait_for_redis() {
    until [ -s "$SHARED/secrets/redis_url" ] && [ -s "$SHARED/redis_url" ]; do sleep 5; done
    COSMOS_REDIS_URL=$(cat "$SHARED/secrets/redis_url")
    export COSMOS_REDIS_URL COSMOS_RUN_SECRET_FILE="$SHARED/secrets/run_secret"
}
