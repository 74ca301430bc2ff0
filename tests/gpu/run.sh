#!/usr/bin/env bash
# tests/gpu/run.sh: the one script for the accelerator machine. Unpacks the
# Debian packages carried in .deps (LuaJIT, OpenBLAS, libedit, cJSON,
# pkgconf, busted; see ../shared/device/README.md) into a sysroot when the
# machine lacks them, builds lutra with CUDA, runs `make test` (which
# includes tests/gpu/checks.lua) and the benchmark, and writes the whole log
# to $OUT/gpu-run.log. Meant to finish well under 8 minutes.
#
#   (on the device) bash tests/gpu/run.sh
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lutra-gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-run.log") 2>&1
start=$(date +%s)
step() { echo; echo "=== $* ($(($(date +%s) - start)) s)"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
nproc

make_args=(MPI=0) # collectives are a later issue; the device's MPI is not needed yet
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

step "vocabulary and data"
tools/fetch-vocab 2>&1 | tail -2 || echo "(no vocabulary: tokenizer specs will fail)"

step "tests"
make "${make_args[@]}" test
test_status=$?

step "GPU checks alone"
./lutra tests/gpu/checks.lua

step "benchmark"
make "${make_args[@]}" bench

step "done: tests exit status $test_status"
exit $test_status
