#!/usr/bin/env bash
# tests/run.sh: runs every suite (`make test` calls it after building) and
# ends with one line "N passed, N failed". Suites: C unit tests, Lua specs
# run by lutra (busted), REPL tests on a pseudo-terminal, distributed specs
# under mpirun, GPU checks. Each prints its own lines; a suite that cannot
# run here says why and counts as skipped, not passed.
set -u
cd "$(dirname "$0")/.."
passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

count() { # suite-name passed failed
  echo "== $1: $2 passed, $3 failed"
  passed=$((passed + $2))
  failed=$((failed + $3))
}

# C unit tests: each binary prints "<file>: N passed, M failed"
cp=0; cf=0
for t in build/tests/test_*; do
  [ -x "$t" ] || continue
  out=$("$t" 2>&1); rc=$?
  echo "$out" | grep -v ': [0-9]* passed, [0-9]* failed$' | sed 's/^/   /'
  line=$(echo "$out" | grep -E ': [0-9]+ passed, [0-9]+ failed$' | tail -1)
  if [ -z "$line" ]; then
    echo "   $t crashed (status $rc)"; cf=$((cf + 1)); continue
  fi
  p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed$/\1/')
  f=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed, ([0-9]+) failed$/\2/')
  cp=$((cp + p)); cf=$((cf + f))
done
count "C unit tests" $cp $cf

# Lua specs (busted under lutra), TAP output
./lutra tests/lua/run.lua -o TAP tests/lua >"$log" 2>&1
lp=$(grep -c '^ok ' "$log")
lf=$(grep -c '^not ok ' "$log")
grep -A6 '^not ok ' "$log" | sed 's/^/   /'
if ! grep -q '^1\.\.[0-9]' "$log"; then
  echo "   busted did not finish:"; tail -20 "$log" | sed 's/^/   /'; lf=$((lf + 1))
fi
count "Lua specs" "$lp" "$lf"

# REPL on a pseudo-terminal (line editing, completion, Ctrl-C)
if command -v python3 >/dev/null 2>&1; then
  python3 tests/cli/repl_pty.py ./lutra >"$log" 2>&1
  rp=$(grep -c '^ok ' "$log"); rf=$(grep -c '^not ok ' "$log")
  grep -A8 '^not ok ' "$log" | sed 's/^/   /'
  grep -q '^1\.\.[0-9]' "$log" || { echo "   repl tests did not finish:"; tail -20 "$log" | sed 's/^/   /'; rf=$((rf + 1)); }
  count "REPL tests" "$rp" "$rf"
else
  echo "== REPL tests: skipped: python3 is not installed (make deps installs it)"
fi

# Distributed specs under mpirun (tests/dist/run.sh: 2 and 4 ranks, job-ending checks)
if ! command -v mpirun >/dev/null 2>&1; then
  echo "== distributed specs: skipped: mpirun is not installed (make deps installs openmpi-bin)"
elif ! ./lutra --version 2>/dev/null | grep -q 'mpi: compiled in'; then
  echo "== distributed specs: skipped: this lutra was built without MPI"
else
  bash tests/dist/run.sh >"$log" 2>&1
  grep -A16 '^not ok' "$log" | sed 's/^/   /'
  line=$(grep -E '^dist: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
  if [ -z "$line" ]; then
    echo "   distributed specs did not finish:"; tail -20 "$log" | sed 's/^/   /'
    count "distributed specs" 0 1
  else
    dp=$(echo "$line" | sed -E 's/dist: ([0-9]+) passed.*/\1/')
    df=$(echo "$line" | sed -E 's/.*passed, ([0-9]+) failed/\1/')
    count "distributed specs" "$dp" "$df"
  fi
fi

# GPU checks
./lutra tests/gpu/checks.lua >"$log" 2>&1; rc=$?
if grep -q '^skipped' "$log"; then
  echo "== GPU checks: $(grep '^skipped' "$log" | head -1)"
else
  sed 's/^/   /' "$log"
  gp=$(grep -c '^ok ' "$log"); gf=$(grep -c '^not ok ' "$log")
  [ $rc -ne 0 ] && [ "$gf" -eq 0 ] && gf=1
  count "GPU checks" "$gp" "$gf"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
