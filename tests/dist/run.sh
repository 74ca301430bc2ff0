#!/usr/bin/env bash
# tests/dist/run.sh: the distributed specs under mpirun, on 2 ranks and on 4
# (the loader's also on 3; --oversubscribe: this machine may have fewer
# cores), 3D parallelism on 8 (tests/dist/jobs/pp_3d.lua: dp=2 x tp=2 x
# pp=2 with ZeRO 1 against one process), recipes/sample.lua on the weights
# of a 2-rank ZeRO 3 checkpoint and of a 2-stage pipeline's,
# recipes/gpt2.lua tensor parallel on 2 ranks (--tp=2 --sp trained,
# checkpointed and resumed, a resume on another layout refused, its weights
# sampled by one process, shapes that do not split refused, a Llama),
# recipes/gpt2.lua pipeline parallel (--pp=2 on 2 ranks, --tp=2 --pp=2 --sp
# on 4, --tp=2 --pp=2 --zero=1 on 8, each against the recipe on one process;
# --zero=3 refused),
# plus the job-ending checks: an error on one rank ends the job within
# seconds with a non-zero status; a collective that one rank calls from
# another line fails at once naming both; a rank that skips a collective
# is reported by the watchdog, which names the ranks that never arrived;
# a pipeline stage's rank that raises or is killed mid-step (pp=2 and 4)
# ends the job within seconds; SIGINT to one rank of lt.train's pipeline
# ends the job naming it, SIGTERM stops every rank after the same step and
# saves it (tests/dist/jobs/pp_signal.lua); a pipeline rank killed while
# writing a checkpoint leaves none half-written for resume = auto
# (tests/dist/jobs/pp_kill_save.lua).
# The planner against lutra (recipes/plan.lua --measure --check=0.1): on
# 1, 2 and 4 ranks (1 process, DP, ZeRO 1-3, TP with and without SP, PP
# with 1F1B, GPipe and interleaving, recompute full and selective) for a
# GPT-2 and a Llama, each in a fresh job: every rank's predicted
# parameter, gradient and optimizer bytes equal lt.dist.memory_bytes, its
# predicted peak is within 10% of the allocator's, and one process's
# resident set within 10% of the prediction.
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

# 3D parallelism on 8 ranks (dp=2 x tp=2 x pp=2, ZeRO 1) against one
# process: its own job, the specs run on 2 and 4
out=$(timeout 240 $MPIRUN -np 8 ./lutra tests/dist/jobs/pp_3d.lua 2>&1)
line=$(echo "$out" | grep -E '^dist .* np=8: [0-9]+ passed, [0-9]+ failed$' | tail -1)
if [ -z "$line" ]; then
  notok "tests/dist/jobs/pp_3d.lua on 8 ranks did not finish" "$out"
else
  echo "$out" | grep -E '^((not )?ok |# )' | sed "s/^/  [np=8] /"
  echo "$out" | grep '^\[rank' | sed 's/^/     /'
  passed=$((passed + $(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')))
  failed=$((failed + $(echo "$line" | sed -E 's/.*passed, ([0-9]+) failed$/\1/')))
fi

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

# the main recipe pipeline parallel (tiny shapes, random shards): --pp=2 on
# 2 ranks and --tp=2 --pp=2 --sp on 4 log the same step losses, gradient
# norms and validation losses as the recipe on one process (metrics.jsonl,
# every digit it holds, to 1e-5 relative), and so does --tp=2 --pp=2 --zero=1
# on 8 ranks (dp=2 x tp=2 x pp=2: the losses and norms); --zero=3 with --pp is refused
dir=$(mktemp -d /tmp/lutra-dist-pp.XXXXXX)
./lutra -e "local lt = require 'lutra'; local g = lt.Generator(5)
  lt.data.write_shard('$dir/train_000000.bin', lt.randint(0, 50257, { 6000 }, { generator = g }), 50257)
  lt.data.write_shard('$dir/val_000000.bin', lt.randint(0, 50257, { 600 }, { generator = g }), 50257)" >/dev/null 2>&1
ptiny="recipes/gpt2.lua --data=$dir --n_layer=2 --n_head=2 --n_embd=16 --seq=8 --batch=2 --micro_batches=4 --steps=4 --eval_every=2 --eval_batches=1 --sample_every=2 --log_every=1 --threads=1"
# losses NAME [steps]: "step loss grad_norm" and (without "steps") "step val_loss" lines of runs/NAME/metrics.jsonl
losses() {
  grep '"grad_norm":' "runs/$1/metrics.jsonl" | sed -E 's/.*"grad_norm":([^,}]*).*"loss":([^,}]*).*"step":([0-9]+).*/\3 \2 \1/'
  [ "${2:-}" = steps ] ||
    grep '"val_loss":' "runs/$1/metrics.jsonl" | sed -E 's/.*"step":([0-9]+).*"val_loss":([^,}]*).*/\1 \2/'
}
# same_losses A B [steps]: every number of A's lines within 1e-5 relative of B's (as many lines, at least 4 steps)
same_losses() {
  local a b
  a=$(losses "$1" "${3:-}") b=$(losses "$2" "${3:-}")
  [ "$(echo "$a" | wc -l)" -ge 4 ] && [ "$(echo "$a" | wc -l)" -eq "$(echo "$b" | wc -l)" ] &&
    paste -d' ' <(echo "$a") <(echo "$b") | awk '{ n = NF / 2; for (i = 1; i <= n; i++) { x = $i; y = $(i + n);
      d = x - y; if (d < 0) d = -d; m = y < 0 ? -y : y; if (d > 1e-5 * m + 1e-12) bad = 1 } } END { exit bad }'
}
out=$(timeout 60 ./lutra $ptiny --name=pp-one-$$ 2>&1)
if [ $? -ne 0 ]; then notok "recipes/gpt2.lua on one process (the pipeline jobs' reference)" "$out"; fi
out=$(timeout 90 $MPIRUN -np 2 ./lutra $ptiny --pp=2 --print_schedule --name=pp-two-$$ 2>&1)
if echo "$out" | grep -q 'pipeline parallel over 2 stages (1f1b, 4 micro-batches), blocks 1+1 per stage' && echo "$out" | grep -q '^note: --pp=2: no samples' \
   && echo "$out" | grep -q '^memory per rank, stages 0..1: parameters [0-9.]* [KM]iB / [0-9.]* [KM]iB, gradients' \
   && echo "$out" | grep -q '^rank 0: F1 F2 B1 F3 B2 F4 B3 B4$' && echo "$out" | grep -q '^schedule: bubble 0.200 of a step' \
   && echo "$out" | grep -q 'step     4/4 | loss' && same_losses pp-two-$$ pp-one-$$; then
  ok "recipes/gpt2.lua --pp=2 on 2 ranks prints its schedule and logs one process's losses, norms and validation losses"
else notok "recipes/gpt2.lua --pp=2 on 2 ranks prints its schedule and logs one process's losses, norms and validation losses" "$out
$(paste <(losses pp-two-$$) <(losses pp-one-$$))"; fi
# checkpointed at steps 2 and 4, then resumed from step 2 as another run: its steps 3 and 4 are the
# uninterrupted run's, every digit metrics.jsonl holds
out=$(timeout 90 $MPIRUN -np 2 ./lutra $ptiny --pp=2 --ckpt_every=2 --name=pp-resume-$$ 2>&1 \
      && timeout 90 $MPIRUN -np 2 ./lutra $ptiny --pp=2 --resume="runs/pp-resume-$$/ckpt/step_00000002" \
           --name=pp-resumed-$$ 2>&1)
if echo "$out" | grep -q 'resuming from runs/pp-resume-.*step_00000002' \
   && [ "$(losses pp-resumed-$$ steps | grep -E '^[34] ')" = "$(losses pp-resume-$$ steps | grep -E '^[34] ')" ] \
   && [ -n "$(losses pp-resumed-$$ steps | grep -E '^4 ')" ]; then
  ok "recipes/gpt2.lua --pp=2 resumed from a checkpoint logs the uninterrupted run's steps bitwise"
else notok "recipes/gpt2.lua --pp=2 resumed from a checkpoint logs the uninterrupted run's steps bitwise" "$out
$(paste <(losses pp-resumed-$$ steps) <(losses pp-resume-$$ steps))"; fi
out=$(timeout 60 $MPIRUN -np 2 ./lutra $ptiny --steps=6 --resume=auto --name=pp-resume-$$ 2>&1)
if echo "$out" | grep -q "layout is dp 1 x tp 1 x pp 2 (blocks 1+1; 2 ranks), ZeRO 0, this job.s dp 2 x tp 1"; then ok "a pp=2 checkpoint's resume as dp=2 is refused naming the layouts"
else notok "a pp=2 checkpoint's resume as dp=2 is refused naming the layouts" "$out"; fi
# (through tests/dist/jobs/recipe_schedule.lua, which prints the schedule each rank's executor is
# built for: the schedules train the same numbers, so only that shows --schedule_pp reaching it)
out=$(timeout 90 $MPIRUN -np 4 ./lutra tests/dist/jobs/recipe_schedule.lua ${ptiny#recipes/gpt2.lua } --tp=2 --pp=2 --sp \
      --schedule_pp=gpipe --name=pp-four-$$ 2>&1)
if echo "$out" | grep -q 'tensor parallel over 2 ranks (sequence parallel), pipeline parallel over 2 stages (gpipe' \
   && [ "$(echo "$out" | grep -c '^executor: schedule gpipe$')" -eq 4 ] && ! echo "$out" | grep -q '^executor: schedule [^g]' \
   && echo "$out" | grep -q 'step     4/4 | loss' && same_losses pp-four-$$ pp-one-$$; then
  ok "recipes/gpt2.lua --tp=2 --pp=2 --sp (GPipe) on 4 ranks runs GPipe and logs one process's losses, norms and validation losses"
else notok "recipes/gpt2.lua --tp=2 --pp=2 --sp (GPipe) on 4 ranks runs GPipe and logs one process's losses, norms and validation losses" "$out
$(paste <(losses pp-four-$$) <(losses pp-one-$$))"; fi
out=$(timeout 60 $MPIRUN -np 2 ./lutra $ptiny --pp=2 --zero=3 --steps=1 2>&1)
if echo "$out" | grep -q '^\[rank [01]\] lutra: --zero=3 with --pp is not supported: each micro-batch'; then
  ok "recipes/gpt2.lua --pp=2 --zero=3 is refused, saying why"
else notok "recipes/gpt2.lua --pp=2 --zero=3 is refused, saying why" "$out"; fi
# uneven stages and one micro-batch a step: the model line names the blocks per stage, and a note says
# the pipeline never fills
out=$(timeout 60 $MPIRUN -np 2 ./lutra $ptiny --n_layer=3 --pp=2 --pp_stages=1,2 --micro_batches=1 --steps=1 --name=pp-one-mb-$$ 2>&1)
if echo "$out" | grep -q 'pipeline parallel over 2 stages (1f1b, 1 micro-batch), blocks 1+2 per stage' \
   && echo "$out" | grep -q '^note: --pp=2 with 1 micro-batch a step: each stage idles 0.50 of a step' \
   && echo "$out" | grep -q 'step     1/1 | loss'; then
  ok "recipes/gpt2.lua --pp=2 --pp_stages=1,2 with one micro-batch names its stages' blocks and notes the idle pipeline"
else notok "recipes/gpt2.lua --pp=2 --pp_stages=1,2 with one micro-batch names its stages' blocks and notes the idle pipeline" "$out"; fi
out=$(timeout 60 $MPIRUN -np 2 ./lutra $ptiny --pp=2 --schedule_pp=interleaved --micro_batches=2 --steps=1 --name=pp-one-mb-$$ 2>&1)
if echo "$out" | grep -q '^note: --schedule_pp=interleaved with --virtual_stages=1 (one chunk a rank) runs 1F1B.s order' \
   && echo "$out" | grep -q 'step     1/1 | loss'; then
  ok "recipes/gpt2.lua --schedule_pp=interleaved without --virtual_stages notes that it runs 1F1B's order"
else notok "recipes/gpt2.lua --schedule_pp=interleaved without --virtual_stages notes that it runs 1F1B's order" "$out"; fi
# 3D on 8 ranks: dp=2 x tp=2 x pp=2 with ZeRO 1, 2 micro-batches a data-parallel rank: the one
# process's 4 micro-batches of a step (its validation loss is rank 0's batches': steps only)
out=$(timeout 120 $MPIRUN -np 8 ./lutra $ptiny --tp=2 --pp=2 --zero=1 --micro_batches=2 --name=pp-eight-$$ 2>&1)
if echo "$out" | grep -q 'tensor parallel over 2 ranks, pipeline parallel over 2 stages (1f1b, 2 micro-batches), blocks 1+1 per stage, data parallel over 2 ranks, ZeRO stage 1' \
   && echo "$out" | grep -q 'step     4/4 | loss' && same_losses pp-eight-$$ pp-one-$$ steps; then
  ok "recipes/gpt2.lua --tp=2 --pp=2 --zero=1 (dp=2 x tp=2 x pp=2) on 8 ranks logs one process's losses and norms"
else notok "recipes/gpt2.lua --tp=2 --pp=2 --zero=1 (dp=2 x tp=2 x pp=2) on 8 ranks logs one process's losses and norms" "$out
$(paste <(losses pp-eight-$$ steps) <(losses pp-one-$$ steps))"; fi
rm -rf "runs/pp-one-$$" "runs/pp-one-mb-$$" "runs/pp-two-$$" "runs/pp-four-$$" "runs/pp-eight-$$" "runs/pp-resume-$$" "runs/pp-resumed-$$" "$dir"

# job NAME PATTERN MAX_SECONDS DESCRIPTION [RANKS [ARGS]]: a job (2 ranks
# unless RANKS; the script's arguments ARGS) that must end with a non-zero
# status within MAX_SECONDS, its output matching PATTERN
job() {
  local start took rc out
  start=$(date +%s)
  # shellcheck disable=SC2086 # (ARGS: words)
  out=$(timeout 60 $MPIRUN -np "${5:-2}" ./lutra "tests/dist/jobs/$1.lua" ${6:-} 2>&1); rc=$?
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

# a pipeline stage's rank that dies during step 2 (tests/dist/jobs/pp_rank_dies.lua;
# pp = the ranks): an error in its stage's forward or backward ends the job
# naming it, also caught and raised again after a full collection (the
# receives it had posted ahead are not collected: collecting one waits for
# it); SIGKILL (no handler runs) ends it too, mpirun naming the rank
for np in 2 4; do
  last=$((np - 1))
  for r in $(seq 1 $last); do
    [ "$np" -eq 4 ] && [ "$r" -eq 1 ] && continue # (pp=4: the middle rank 2 and the last)
    where="the last stage's"
    [ "$r" -lt "$last" ] && where="a middle stage's"
    for at in fwd bwd; do
      part=forward
      [ $at = bwd ] && part=backward
      job pp_rank_dies "^\[rank $r\] lutra: .*a deliberate failure on rank $r in its stage's $part" 30 \
        "pp=$np: an error in $where $part (rank $r, step 2) ends the job naming the rank" "$np" "--how=error --at=$at --rank=$r"
      job pp_rank_dies "^\[rank $r\] lutra: .*a deliberate failure on rank $r in its stage's $part" 30 \
        "pp=$np: rank $r's error in its $part caught, the garbage collected and raised again (as lt.train) ends the job" "$np" \
        "--how=error --at=$at --rank=$r --catch"
      job pp_rank_dies "process rank $r with PID .* exited on signal 9" 30 \
        "pp=$np: $where rank $r killed (SIGKILL) in its $part ends the job" "$np" "--how=kill --at=$at --rank=$r"
    done
  done
done

# a signal to one rank of a pipeline trained by lt.train (tests/dist/jobs/pp_signal.lua, pp = the ranks):
# SIGINT ends the job within seconds naming the rank (the others waited for it until the watchdog);
# SIGTERM stops every rank after the same step, the checkpoint of that step saved, status 0
for np in 2 4; do
  job pp_signal "^\[rank 1\] lutra: train: interrupted (SIGINT) on rank 1 during step 3: the job's other ranks" 15 \
    "pp=$np: SIGINT to rank 1 of lt.train's pipeline ends the job naming the rank" "$np" "--sig=INT"
  dir=$(mktemp -d /tmp/lutra-dist-ppsig.XXXXXX)
  out=$(timeout 60 $MPIRUN -np "$np" ./lutra tests/dist/jobs/pp_signal.lua --sig=TERM --dir="$dir" 2>&1); rc=$?
  if [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c '^rank [0-9]* stopped after step 3, preempted SIGTERM$')" -eq "$np" ] \
     && [ -f "$dir/pp-signal/ckpt/step_00000003/state.json" ] && [ ! -e "$dir/pp-signal/ckpt/step_00000004" ]; then
    ok "pp=$np: SIGTERM to rank 1 of lt.train's pipeline stops every rank after step 3 and saves it"
  else notok "pp=$np: SIGTERM to rank 1 of lt.train's pipeline stops every rank after step 3 and saves it (status $rc)" "$out"; fi
  rm -rf "$dir"
done

# a pipeline rank killed (SIGKILL) while writing its part of the step-4 checkpoint
# (tests/dist/jobs/pp_kill_save.lua): no half-written checkpoint is taken; resume = "auto"
# continues from step 2 and logs the never-killed run's steps 3 to 6 bitwise (also with dropout:
# the stages' masks come from the default generator, the same on every rank after each step)
for spec in "2 1 0" "4 2 0" "2 1 0.2"; do
  set -- $spec
  dir=$(mktemp -d /tmp/lutra-dist-ppkill.XXXXXX)
  whole=$(timeout 60 $MPIRUN -np "$1" ./lutra tests/dist/jobs/pp_kill_save.lua --dir="$dir/whole" --dropout="$3" 2>&1 | grep '^step ')
  killed=$(timeout 60 $MPIRUN -np "$1" ./lutra tests/dist/jobs/pp_kill_save.lua --dir="$dir/run" --kill=4 --rank="$2" \
    --dropout="$3" 2>&1); rc=$?
  left=$(LC_ALL=C ls -A "$dir/run/pp-kill-save/ckpt" | tr '\n' ' ') # (step 2, latest and the killed save's hidden .tmp-step_00000004-*)
  out=$(timeout 60 $MPIRUN -np "$1" ./lutra tests/dist/jobs/pp_kill_save.lua --dir="$dir/run" --resume --dropout="$3" 2>&1)
  if [ $rc -ne 0 ] && echo "$killed" | grep -q "exited on signal 9" && echo "$left" | grep -q '^\.tmp-step_00000004-[0-9]* latest step_00000002 $' \
     && echo "$out" | grep -q "^resumed from .*/step_00000002$" \
     && [ "$(echo "$out" | grep '^step ')" = "$(echo "$whole" | grep -E '^step [3-6] ')" ] \
     && [ "$(echo "$whole" | grep -c '^step ')" -eq 6 ]; then
    ok "pp=$1, dropout $3: rank $2 killed writing the step-4 checkpoint: resume = auto takes step 2 and repeats steps 3-6 bitwise"
  else notok "pp=$1, dropout $3: rank $2 killed writing the step-4 checkpoint: resume = auto takes step 2 and repeats steps 3-6 bitwise" \
    "$left
$killed
$out"; fi
  rm -rf "$dir"
done

# the planner's predictions against the layouts run for real, each in a fresh job
pg="--model=flags --n_layer=4 --n_embd=64 --n_head=4 --seq=32 --vocab_size=1001"
pl="--model=flags --family=llama --n_layer=4 --n_embd=96 --n_head=4 --n_kv_head=2 --ffn=256 --seq=48 --vocab_size=2003"
pbig="--model=flags --n_layer=4 --n_embd=256 --n_head=4 --seq=128 --micro_batch=4"
while read -r np layout; do
  for model in "$pg" "$pl"; do
    [ "$np" = 1 ] && [ -n "$layout" ] && [ "$model" = "$pl" ] && model="$pbig" # (one process, recompute: the larger GPT-2 too)
    launch="timeout 120 $MPIRUN -np $np"
    [ "$np" = 1 ] && launch="timeout 120"
    out=$($launch ./lutra recipes/plan.lua --micro_batch=2 $model --gpu=cpu --dtype=f32 --measure --check=0.1 \
          --gpus="$np" $layout 2>&1 </dev/null); rc=$? # (stdin: not the layouts below)
    what="recipes/plan.lua --measure on $np rank(s), $(echo "$model" | grep -q llama && echo Llama || echo GPT-2)$( \
      echo "$model" | grep -q n_embd=256 && echo ' (256 wide)') ${layout:-(no options)}"
    if [ $rc -eq 0 ] && echo "$out" | grep -q '^plan check: ok' && ! echo "$out" | grep -q 'FAILED'; then
      ok "$what: state bytes exact, peaks within 10%"
    else notok "$what: state bytes exact, peaks within 10%" "$out"; fi
  done
done <<'LAYOUTS'
1
1 --recompute=full
1 --recompute=selective
2
2 --zero=1
2 --zero=2
2 --zero=3
2 --zero=1 --recompute=full
2 --tp=2
2 --tp=2 --sp --recompute=selective
2 --pp=2 --micro_batches=4
2 --pp=2 --micro_batches=2 --schedule_pp=gpipe
4 --zero=3
4 --zero=2 --recompute=full
4 --tp=2 --zero=1
4 --tp=2 --pp=2 --sp --micro_batches=4
4 --pp=2 --zero=1 --micro_batches=4
4 --pp=2 --virtual_stages=2 --micro_batches=4
LAYOUTS

echo "dist: $passed passed, $failed failed"
