#!/usr/bin/env bash
# tests/run.sh: runs every suite (`make test` calls it after building) and
# ends with one line "N passed, N failed". Suites: C unit tests, Lua specs
# run by lutra (busted), REPL tests on a pseudo-terminal, distributed specs
# under mpirun, GPU checks (on the CUDA emulator where there is no GPU).
# Each prints its own lines; a suite that cannot run here says why and
# counts as skipped, not passed.
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

# a suite's summary line "...N passed, M failed" counted under suite-name
# (no line: the suite did not finish, one failure)
count_line() { # suite-name line
  if [ -z "$2" ]; then
    count "$1" 0 1
  else
    count "$1" "$(echo "$2" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed$/\1/')" \
      "$(echo "$2" | sed -E 's/.* ([0-9]+) passed, ([0-9]+) failed$/\2/')"
  fi
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
  [ -z "$line" ] && { echo "   distributed specs did not finish:"; tail -20 "$log" | sed 's/^/   /'; }
  count_line "distributed specs" "$line"
fi

# one run counted as one test: passed when it exited 0 and its log has the pattern
count_run() { # suite-name exit-status pattern
  if [ "$2" -eq 0 ] && grep -q "$3" "$log"; then
    count "$1" 1 0
  else
    sed 's/^/   /' "$log" | tail -20
    count "$1" 0 1
  fi
}

# GPU checks: on the GPU when there is one, else on the CUDA emulator
# (build-emu/lutra, tests/emu/README.md) when it was built
gpu_checks() { # suite-name lutra-binary [name-fragment]
  "$2" tests/gpu/checks.lua ${3:+"$3"} >"$log" 2>&1; rc=$?
  if grep -q '^skipped' "$log"; then
    echo "== $1: $(grep '^skipped' "$log" | head -1)"
    return 1
  fi
  # (the emulator's deliberate refusals are not shown: lutra's notes of its fallbacks are)
  grep -v '^ok ' "$log" | grep -v 'epilogues refused (LUTRA_EMU_REFUSE_EPILOGUES)$' | sed 's/^/   /'
  gp=$(grep -c '^ok ' "$log"); gf=$(grep -c '^not ok ' "$log")
  [ $rc -ne 0 ] && [ "$gf" -eq 0 ] && gf=1
  count "$1" "$gp" "$gf"
}
if ! gpu_checks "GPU checks" ./lutra; then
  if [ -x build-emu/lutra ]; then
    # the emulator's own test first: it must catch what it claims to catch
    out=$(build-emu/tests/emu/selftest 2>&1)
    echo "$out" | grep -v 'passed, [0-9]* failed$' | sed 's/^/   /'
    count_line "CUDA emulator selftest" "$(echo "$out" | grep -E '^emu selftest: [0-9]+ passed, [0-9]+ failed$')"
    out=$(build-emu/tests/emu/cudnn_selftest 2>&1)
    echo "$out" | grep -v 'passed, [0-9]* failed$' | sed 's/^/   /'
    count_line "CUDA emulator's cuDNN selftest" "$(echo "$out" | grep -E '^cudnn selftest: [0-9]+ passed, [0-9]+ failed$')"
    # (its NCCL's refusals print their messages to stderr: expected, not shown)
    out=$(build-emu/tests/emu/nccl_selftest 2>/dev/null)
    echo "$out" | grep -E '^(not ok|FAIL)' | sed 's/^/   /'
    count_line "CUDA emulator's NCCL selftest (3 ranks)" "$(echo "$out" | grep -E '^nccl selftest: [0-9]+ passed, [0-9]+ failed$')"
    traces=$(mktemp -d)
    LUTRA_EMU_TRACE=$traces/checks gpu_checks "GPU checks (CUDA emulator)" build-emu/lutra
    # the linear checks again with cuBLASLt refusing the epilogues (lutra composes)
    for where in heuristic matmul; do
      suite="linear, cuBLASLt refusing epilogues at the $where (CUDA emulator)"
      LUTRA_EMU_REFUSE_EPILOGUES=$where gpu_checks "$suite" build-emu/lutra linear
      grep -q 'running it as matmul' "$log" || { echo "   lutra did not say it composed"; count "$suite" 0 1; }
    done
    # cuDNN's checks again as cuDNN 9.5 (lutra's older-cuDNN paths: handles, mask value, accumulator, refusals)
    LUTRA_EMU_CUDNN_VERSION=90500 gpu_checks "cuDNN attention as cuDNN 9.5 (CUDA emulator)" build-emu/lutra cuDNN
    # lt.dist on CUDA tensors over several ranks, a process and an emulated
    # device each (tests/emu/nccl_ranks.cc): the collectives and lt.dist.tp's
    # layers against the CPU on 2 and 4 ranks, then the emulated NCCL's
    # answers to mismatched calls and a late rank
    if ! command -v mpirun >/dev/null 2>&1 || ! build-emu/lutra --version 2>/dev/null | grep -q 'mpi: compiled in'; then
      echo "== lt.dist on CUDA tensors (CUDA emulator): skipped: no mpirun, or build-emu/lutra without MPI"
    else
      mpirun="mpirun --oversubscribe"
      [ "$(id -u)" -eq 0 ] && mpirun="$mpirun --allow-run-as-root"
      for np in 2 4; do
        timeout 120 $mpirun -np $np build-emu/lutra tests/dist/cuda_spec.lua >"$log" 2>&1
        grep -A12 '^not ok' "$log" | sed 's/^/   /'
        line=$(grep -E '^dist .* np=[0-9]+: [0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
        [ -z "$line" ] && { echo "   tests/dist/cuda_spec.lua on $np ranks did not finish:"; tail -20 "$log" | sed 's/^/   /'; }
        count_line "lt.dist on CUDA tensors, $np ranks (CUDA emulator)" "$line"
      done
      timeout 60 $mpirun -x LUTRA_COMM_CHECK=0 -x LUTRA_EMU_NCCL_TIMEOUT=1 -np 2 build-emu/lutra \
        tests/dist/jobs/cuda_nccl_faults.lua >"$log" 2>&1
      count_run "the emulated NCCL's mismatched calls and late rank (2 ranks)" $? '^cuda nccl faults: ok$'
    fi
    # the main job's CUDA path (lt.train, evaluation, sampling): 4 steps of a
    # tiny model on the Python tutorial's token shards
    tutorial=/usr/share/doc/python3.11/html/_sources/tutorial
    if [ -d "$tutorial" ]; then
      name=emulator-main-job-$$
      shards=$(mktemp -d)
      { ./lutra recipes/prepare.lua --input="$tutorial" --out="$shards" --val_frac=0.1 --quiet=true &&
        build-emu/lutra recipes/gpt2.lua --data="$shards" --device=cuda --dtype=bf16 --steps=4 --n_layer=2 \
          --n_embd=64 --n_head=2 --seq=32 --batch=2 --eval_every=2 --eval_batches=1 --sample_every=4 \
          --sample_tokens=8 --pad_vocab=128 --warmup=1 --log_every=1 --name=$name; } >"$log" 2>&1; rc=$?
      rm -rf "runs/$name" "$shards"
      count_run "main job (CUDA emulator, 4 steps)" $rc '^done: 4 steps'
    else
      echo "== main job (CUDA emulator): skipped: no Python docs in $tutorial (make deps)"
    fi
    # the GPU benchmark's script, at a tiny size (its numbers mean nothing here)
    LUTRA_EMU_TRACE=$traces/bench build-emu/lutra bench/gpt2_gpu.lua --steps=1 --batches=1 --dtypes=bf16 \
      --model=gpt2-tiny --T=32 --rate_size=64 --profile=5 >"$log" 2>&1
    count_run "GPU benchmark script (CUDA emulator)" $? '^bf16 *1 *32 *[0-9]'
    count_run "its step's profile (CUDA emulator)" 0 '^total (start to the last piece)'
    LUTRA_EMU_TRACE=$traces/optim build-emu/lutra bench/optim.lua --model=gpt2-tiny --device=cuda --dtype=bf16 \
      --reps=1 >"$log" 2>&1
    count_run "optimizer benchmark script (CUDA emulator)" $? '^grad_norm + step{grad_scale} (lt.train.s clip) *[0-9]'
    # the random-shape attention check tests/gpu/run.sh runs on the GPU, a few cases
    build-emu/lutra tests/gpu/attention_sweep.lua 3 4 >"$log" 2>&1
    count_run "tensor-core attention on random shapes (CUDA emulator, 4 cases)" $? '^0 of 4 cases bad$'
    # what the emulator cannot refuse: blocks needing more registers or shared
    # memory than sm_90 gives one (ptxas's figures from the nvcc build)
    if ls build/kernels/cuda/*.o.ptxas >/dev/null 2>&1; then
      python3 tests/gpu/launch_limits.py build/kernels/cuda/*.o.ptxas -- "$traces"/* >"$log" 2>&1
      count_run "kernel launches within sm_90's registers and shared memory per block" $? \
        '^launch limits: [1-9][0-9]* kernels fit, 0 do not$'
    fi
    rm -rf "$traces"
  else
    echo "== GPU checks (CUDA emulator): skipped: build-emu/lutra was not built (make emu; needs CUDA's headers)"
  fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
