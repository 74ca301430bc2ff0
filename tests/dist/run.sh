#!/usr/bin/env bash
# tests/dist/run.sh: the distributed specs under mpirun, on 2 ranks and on 4
# (the loader's also on 3; --oversubscribe: this machine may have fewer
# cores), recipes/sample.lua on the weights of a 2-rank ZeRO 3 checkpoint
# and of a 2-stage pipeline's,
# recipes/gpt2.lua tensor parallel on 2 ranks (--tp=2 --sp trained,
# checkpointed and resumed, a resume on another layout refused, its weights
# sampled by one process, shapes that do not split refused, a Llama),
# plus the job-ending checks: an error on one rank ends the job within
# seconds with a non-zero status; a collective that one rank calls from
# another line fails at once naming both; a rank that skips a collective
# is reported by the watchdog, which names the ranks that never arrived.
# Prints "ok"/"not ok" lines and ends with "dist: P passed, F failed".
set -u
cd "$(dirname "$0")/../.."
MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" -eq 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
passed=0
failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
notok() { echo "not ok - $1"; echo "$2" | tail -15 | sed 's/^/     /'; failed=$((failed + 1)); }

# every spec on 2 ranks and on 4; the loader's (cheap) also on 3, which
# divides neither its 11 windows nor the usual batch sizes
for spec in tests/dist/*_spec.lua; do
  nps="2 4"
  [ "$spec" = tests/dist/loader_spec.lua ] && nps="2 3 4"
  for np in $nps; do
    out=$(timeout 300 $MPIRUN -np $np ./lutra "$spec" 2>&1)
    line=$(echo "$out" | grep -E '^dist .* np=[0-9]+: [0-9]+ passed, [0-9]+ failed$' | tail -1)
    if [ -z "$line" ]; then
      notok "$spec on $np ranks did not finish" "$out"
      continue
    fi
    echo "$out" | grep -E '^((not )?ok |# )' | sed "s/^/  [np=$np] /"
    echo "$out" | grep '^\[rank' | sed 's/^/     /'
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.*passed, ([0-9]+) failed$/\1/')
    passed=$((passed + p))
    failed=$((failed + f))
  done
done

# all_reduce and broadcast in pieces (as tensors over 2^30 elements go), here 3 elements a piece
out=$(LUTRA_COMM_CHUNK=3 timeout 300 $MPIRUN -x LUTRA_COMM_CHUNK -np 2 ./lutra tests/dist/collectives_spec.lua 2>&1)
line=$(echo "$out" | grep -E '^dist .* np=[0-9]+: [0-9]+ passed, 0 failed$' | tail -1)
if [ -n "$line" ]; then ok "the collectives in pieces of 3 elements (LUTRA_COMM_CHUNK=3): $line"
else notok "the collectives in pieces of 3 elements (LUTRA_COMM_CHUNK=3)" "$out"; fi

# the weights of a 2-rank ZeRO 3 checkpoint, sampled by one process (no mpirun)
dir=$(mktemp -d /tmp/lutra-dist-sample.XXXXXX)
out=$(timeout 120 $MPIRUN -np 2 ./lutra tests/dist/jobs/save_checkpoint.lua --out="$dir" --stage=3 2>&1 \
      && timeout 60 ./lutra recipes/sample.lua --ckpt="$dir/job/ckpt" --prompt=The --max_tokens=4 --temperature=0 2>&1)
if echo "$out" | grep -q 'sample: 4 tokens'; then ok "recipes/sample.lua reads the weights of a 2-rank ZeRO 3 checkpoint"
else notok "recipes/sample.lua reads the weights of a 2-rank ZeRO 3 checkpoint" "$out"; fi
rm -rf "$dir"

# the weights of a 2-stage pipeline checkpoint (model-pp<s> files), sampled by one process
dir=$(mktemp -d /tmp/lutra-dist-sample.XXXXXX)
out=$(timeout 120 $MPIRUN -np 2 ./lutra tests/dist/jobs/save_checkpoint.lua --out="$dir" --pp=2 --stage=0 2>&1 \
      && timeout 60 ./lutra recipes/sample.lua --ckpt="$dir/job/ckpt" --prompt=The --max_tokens=4 --temperature=0 2>&1)
if echo "$out" | grep -q 'sample: 4 tokens' && [ -f "$dir/job/ckpt/step_00000002/model-pp00001.safetensors" ]; then
  ok "recipes/sample.lua reads the weights of a 2-stage pipeline checkpoint"
else notok "recipes/sample.lua reads the weights of a 2-stage pipeline checkpoint" "$out"; fi
rm -rf "$dir"

# the main recipe tensor parallel (tiny shapes, random shards): GPT-2 with
# sequence parallelism trained, checkpointed and resumed on 2 ranks, a
# resume on another layout refused, its weights sampled by one process; a
# Llama with grouped-query heads over tp=2
dir=$(mktemp -d /tmp/lutra-dist-tp.XXXXXX)
./lutra -e "local lt = require 'lutra'; local g = lt.Generator(3)
  lt.data.write_shard('$dir/train_000000.bin', lt.randint(0, 50257, { 6000 }, { generator = g }), 50257)
  lt.data.write_shard('$dir/val_000000.bin', lt.randint(0, 50257, { 600 }, { generator = g }), 50257)" >/dev/null 2>&1
tiny="recipes/gpt2.lua --data=$dir --n_layer=1 --n_head=2 --n_embd=16 --seq=8 --batch=2 --eval_every=2 --eval_batches=1 --sample_every=2 --sample_tokens=2 --log_every=1 --name=tp-job-$$"
out=$(timeout 120 $MPIRUN -np 2 ./lutra $tiny --tp=2 --sp --steps=2 --ckpt_every=2 2>&1 \
      && timeout 120 $MPIRUN -np 2 ./lutra $tiny --tp=2 --sp --steps=4 --ckpt_every=2 --resume=auto 2>&1)
if echo "$out" | grep -q 'tensor parallel over 2 ranks (sequence parallel)' && echo "$out" | grep -q 'resuming from' \
   && echo "$out" | grep -q 'step     4/4 | loss'; then ok "recipes/gpt2.lua --tp=2 --sp trains, checkpoints and resumes on 2 ranks"
else notok "recipes/gpt2.lua --tp=2 --sp trains, checkpoints and resumes on 2 ranks" "$out"; fi
out=$(timeout 120 $MPIRUN -np 2 ./lutra $tiny --steps=6 --resume=auto 2>&1)
if echo "$out" | grep -q "layout is dp 1 x tp 2"; then ok "a tp=2 checkpoint's resume as dp=2 is refused naming both layouts"
else notok "a tp=2 checkpoint's resume as dp=2 is refused naming both layouts" "$out"; fi
out=$(timeout 60 ./lutra recipes/sample.lua --ckpt="runs/tp-job-$$/ckpt" --prompt=The --max_tokens=4 --temperature=0 2>&1)
if echo "$out" | grep -q 'sample: 4 tokens'; then ok "recipes/sample.lua reads the weights of a tp=2 checkpoint"
else notok "recipes/sample.lua reads the weights of a tp=2 checkpoint" "$out"; fi
rm -rf "runs/tp-job-$$"
out=$(timeout 60 $MPIRUN -np 2 ./lutra $tiny --tp=2 --n_head=1 --steps=1 2>&1)
# (the message without the recipe's file:line; the other ranks' lines may be cut by the job's end)
if echo "$out" | grep -q '^\[rank [01]\] lutra: --tp=2: gpt2: n_head 1 does not divide by tp 2'; then
  ok "recipes/gpt2.lua --tp=2 --n_head=1 is refused, naming n_head"
else notok "recipes/gpt2.lua --tp=2 --n_head=1 is refused, naming n_head" "$out"; fi
out=$(timeout 60 $MPIRUN -np 2 ./lutra $tiny --tp=2 --sp --batch=1 --seq=7 --steps=1 2>&1)
if echo "$out" | grep -q '^\[rank [01]\] lutra: --sp splits each batch.s --batch x --seq = 7 tokens across --tp=2 ranks'; then
  ok "recipes/gpt2.lua --tp=2 --sp with --batch x --seq = 7 tokens is refused (no step would run sequence-parallel)"
else notok "recipes/gpt2.lua --tp=2 --sp with --batch x --seq = 7 tokens is refused (no step would run sequence-parallel)" "$out"; fi
out=$(timeout 120 $MPIRUN -np 2 ./lutra $tiny --tp=2 --model=llama --n_head=4 --n_kv_head=2 --steps=2 2>&1)
if echo "$out" | grep -q 'Llama with 1 layers' && echo "$out" | grep -q 'step     2/2 | loss'; then
  ok "recipes/gpt2.lua --model=llama --tp=2 trains on 2 ranks"
else notok "recipes/gpt2.lua --model=llama --tp=2 trains on 2 ranks" "$out"; fi
rm -rf "runs/tp-job-$$" "$dir"

# job NAME PATTERN MAX_SECONDS DESCRIPTION [RANKS]: a job (2 ranks unless
# RANKS) that must end with a non-zero status within MAX_SECONDS, its output
# matching PATTERN
job() {
  local start took rc out
  start=$(date +%s)
  out=$(timeout 60 $MPIRUN -np "${5:-2}" ./lutra "tests/dist/jobs/$1.lua" 2>&1); rc=$?
  took=$(( $(date +%s) - start ))
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le "$3" ] && echo "$out" | grep -q "$2" \
     && ! echo "$out" | grep -q unreachable; then
    ok "$4 (status $rc, $took s)"
  else
    notok "$4 (status $rc, $took s)" "$out"
  fi
}
job error_on_one_rank '^\[rank 1\] lutra: .*a deliberate failure on rank 1' 20 \
  "an error on rank 1 ends the job with [rank 1] and the message"
job skip_collective '^\[rank 0\] lutra: watchdog: all_reduce (group 0 of 2 ranks, call 0, 4 elements) not complete after 2 s at tests/dist/jobs/skip_collective.lua:[0-9]*: never arrived: rank 1 (no answer in 1 s' 25 \
  "the watchdog reports a skipped collective, where it waits and the rank that never arrived, and aborts the job"
job skip_collective '^\[rank [01]\] lutra: watchdog: all_reduce (group 0 of 3 ranks, call 0, 4 elements) not complete after 2 s at [^:]*:[0-9]*: never arrived: rank 2 (no answer in 1 s[^;]*; aborting' 25 \
  "on 3 ranks the watchdog names only the rank that never arrived" 3
job wait_elsewhere '^\[rank 0\] lutra: watchdog: all_reduce (group 0 of 2 ranks, call 0, 4 elements) not complete after 2 s at tests/dist/jobs/wait_elsewhere.lua:[0-9]*: never arrived: rank 1 (waits in recv, group 0 send/recv 0, at tests/dist/jobs/wait_elsewhere.lua:[0-9]*)' 25 \
  "the watchdog names a rank waiting in another call, with that call and its site"
job extra_barrier '^\[rank [01]\] lutra: .*barrier (group 0, call 0): the ranks call it from different places: rank 0 at tests/dist/jobs/extra_barrier.lua:8; rank 1 at tests/dist/jobs/extra_barrier.lua:9' 10 \
  "a barrier only rank 0 calls fails at once on every rank naming both call sites (not the watchdog)"
job split_on_one_rank '^\[rank 0\] lutra: watchdog: new_group ' 25 \
  "the watchdog reports a group made on one rank only"
job recv_without_sender '^\[rank 0\] lutra: watchdog: recv ' 25 \
  "the watchdog reports a recv whose sender never comes"

echo "dist: $passed passed, $failed failed"
