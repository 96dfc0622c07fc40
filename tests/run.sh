#!/usr/bin/env bash
# The test suite, as CI runs it (README "Testing"): everything the tests need, then pytest.
#   bash tests/run.sh [pytest args]        (default: -n 2 --dist worksteal -m "not gpu" tests)
# Run it inside the Python environment to test (CI: a fresh `python3 -m venv`). It installs
# the package with its `test` extra into that environment, and headless Chromium (a system
# package, through apt-get) where no Chromium is found: the HTML report tests render in it.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q '.[test]' || { echo "tests/run.sh: pip install '.[test]' failed"; exit 1; }
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  log=$(mktemp); t0=$SECONDS
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium; } >"$log" 2>&1; then
    tail -n 20 "$log"; echo "tests/run.sh: apt-get install chromium failed (the HTML report tests need it)"; exit 1
  fi
  rm -f "$log"; echo "tests/run.sh: chromium installed in $((SECONDS - t0)) s"
fi
# pytest (the console script) keeps the repository root off sys.path, so the installed package
# is what gets tested; two workers (pytest-xdist) over 2 cores, a worker out of tests taking half
# of the other's (worksteal: with tests/conftest.py's longest-first order, both finish together);
# the 25 slowest tests listed (CI has a time limit). Exit 5 (no tests ran) fails.
[ $# -gt 0 ] || set -- -n 2 --dist worksteal -m "not gpu" --durations=25 tests
python3 -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "tests/run.sh: no tests ran"; exit 1; fi
exit "$rc"
