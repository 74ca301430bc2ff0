#!/usr/bin/env bash
# tests/gpu/run.sh: the one script for the accelerator machine. Unpacks the
# Debian packages carried in .deps (LuaJIT, OpenBLAS, libedit, cJSON,
# pkgconf, busted, PCRE2: tools/fetch-gpu-debs downloads them beforehand and
# checks they hold all the build takes) into
# a sysroot when the machine lacks them, builds lutra with CUDA, runs the GPU checks,
# the GPT-2 benchmark, a per-kernel profile of one of its steps
# (lt.cuda.profile_start), PyTorch's benchmark (when the machine has a CUDA
# torch), the ops benchmark, an nsys kernel summary, random shapes of the
# tensor-core attention against the CPU, the other attention paths
# (profiled too), a short run of the main job (and every test suite with
# LUTRA_GPU_FULL=1), and writes the whole log to $OUT/gpu-run.log. Each step
# has a time limit and runs only while a budget of 450 s allows: the whole
# stays under 8 minutes.
#
#   (here, once) tools/fetch-gpu-debs; make data
#   (on the device, carrying .deps, data/gpt2.tiktoken and data/pydocs) bash tests/gpu/run.sh
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lutra-gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-run.log") 2>&1
start=$(date +%s)
step() { echo; echo "=== $* ($(($(date +%s) - start)) s)"; }

step "machine"
if ! nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null | head -3; then
  echo "no NVIDIA GPU here (nvidia-smi finds none): this script is for a machine with one; nothing ran"
  echo "(without a GPU, make test runs the GPU checks on the CUDA emulator)"
  exit 1
fi
nproc

# one process on the device: NCCL needs no MPI for one rank (the GPU checks use it); the
# CUDA emulator is for machines without a GPU (EMU_FOR_TEST= keeps make test from building it)
make_args=(MPI=0 EMU_FOR_TEST=)
if ! pkg-config --exists luajit 2>/dev/null && [ -d .deps ]; then
  step "unpacking .deps into /tmp/sysroot"
  SYSROOT=/tmp/sysroot
  mkdir -p $SYSROOT
  for f in .deps/*.deb; do dpkg -x "$f" $SYSROOT; done
  export LD_LIBRARY_PATH=$SYSROOT/usr/lib/x86_64-linux-gnu:$SYSROOT/usr/lib/x86_64-linux-gnu/openblas-pthread:$SYSROOT/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  export PATH=$SYSROOT/usr/bin:$PATH
  export LUA_PATH="$SYSROOT/usr/share/lua/5.1/?.lua;$SYSROOT/usr/share/lua/5.1/?/init.lua;;"
  export LUA_CPATH="$SYSROOT/usr/lib/x86_64-linux-gnu/lua/5.1/?.so;;"
  command -v pkg-config >/dev/null || export PKG_CONFIG=$SYSROOT/usr/bin/pkgconf
  make_args+=("SYSROOT=$SYSROOT")
fi

step "build"
make -j"$(nproc)" "${make_args[@]}" lutra || { echo "BUILD FAILED"; exit 1; }
./lutra --version

step "cuDNN's description of this GPU (what tests/ref/cudnn-device-h200.json stands in for)"
timeout 30 ./lutra -e 'io.write(require("lutra").cuda.cudnn_device_properties())' >"$OUT/cudnn-device.json" &&
  head -c 600 "$OUT/cudnn-device.json"; echo

step "vocabulary"
tools/fetch-vocab 2>&1 | tail -2 || echo "(no vocabulary: tokenizer specs will fail)"

# The steps after the build, most telling first; each runs only while the
# budget (LUTRA_GPU_BUDGET seconds from the start, 450 by default: the whole
# stays under 8 minutes) leaves it its time limit.
budget=${LUTRA_GPU_BUDGET:-450}
fits() { [ $(($(date +%s) - start + $1)) -le "$budget" ] || { echo "(skipped: ${1} s would pass the ${budget} s budget)"; false; }; }
gpu_status=1
test_status=0

step "smoke test of the newest paths (cuDNN attention, cuBLASLt epilogues, bf16 rows, deferred index checks)"
if fits 60 && ! timeout 30 ./lutra tests/gpu/smoke.lua 2>&1 | tee "$OUT/smoke.txt"; then
  echo "--- again with cuDNN's and cuBLASLt's logs (errors and warnings) ---"
  CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr CUBLASLT_LOG_LEVEL=2 timeout 30 ./lutra tests/gpu/smoke.lua 2>&1 |
    tail -120
fi

step "GPU checks (CUDA against PyTorch fixtures and the CPU)"
if fits 200; then # (cuDNN may compile its attention kernels at the first plan of each shape: seconds)
  timeout 200 ./lutra tests/gpu/checks.lua 2>&1 | tee "$OUT/checks.txt"
  gpu_status=$?
fi

step "benchmark: GPT-2 124M on the GPU (lutra: cuDNN attention, fused AdamW)"
fits 100 && timeout 100 ./lutra bench/gpt2_gpu.lua --steps=6 --batches=auto --dtypes=bf16 | tee "$OUT/bench-lutra.txt"

step "profile: where a GPT-2 step's time goes (lutra's CUDA-event profile, B=16)"
fits 40 && timeout 40 ./lutra bench/gpt2_gpu.lua --steps=2 --batches=16 --dtypes=bf16 --profile=40 \
  --rate_size=4096 2>&1 | tee "$OUT/gpt2-profile.txt"

step "benchmark: the same model in PyTorch (torch.compile, fused attention and AdamW)"
if [ "${LUTRA_BENCH_TORCH:-1}" = 0 ]; then
  echo "skipped (LUTRA_BENCH_TORCH=0)"
elif python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  if fits 120; then
    for B in 16; do
      PYTHONUNBUFFERED=1 timeout 120 python3 bench/gpt2_gpu_torch.py $B 6 1 2>&1 | tail -1 | tee -a "$OUT/bench-torch.txt"
    done
    python3 - "$OUT/bench-lutra.txt" "$OUT/bench-torch.txt" <<'PY' || true
import json, sys
lutra = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 5 and f[0] == "bf16" and f[1].isdigit():
        lutra[int(f[1])] = float(f[4])
for line in open(sys.argv[2]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r["B"] in lutra:
        print("B=%d: lutra %.0f tokens/s, torch %.0f tokens/s (%s): ratio %.2f"
              % (r["B"], lutra[r["B"]], r["tokens_per_s"], r["torch"], lutra[r["B"]] / r["tokens_per_s"]))
PY
  fi
else
  echo "no CUDA-enabled torch on this machine: the PyTorch comparison is skipped"
fi

step "benchmark: the ops of a GPT-2 step, one by one"
fits 60 && timeout 60 ./lutra bench/ops_gpu.lua --B=8 --dtype=bf16 2>&1 | tee "$OUT/bench-ops.txt"

step "benchmark: the optimizer's part of a step (AdamW; clipping that scales the gradients, or folded into the step)"
fits 30 && timeout 30 ./lutra bench/optim.lua --device=cuda --dtype=bf16 2>&1 | tee "$OUT/bench-optim.txt"

step "profile: the GPU kernels of 3 GPT-2 steps (nsys, when the machine has it)"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -z "$NSYS" ]; then
  echo "no nsys here: skipped"
elif fits 90; then
  timeout 60 "$NSYS" profile --force-overwrite=true -o "$OUT/gpt2-steps" --stats=false \
    ./lutra bench/gpt2_gpu.lua --steps=3 --batches=8 --dtypes=bf16 >/dev/null 2>&1
  timeout 30 "$NSYS" stats --report cuda_gpu_kern_sum --format csv "$OUT/gpt2-steps.nsys-rep" 2>/dev/null |
    head -40 | tee "$OUT/gpt2-kernels.csv"
fi

step "random shapes: lutra's tensor-core attention against the CPU (forward and gradients)"
if fits 40; then
  timeout 40 ./lutra tests/gpu/attention_sweep.lua 1 40 2>&1 | tee "$OUT/attention-sweep.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || gpu_status=1
fi

step "benchmark: GPT-2 124M with lutra's own attention (fused kernel, then composed), and in f32"
fits 40 && timeout 40 ./lutra bench/gpt2_gpu.lua --steps=4 --batches=8 --dtypes=bf16 --attention=fused --profile=12
fits 40 && timeout 40 ./lutra bench/gpt2_gpu.lua --steps=4 --batches=8 --dtypes=bf16 --attention=composed --profile=12
fits 40 && timeout 40 ./lutra bench/gpt2_gpu.lua --steps=4 --batches=8 --dtypes=f32

step "the main job on the GPU, short (needs data/pydocs carried or made)"
if [ ! -f data/pydocs/train_000000.bin ]; then
  echo "no data/pydocs here: skipped"
elif fits 90; then
  timeout 90 ./lutra recipes/gpt2.lua --device=cuda --dtype=bf16 --steps=200 --batch=16 --pad_vocab=128 \
    --eval_every=100 --sample_every=200 --log_every=20 --name=gpu-smoke
fi

step "all test suites (CPU specs, C tests, GPU checks): with LUTRA_GPU_FULL=1"
if [ "${LUTRA_GPU_FULL:-0}" = 1 ] && fits 150; then
  timeout 150 make "${make_args[@]}" test
  test_status=$?
fi

step "summary (the full log is $OUT/gpu-run.log)"
grep -h "^ok \|^FAIL\|^skipped" "$OUT/smoke.txt" 2>/dev/null
echo "GPU checks: $(grep -c '^ok ' "$OUT/checks.txt" 2>/dev/null) ok, $(grep -c '^not ok' "$OUT/checks.txt" 2>/dev/null) not ok"
grep -h "^not ok" "$OUT/checks.txt" 2>/dev/null | cut -c1-400
grep -h "^BAD\|cases bad" "$OUT/attention-sweep.txt" 2>/dev/null | tail -6
grep -h "^lutra: " "$OUT/gpu-run.log" 2>/dev/null | sort | uniq -c | head -10 # fallbacks noted once (cuDNN, cuBLASLt)
grep -h "attention\|dtype \|^bf16\|largest" "$OUT/bench-lutra.txt" 2>/dev/null
grep -h "ratio" "$OUT/gpu-run.log" 2>/dev/null | tail -2
grep -h "causal attention\|linear\|GELU\|MLP\|layer_norm\|cross_entropy\|head + loss" "$OUT/bench-ops.txt" 2>/dev/null | head -24

step "done: GPU checks exit $gpu_status, tests exit $test_status"
[ $gpu_status -eq 0 ] && [ $test_status -eq 0 ]
