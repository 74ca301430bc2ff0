# Makefile: builds ./lutra (LuaJIT host + C/CUDA core), its C tests, and runs
# the test suites and benchmarks.
#
#   make            build ./lutra (prints what it found)
#   make test       C tests, Lua specs, CLI/REPL tests, distributed and GPU checks
#   make demo       install dependencies, build, run the main job (keeps its last checkpoint in runs/demo)
#   make deps       install the Debian packages (sudo when not root)
#   make ref        regenerate tests/ref fixtures with PyTorch (/usr/bin/python3)
#   make data       the Python docs as token shards in data/pydocs
#   make check-tokenizer  every Python-docs file through lutra and tiktoken
#   make bench      print the benchmark tables
#   make asan       the C tests and Lua specs under AddressSanitizer and UBSan
#   make fuzz       libFuzzer on the safetensors, shard and vocabulary readers (FUZZ_SECONDS=60)
#   make emu        lutra on the CUDA emulator (build-emu/lutra: GPU checks on the CPU)
#   make emu-asan   the GPU checks on the emulator under AddressSanitizer and UBSan
#   make emu-tsan   the GPU checks on the emulator under ThreadSanitizer (races between threads and blocks)
#
# Options: CUDA=0 / MPI=0 build without them (default: used when found);
# SYSROOT=<dir> takes LuaJIT, OpenBLAS, libedit and cJSON from Debian
# packages unpacked there (tools/fetch-gpu-debs). Building with other options
# than the last build rebuilds everything (build/config.hash).

CC ?= cc
PKG_CONFIG ?= pkg-config
MPI_PKG_CONFIG := $(PKG_CONFIG)
CUDA_HOME ?= /usr/local/cuda
BUILD ?= build
OPT ?= -O2

ifneq ($(SYSROOT),)
  # (make 4.3 passes no exported variable to $(shell), hence the prefix)
  PKG_CONFIG := PKG_CONFIG_SYSROOT_DIR=$(SYSROOT) PKG_CONFIG_PATH=$(SYSROOT)/usr/lib/x86_64-linux-gnu/pkgconfig:$(SYSROOT)/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig:$(SYSROOT)/usr/share/pkgconfig $(PKG_CONFIG)
  # pkg-config drops flags naming system dirs (/usr/include, /usr/lib/...),
  # which under a sysroot are exactly the ones needed
  SYSROOT_CFLAGS := -I$(SYSROOT)/usr/include
  SYSROOT_LIBS := -L$(SYSROOT)/usr/lib/x86_64-linux-gnu -L$(SYSROOT)/lib/x86_64-linux-gnu \
                  -Wl,-rpath-link,$(SYSROOT)/usr/lib/x86_64-linux-gnu -Wl,-rpath-link,$(SYSROOT)/lib/x86_64-linux-gnu
endif

PKGS := luajit openblas libedit libcjson libpcre2-8 libmd
MISSING := $(strip $(foreach p,$(PKGS),$(if $(shell $(PKG_CONFIG) --exists $(p) && echo y),,$(p))))
ifneq ($(MISSING),)
  # (make demo installs them itself: its deps step runs before the sub-make that builds)
  ifeq ($(filter deps clean demo,$(MAKECMDGOALS)),)
    $(error missing packages: $(MISSING); run 'make deps' (Debian) first)
  endif
endif
PKG_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null) $(SYSROOT_CFLAGS)
PKG_LIBS := $(SYSROOT_LIBS) $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null)

# CUDA: compiled in when nvcc is present, unless CUDA=0.
ifeq ($(CUDA),)
  CUDA := $(if $(wildcard $(CUDA_HOME)/bin/nvcc),1,0)
endif
# EMU=1: the CUDA backend on the CUDA emulator (tests/emu/README.md): the
# kernels compiled for the CPU, the emulator's runtime and cuBLASLt linked in
# place of CUDA's; needs only CUDA's headers. `make emu` builds build-emu/lutra.
ifeq ($(EMU),1)
  override CUDA := $(if $(wildcard $(CUDA_HOME)/include/cuda_runtime.h),1,0)
  ifeq ($(CUDA),0)
    $(error EMU=1: the CUDA emulator needs CUDA's headers in $(CUDA_HOME)/include)
  endif
endif
ifeq ($(CUDA),1)
  CUDA_CFLAGS := -DLT_WITH_CUDA -I$(CUDA_HOME)/include -DLT_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -lstdc++ -lrt -ldl -lpthread
  CUDA_SRC := $(wildcard kernels/cuda/*.cu)
  NVCC := $(CUDA_HOME)/bin/nvcc
  # sm_90 (Hopper) machine code and compute_90 PTX for newer GPUs
  NVCC_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
  NVCC_FLAGS := -O3 -std=c++17 -Ihost $(NVCC_ARCH) -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter,-funwind-tables
  CUDA_FOUND := $(CUDA_HOME) ($(shell $(CUDA_HOME)/bin/nvcc --version 2>/dev/null | grep -o 'release [0-9.]*'))
else
  CUDA_FOUND := no (CUDA=0)
endif
ifeq ($(EMU)$(CUDA),11)
  # (no source of the product is compiled differently: the emulator's
  # objects are linked in place of CUDA's libraries, tests/emu/libraries.c in
  # place of host/cuda/libraries.c, and its kernels find tests/emu/kernels/
  # first on their include path; only the C tests are told, LT_CUDA_EMU)
  CUDA_LIBS := -lstdc++ -lrt -ldl -lpthread
  CUDA_FOUND := the CUDA emulator (headers from $(CUDA_HOME))
  # (the runtime: its scheduler and its API; what the selftests link)
  EMU_RUNTIME := $(BUILD)/tests/emu/scheduler.o $(BUILD)/tests/emu/runtime.o
  # (its cuDNN: the API, finalizing graphs, running them)
  EMU_CUDNN := $(BUILD)/tests/emu/cudnn.o $(BUILD)/tests/emu/cudnn_graph.o $(BUILD)/tests/emu/cudnn_run.o
  EMU_OBJ := $(EMU_RUNTIME) $(BUILD)/tests/emu/cublaslt.o $(EMU_CUDNN) $(BUILD)/tests/emu/nccl.o \
             $(BUILD)/tests/emu/nccl_ranks.o $(BUILD)/tests/emu/libraries.o
  EMU_REPLACES := host/cuda/libraries.c
  EMU_TEST_CFLAGS := -DLT_CUDA_EMU
  EMU_CXXFLAGS := -std=c++17 $(OPT) -g -fPIC -Ihost -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas \
                  -DLT_WITH_CUDA -I$(CUDA_HOME)/include $(PKG_CFLAGS) $(SANITIZE)
  # EMU_TSAN=1 (make emu-tsan): block threads as ThreadSanitizer contexts;
  # the emulator's own scheduler is not instrumented (its bookkeeping is
  # not the kernels' memory)
  ifeq ($(EMU_TSAN),1)
    EMU_CXXFLAGS += -DLT_EMU_TSAN=1
    $(EMU_RUNTIME): EMU_CXXFLAGS := $(filter-out $(SANITIZE),$(EMU_CXXFLAGS))
  endif
endif

# MPI: Open MPI through pkg-config (the machine's own, never a sysroot's), unless MPI=0.
ifeq ($(MPI),)
  MPI := $(if $(shell $(MPI_PKG_CONFIG) --exists ompi-c && echo y),1,0)
endif
ifeq ($(MPI),1)
  MPI_CFLAGS := $(shell $(MPI_PKG_CONFIG) --cflags ompi-c)
  MPI_LIBS := $(shell $(MPI_PKG_CONFIG) --libs ompi-c)
  MPI_FOUND := Open MPI $(shell $(MPI_PKG_CONFIG) --modversion ompi-c)
else
  MPI_FOUND := no (MPI=0)
endif

ifeq ($(filter clean deps demo,$(MAKECMDGOALS)),)
  $(info lutra build: LuaJIT $(shell $(PKG_CONFIG) --modversion luajit), OpenBLAS $(shell $(PKG_CONFIG) --modversion openblas), libedit, cJSON $(shell $(PKG_CONFIG) --modversion libcjson), PCRE2 $(shell $(PKG_CONFIG) --modversion libpcre2-8), libmd $(shell $(PKG_CONFIG) --modversion libmd); CUDA: $(CUDA_FOUND); MPI: $(MPI_FOUND))
endif

WARN := -Wall -Wextra
# (-Ihost: host files include each other by their path under host/, "core/iter.h")
CFLAGS_ALL := -std=gnu11 $(OPT) -g $(WARN) -funwind-tables -fopenmp -D_GNU_SOURCE -Ihost \
              $(PKG_CFLAGS) $(CUDA_CFLAGS) $(MPI_CFLAGS) $(SANITIZE) $(CFLAGS)
KERNEL_OPT ?= -O3
# kernels never read floating-point exception flags: this lets selects and
# clamps in loops become SIMD code (kernels/cpu/fastexp.h)
# and the kernels are built for the CPU that builds them (lutra is built where
# it runs: AVX2 and FMA double the f32 row kernels' speed); KERNEL_ARCH= makes
# a build for any CPU of the architecture
KERNEL_ARCH ?= $(shell $(CC) -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
KERNEL_FLAGS := -fno-trapping-math $(KERNEL_ARCH)
LDLIBS_ALL := $(PKG_LIBS) $(CUDA_LIBS) $(MPI_LIBS) -fopenmp -lm -ldl -lpthread $(SANITIZE) $(LDFLAGS)

# The build's settings (compilers, flags, libraries: what CUDA=0, MPI=0,
# SYSROOT or OPT change) hashed into $(BUILD)/config.hash, rewritten when they
# differ from the last build's: every object and the binary depend on it, so
# a build with other settings rebuilds them instead of keeping the old ones.
BUILD_CONFIG := $(CC) | $(CXX) | $(CFLAGS_ALL) | $(KERNEL_OPT) $(KERNEL_FLAGS) | $(NVCC) $(NVCC_FLAGS) | \
                $(EMU_CXXFLAGS) | $(LDLIBS_ALL)
CONFIG_HASH := $(firstword $(shell printf '%s' '$(subst ','\'',$(BUILD_CONFIG))' | md5sum))
CONFIG_DEP := $(BUILD)/config.hash

# host/<subsystem>/*.c (ARCHITECTURE.md): the library; host/app/ (main, REPL) goes with the bindings
# (the collectives' MPI implementation is a link-time choice: host/comm/mpi.c
# with MPI=1, host/comm/no-mpi.c, which says there is none, otherwise; and
# with EMU=1 the emulator's files replace EMU_REPLACES)
COMM_MPI_SRC := $(if $(filter 1,$(MPI)),host/comm/mpi.c,host/comm/no-mpi.c)
CORE_SRC := $(filter-out host/app/% host/comm/mpi.c host/comm/no-mpi.c $(EMU_REPLACES),$(wildcard host/*/*.c)) \
            $(COMM_MPI_SRC) $(wildcard kernels/cpu/*.c)
LUA_BIND_SRC := $(wildcard bindings/*.c) $(wildcard host/app/*.c)
LUA_FILES := $(sort $(shell find lua -name '*.lua'))

CORE_OBJ := $(CORE_SRC:%.c=$(BUILD)/%.o) $(CUDA_SRC:%.cu=$(BUILD)/%.o) $(EMU_OBJ)
BIND_OBJ := $(LUA_BIND_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/embedded.o
C_TESTS := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/test_*.c))

.PHONY: all test test-c deps demo ref bench asan fuzz emu emu-asan emu-tsan clean data check-tokenizer
all: lutra

# (checked at every make, rewritten only when the settings changed: git's GIT-CFLAGS way)
$(CONFIG_DEP): FORCE
	@mkdir -p $(@D); [ "$$(cat $@ 2>/dev/null)" = "$(CONFIG_HASH)" ] || echo $(CONFIG_HASH) > $@
.PHONY: FORCE
FORCE:

LUTRA_OUT ?= lutra
ifneq ($(LUTRA_OUT),lutra)
lutra: $(LUTRA_OUT)
endif
$(LUTRA_OUT): $(BUILD)/liblutra.a $(BIND_OBJ) $(CONFIG_DEP)
	$(CC) -o $@ $(BIND_OBJ) -Wl,--whole-archive $(BUILD)/liblutra.a -Wl,--no-whole-archive -Wl,-E $(LDLIBS_ALL)

$(BUILD)/liblutra.a: $(CORE_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/kernels/%.o: kernels/%.c $(CONFIG_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(KERNEL_OPT) $(KERNEL_FLAGS) -MMD -MP -c $< -o $@

# (the headers the .cu objects include: the kernel interface, the headers
# both devices share, the CUDA kernels' own)
CUDA_KERNEL_DEPS := kernels/cuda/common.cuh kernels/cuda/mma.cuh kernels/cuda/ptx.cuh kernels/cuda/rows.cuh \
                    kernels/cuda/cuda.h kernels/kernel.h kernels/shared/host_device.h kernels/shared/philox.h \
                    kernels/shared/scalar.h kernels/attention_rows.h host/lutra.h
ifeq ($(EMU_OBJ),)
# (ptxas's registers and shared memory per kernel kept in NAME.o.ptxas for
# tests/gpu/launch_limits.py; the compiler's other messages still shown)
$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu $(CUDA_KERNEL_DEPS) $(CONFIG_DEP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -Xptxas -v -c $< -o $@ 2> $@.ptxas; st=$$?; \
	  grep -vE '^ptxas info|^ +[0-9]+ bytes stack frame' $@.ptxas >&2; exit $$st
else
# (the emulator: launches rewritten as calls, compiled by the host C++ compiler)
# (tests/emu/kernels/: the stand-ins for kernels/cuda's headers of PTX assembly, found first)
$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu $(CUDA_KERNEL_DEPS) tests/emu/cuda_emu.h tests/emu/rewrite_launches.py \
                           $(wildcard tests/emu/kernels/*.cuh) $(CONFIG_DEP)
	@mkdir -p $(dir $@)
	python3 tests/emu/rewrite_launches.py $< $(BUILD)/kernels/cuda/$*.emu.cc
	$(CXX) $(EMU_CXXFLAGS) -Itests/emu/kernels -Ikernels/cuda -include tests/emu/cuda_emu.h \
	  -c $(BUILD)/kernels/cuda/$*.emu.cc -o $@

$(BUILD)/tests/emu/%.o: tests/emu/%.cc tests/emu/cuda_emu.h tests/emu/emu_queue.h tests/emu/emu_runtime.h \
                        tests/emu/cudnn_emu.h tests/emu/nccl_emu.h $(CONFIG_DEP)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

# the emulator's own test: kernels that break the rules it checks
$(BUILD)/tests/emu/selftest: tests/emu/selftest.cu $(EMU_RUNTIME) tests/emu/cuda_emu.h tests/emu/rewrite_launches.py
	python3 tests/emu/rewrite_launches.py $< $@.emu.cc
	$(CXX) $(EMU_CXXFLAGS) -include tests/emu/cuda_emu.h -o $@ $@.emu.cc $(EMU_RUNTIME) -lpthread
# and of its cuDNN: graphs computed as documented, mistakes refused
$(BUILD)/tests/emu/cudnn_selftest: tests/emu/cudnn_selftest.cc $(EMU_RUNTIME) $(EMU_CUDNN)
	$(CXX) $(EMU_CXXFLAGS) -o $@ $< $(EMU_RUNTIME) $(EMU_CUDNN) $(PKG_LIBS) -lpthread
# and of its NCCL of several ranks (forked processes)
$(BUILD)/tests/emu/nccl_selftest: tests/emu/nccl_selftest.cc $(EMU_RUNTIME) $(BUILD)/tests/emu/nccl.o \
                                  $(BUILD)/tests/emu/nccl_ranks.o
	$(CXX) $(EMU_CXXFLAGS) -o $@ $< $(EMU_RUNTIME) $(BUILD)/tests/emu/nccl.o $(BUILD)/tests/emu/nccl_ranks.o -lrt -lpthread
endif

$(BUILD)/%.o: %.c $(CONFIG_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

$(BUILD)/tools/embed: tools/embed.c
	@mkdir -p $(dir $@)
	$(CC) -O1 $(WARN) -o $@ $<

$(BUILD)/gen/embedded.c: $(BUILD)/tools/embed host/lutra.h $(LUA_FILES)
	@mkdir -p $(dir $@)
	$(BUILD)/tools/embed $@ host/lutra.h lua $(LUA_FILES)

$(BUILD)/gen/embedded.o: $(BUILD)/gen/embedded.c
	$(CC) -O0 -c $< -o $@

$(BUILD)/tests/%: tests/c/%.c tests/c/check.h $(BUILD)/liblutra.a $(CONFIG_DEP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(EMU_TEST_CFLAGS) -Ihost -Ikernels/cpu -o $@ $< $(BUILD)/liblutra.a $(LDLIBS_ALL)

test-c: $(C_TESTS)

# make test builds the CUDA emulator where it can (CUDA's runtime, cuBLASLt
# and NCCL headers, python3, x86-64, CUDA not turned off): tests/run.sh runs
# the GPU checks on it when there is no GPU. EMU_FOR_TEST= leaves it out.
EMU_HEADERS := $(foreach h,cuda_runtime.h cublasLt.h nccl.h,$(wildcard $(CUDA_HOME)/include/$(h)))
EMU_FOR_TEST ?= $(if $(and $(filter 3,$(words $(EMU_HEADERS))),$(filter x86_64,$(shell uname -m)),$(filter-out 0,$(CUDA)),$(shell command -v python3)),emu)
test: lutra test-c data/gpt2.tiktoken $(EMU_FOR_TEST)
	@tests/run.sh

# GPT-2's vocabulary, from a registry package (tools/fetch-vocab); never at run time
data/gpt2.tiktoken:
	tools/fetch-vocab

# The Python documentation as token shards (Debian's python3.11-doc); rerun
# when lutra or the vocabulary is newer, --overwrite replacing the old shards
data/pydocs/train_000000.bin: lutra data/gpt2.tiktoken
	./lutra recipes/prepare.lua --input=/usr/share/doc/python3.11/html/_sources --out=data/pydocs --overwrite

data: data/pydocs/train_000000.bin

# The whole corpus against tiktoken (PyPI; installed under data/pylib)
check-tokenizer: lutra data/gpt2.tiktoken
	tools/check-tokenizer

deps:
	@tools/install-deps

# the main job as runs/demo, started afresh (the previous demo's run goes),
# keeping its last checkpoint (runs/demo/ckpt) to sample from or export
DEMO_STEPS ?= 1500
demo: deps
	$(MAKE) -j$$(nproc) lutra
	$(MAKE) data
	rm -rf runs/demo
	./lutra recipes/gpt2.lua --name=demo --steps=$(DEMO_STEPS) --ckpt_every=$(DEMO_STEPS) --keep_last=1
	@echo "make demo: the model is in runs/demo/ckpt; ./lutra recipes/sample.lua --ckpt=runs/demo/ckpt samples from it"

ref:
	/usr/bin/python3 tests/ref/gen_ops.py tests/ref/ops.json
	/usr/bin/python3 tests/ref/gen_nn.py tests/ref/nn.json
	/usr/bin/python3 tests/ref/gen_models.py tests/ref
	/usr/bin/python3 tests/ref/gen_safetensors.py tests/ref
	/usr/bin/python3 tests/ref/gen_optim.py tests/ref/optim.json
	/usr/bin/python3 tests/ref/gen_hf.py write tests/ref/hf
	/usr/bin/python3 tests/ref/gen_tp.py tests/ref/tp_ce.json

bench: lutra data/gpt2.tiktoken
	./lutra bench/ops.lua
	./lutra bench/model_cpu.lua
	./lutra bench/tokenizer.lua
	./lutra bench/loader.lua
	./lutra bench/train_cpu.lua

# The C tests and the Lua specs on a lutra built with AddressSanitizer and
# UBSan; the caching allocator is off so every use after free is caught.
ASAN_ENV := LUTRA_CPU_CACHE_MB=0 ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
            UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
asan:
	$(MAKE) BUILD=build-asan SANITIZE=-fsanitize=address,undefined,float-cast-overflow OPT=-O1 KERNEL_OPT=-O1 \
	  LUTRA_OUT=build-asan/lutra build-asan/lutra $(C_TESTS:$(BUILD)/%=build-asan/%)
	@for t in build-asan/tests/test_*; do $(ASAN_ENV) $$t || exit 1; done
	@$(ASAN_ENV) build-asan/lutra tests/lua/run.lua -o TAP tests/lua > build-asan/specs.tap 2>&1; \
	  echo "Lua specs under ASan: $$(grep -c '^ok ' build-asan/specs.tap) passed, $$(grep -c '^not ok ' build-asan/specs.tap) failed"; \
	  ! grep -A5 '^not ok ' build-asan/specs.tap && grep -q '^1\.\.[0-9]' build-asan/specs.tap || \
	  { tail -30 build-asan/specs.tap; exit 1; }

# lutra on the CUDA emulator (tests/emu/README.md): its GPU checks run on the
# CPU (tests/run.sh runs them when build-emu/lutra exists)
emu:
	$(MAKE) -j$$(nproc) BUILD=build-emu EMU=1 LUTRA_OUT=build-emu/lutra build-emu/lutra build-emu/tests/emu/selftest \
	  build-emu/tests/emu/cudnn_selftest build-emu/tests/emu/nccl_selftest

# the GPU checks on the CUDA emulator under AddressSanitizer and UBSan: a
# kernel that reads or writes past its tensors (or a freed one) is caught
emu-asan:
	$(MAKE) -j$$(nproc) BUILD=build-emu-asan EMU=1 SANITIZE=-fsanitize=address,undefined OPT=-O1 KERNEL_OPT=-O1 \
	  LUTRA_OUT=build-emu-asan/lutra build-emu-asan/lutra
	$(ASAN_ENV) build-emu-asan/lutra tests/gpu/checks.lua

# the GPU checks on the CUDA emulator under ThreadSanitizer: two threads of
# a block, two blocks, two streams, or a stream and the host, touching the
# same memory with nothing ordering them (a __syncthreads, the kernel's
# end, an event, a wait) are reported, which
# the emulator's one-thread-at-a-time run cannot show otherwise. About
# twenty times slower than the plain emulator, so by default it runs the
# checks that reach every kind of kernel, the pinned and deferred paths and
# the communication stream at small sizes (about 6 minutes on 2 cores);
# EMU_TSAN_CHECKS= (empty) runs them all (hours), or name others.
EMU_TSAN_CHECKS ?= "every ops.json" "every nn.json" "every optim.json" "gather and reductions" "bad indices" \
  "embedding with repeated" "small uploads" "collectives on CUDA" "cross_entropy without" "grouped-query" \
  "odd head size" "narrowed logits" "layer_norm of no rows" "DataParallel" "heads read where they are" \
  "scatter_add_ with repeated" "head size 128, grouped-query"
emu-tsan:
	$(MAKE) -j$$(nproc) BUILD=build-emu-tsan EMU=1 EMU_TSAN=1 SANITIZE=-fsanitize=thread OPT=-O1 KERNEL_OPT=-O1 \
	  LUTRA_OUT=build-emu-tsan/lutra build-emu-tsan/lutra build-emu-tsan/tests/emu/selftest
	TSAN_OPTIONS=halt_on_error=0:exitcode=0 build-emu-tsan/tests/emu/selftest > build-emu-tsan/selftest.log 2>&1 || \
	  { grep -A3 "not ok" build-emu-tsan/selftest.log; exit 1; }
	@echo "CUDA emulator selftest under ThreadSanitizer: $$(tail -1 build-emu-tsan/selftest.log)"
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  build-emu-tsan/lutra tests/gpu/checks.lua $(EMU_TSAN_CHECKS)

# libFuzzer (clang, AddressSanitizer) on the file parsers: safetensors, shard
# headers, vocabularies; FUZZ_SECONDS per harness (60 by default).
FUZZ_SECONDS ?= 60
FUZZERS := safetensors shard vocab
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang SANITIZE="-fsanitize=address,fuzzer-no-link" OPT=-O1 KERNEL_OPT=-O1 \
	  build-fuzz/liblutra.a
	@for f in $(FUZZERS); do \
	  clang -O1 -g -fsanitize=address,fuzzer -Ihost -o build-fuzz/$${f}_fuzz tests/fuzz/$${f}_fuzz.c \
	    build-fuzz/liblutra.a $(LDLIBS_ALL) || exit 1; \
	  mkdir -p build-fuzz/corpus-$$f; \
	  seeds=tests/fuzz/corpus-$$f; [ $$f = safetensors ] && seeds=tests/fuzz/corpus; \
	  build-fuzz/$${f}_fuzz -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus-$$f $$seeds || exit 1; \
	done

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-emu build-emu-asan build-emu-tsan lutra

-include $(CORE_OBJ:.o=.d) $(BIND_OBJ:.o=.d)
