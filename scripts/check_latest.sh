#!/usr/bin/env bash
# Try the newest versions pyproject.toml allows, in a throwaway venv, against the fast tests, and
# say which package broke what. Not part of CI (the registry moves under it): run it before
# widening a range in pyproject.toml, when a user reports a break on a fresh install, and before
# refreshing the lock. docs/install.md says more.
#
#   scripts/check_latest.sh                  newest versions, fast tests (-m "not slow"), report
#   scripts/check_latest.sh --write-lock     the same, then rewrite requirements/lock.txt if green
#   scripts/check_latest.sh -- PYTEST_ARGS   run these tests instead (e.g. tests/test_policy_lora.py)
#   KEEP_VENV=1 scripts/check_latest.sh      keep the throwaway venv (its path is printed)
#
# When tests fail, each package whose newest version differs from the lock is put back to its
# locked version, one at a time, and the failing tests are run again: a package whose locked
# version makes them pass is named as the one that broke them. Exit status: 0 green, 1 failures.
set -euo pipefail
cd "$(dirname "$0")/.."

write_lock=0
pytest_args=(-m "not slow")
while [ $# -gt 0 ]; do
  case "$1" in
    --write-lock) write_lock=1; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "check_latest: unknown argument '$1' (see the head of $0)" >&2; exit 2 ;;
  esac
done

lock=requirements/lock.txt
work="$(mktemp -d "${TMPDIR:-/tmp}/cosmos-latest.XXXXXX")"
venv="$work/venv"
if [ "${KEEP_VENV:-0}" = 1 ]; then echo "check_latest: venv kept at $venv"; else trap 'rm -rf "$work"' EXIT; fi
py="$venv/bin/python"

echo "== check_latest: building $venv with the newest allowed versions"
COSMOS_VENV="$venv" COSMOS_LOCK=none bash scripts/setup.sh

python3 scripts/lock_versions.py diff "$lock" "$py" > "$work/changed.txt"
echo "== check_latest: versions that differ from $lock (package locked -> newest)"
if [ -s "$work/changed.txt" ]; then awk '{printf "  %-32s %s -> %s\n", $1, $2, $3}' "$work/changed.txt"
else echo "  none: the newest allowed versions are the locked ones"; fi

run_tests() {  # run_tests LOG ARGS...: pytest in the throwaway venv; failing node ids -> LOG.failed
  local log="$1"; shift
  set +e
  "$py" -m pytest -q -p no:cacheprovider -rfE "$@" > "$log" 2>&1
  local rc=$?
  set -e
  grep -E '^(FAILED|ERROR) ' "$log" | sed -E 's/^(FAILED|ERROR) //; s/ - .*$//' | sort -u > "$log.failed" || true
  return $rc
}

echo "== check_latest: pytest ${pytest_args[*]}"
if run_tests "$work/tests.log" "${pytest_args[@]}"; then
  tail -n 1 "$work/tests.log"
  echo "== check_latest: GREEN with the newest allowed versions"
  if [ "$write_lock" = 1 ]; then
    python3 scripts/lock_versions.py write "$py" "$lock"
    echo "check_latest: now run 'make test' (the whole suite on the new lock) before committing $lock"
  fi
  exit 0
fi
tail -n 1 "$work/tests.log"
if [ ! -s "$work/tests.log.failed" ]; then
  echo "== check_latest: pytest failed before reporting a test (collection or setup); its output:"
  tail -n 40 "$work/tests.log"
  exit 1
fi
echo "== check_latest: failing with the newest versions:"
sed 's/^/  /' "$work/tests.log.failed"

# Which package broke what: put each changed package back to its lock, rerun only what failed.
"$py" -m pip freeze --exclude-editable --disable-pip-version-check > "$work/newest.txt"
mapfile -t failed < "$work/tests.log.failed"
blamed=0
while read -r name locked newest; do
  [ "$locked" = - ] && continue
  "$py" -m pip install -q --disable-pip-version-check "$name==$locked" > /dev/null 2>&1 || {
    echo "  $name: could not install the locked $locked beside the newest versions; not tried"; continue; }
  run_tests "$work/pin.log" "${failed[@]}" || true
  fixed=$(comm -23 "$work/tests.log.failed" "$work/pin.log.failed" | wc -l)
  if [ "$fixed" -gt 0 ]; then
    blamed=1
    echo "== $name $locked -> $newest breaks $fixed test(s); with $name==$locked they pass:"
    comm -23 "$work/tests.log.failed" "$work/pin.log.failed" | sed 's/^/  /'
  fi
  "$py" -m pip install -q --disable-pip-version-check -r "$work/newest.txt" > /dev/null 2>&1
done < "$work/changed.txt"
[ "$blamed" = 1 ] || echo "== check_latest: no single package's locked version fixes the failures" \
  "(a combination, or a change outside the lock such as torch); see the log above"
echo "== check_latest: RED with the newest allowed versions; the lock was left as it is"
exit 1
