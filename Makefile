# fusex build. `make` builds the NIF (C only) and, where nvcc is found, the
# CUDA backend the NIF loads at run time; `make test` installs what is
# missing, builds and runs every suite; see README.md for the rest.

ERL        ?= erl
REBAR3     ?= rebar3
NVCC       ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
# The CUDA headers: nvcc's, or /usr/local/cuda's where nvcc is not used
# (the CPU emulator of the kernels needs only them).
CUDA_INC   ?= $(firstword $(if $(NVCC),$(abspath $(dir $(NVCC))../include)) \
                $(patsubst %/cuda_runtime.h,%,$(wildcard /usr/local/cuda/include/cuda_runtime.h)))
# Compute capabilities to build machine code for; the last one is also
# embedded as PTX so newer GPUs can JIT it. `make CUDA_ARCH="80 90"`.
CUDA_ARCH  ?= 90

BUILD      := build
ERTS_INC   := $(shell $(ERL) -noshell -eval 'io:format("~s/erts-~s/include", [code:root_dir(), erlang:system_info(version)]), halt().' 2>/dev/null)

WARN       := -Wall -Wextra -Werror
CFLAGS     ?= -O3 -g
CFLAGS     += -std=c11 -D_GNU_SOURCE -fPIC -fopenmp $(WARN) -Iinclude -Ic_src
LDLIBS     := -fopenmp -ldl -lpthread -lm
# glibc's vector maths (x86-64): the CPU selective scan's exp loop uses it.
ifeq ($(shell uname -m),x86_64)
LDLIBS     += -lmvec
endif

CORE_SRC   := $(wildcard c_src/core/*.c) $(wildcard c_src/cpu/*.c) $(wildcard c_src/cpu/fast/*.c)
NIF_SRC    := $(wildcard c_src/nif/*.c)
# One unit per family and input type (ssm_f32.cu, linrec_bf16.cu, ...), so
# that `make -j` compiles them in parallel; the kernels live in headers
# under c_src/cuda/<family>/.
CUDA_SRC   := $(wildcard c_src/cuda/*.cu)
CTEST_SRC  := $(wildcard test/c/*.c)
# Every object records the headers it read (-MMD -MP) in a .d file beside it.
DEPFLAGS   := -MMD -MP
# What the development tools' rules below depend on.
HEADERS    := $(wildcard include/*.h c_src/*/*.h c_src/cuda/*.cuh c_src/cuda/*/*.cuh)

CORE_OBJ   := $(CORE_SRC:%.c=$(BUILD)/%.o)
# The CPU fast path's loops vectorise only where sqrtf need not set errno
# (its inputs are never negative but NaN, which sqrtf passes through) and
# where both arms of a select may be computed (no floating-point traps are
# relied on: -fno-trapping-math; NaN and Inf keep their IEEE meaning), and
# a * b + c may be one fused multiply-add (as CUDA contracts them).
$(BUILD)/c_src/cpu/fast/%.o: CFLAGS += -fno-math-errno -fno-trapping-math -ffp-contract=fast
NIF_OBJ    := $(NIF_SRC:%.c=$(BUILD)/%.o)
CUDA_OBJ   := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CTEST_OBJ  := $(CTEST_SRC:%.c=$(BUILD)/%.o)

NVCC_GENCODE := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
NVCCFLAGS  ?= -O3 -lineinfo
NVCCFLAGS  += -std=c++17 $(NVCC_GENCODE) -Iinclude -Ic_src --expt-relaxed-constexpr \
              -Xcompiler -fPIC,-fvisibility=hidden,-fopenmp,-Wall,-Wextra,-Werror -Werror all-warnings

NIF_SO     := priv/fusex_nif.so
CUDA_SO    := $(if $(NVCC),priv/fusex_cuda.so)

# The XLA custom-call targets (c_src/xla, docs/XLA.md): plain C and C++ (no
# nvcc: the CUDA handlers launch through priv/fusex_cuda.so), built against
# the XLA FFI API 0.2 headers that tools/xla_headers.sh finds
# (XLA_FFI_INCLUDE, else jaxlib 0.9.0's from PyPI). The core is linked in
# with every symbol hidden but the handlers and include/fusex_xla.h, so it
# never meets the NIF's own copy in a BEAM process.
XLA_SO     := priv/fusex_xla.so
XLA_C_SRC  := $(wildcard c_src/xla/*.c)
XLA_CC_SRC := $(wildcard c_src/xla/*.cc)
XLA_OBJ    := $(XLA_C_SRC:%.c=$(BUILD)/%.o) $(XLA_CC_SRC:%.cc=$(BUILD)/%.o)
XLA_FFI_INC ?=
XLA_HDRS   := $(XLA_FFI_INC)/xla/ffi/api/ffi.h $(XLA_FFI_INC)/xla/ffi/api/api.h $(XLA_FFI_INC)/xla/ffi/api/c_api.h
CXXFLAGS   ?= -O2 -g
XLA_CXXFLAGS := $(CXXFLAGS) -std=c++17 -fPIC -fvisibility=hidden $(WARN) -isystem $(XLA_FFI_INC) -Iinclude -Ic_src

.PHONY: all nif xla deps erl test test-c test-erl test-ex example-ex example-erl example-jax test-emu test-gpu test-ipc sanitize bench demo selftest docs docs-ex fresh-project clean \
        test-jax test-jax-gpu test-xla-c test-xla-c-gpu xla-fixtures test-asan

all: nif erl

nif: $(NIF_SO) $(CUDA_SO) xla

# Builds priv/fusex_xla.so where the headers are found; says why not
# otherwise and builds the rest (make test then fails in test-jax).
xla: $(BUILD)/libfusex_core.a
	+@$(call xla_submake,$(XLA_SO))

# A recipe line: where the headers are found, makes $(1) with them; says
# why not otherwise (and succeeds: what needs the targets fails later).
xla_submake = if inc=$$(bash tools/xla_headers.sh $(BUILD)/xla_ffi); then $(MAKE) --no-print-directory $(1) XLA_FFI_INC="$$inc"; else echo "fusex: XLA targets not built: $$inc"; fi

deps:
	@bash tools/deps.sh

erl: nif
	$(REBAR3) compile

# V=1 shows the full command lines.
Q := $(if $(V),,@)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -I$(ERTS_INC) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCCFLAGS) $(DEPFLAGS) -c $< -o $@

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

$(BUILD)/libfusex_core.a: $(CORE_OBJ)
	ar rcs $@ $^

$(NIF_SO): $(NIF_OBJ) $(BUILD)/libfusex_core.a
	@mkdir -p priv
	$(CC) -shared -o $@ $(NIF_OBJ) $(BUILD)/libfusex_core.a $(LDLIBS)

$(BUILD)/c_src/xla/%.o: c_src/xla/%.c $(XLA_HDRS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -fvisibility=hidden -isystem $(XLA_FFI_INC) -c $< -o $@

$(BUILD)/c_src/xla/%.o: c_src/xla/%.cc $(XLA_HDRS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX   $<")
	$(Q)$(CXX) $(XLA_CXXFLAGS) $(DEPFLAGS) -c $< -o $@

$(XLA_SO): $(XLA_OBJ) $(BUILD)/libfusex_core.a c_src/xla/exports.map
	@mkdir -p priv
	$(CXX) -shared -o $@ $(XLA_OBJ) $(BUILD)/libfusex_core.a -Wl,-soname,fusex_xla.so -Wl,--exclude-libs,ALL \
	  -Wl,--version-script=c_src/xla/exports.map -Wl,-z,defs $(LDLIBS)

# Test fixtures of the XLA targets (test/xla), built with the same headers:
# a stand-in libxla_extension.so and EXLA NIF for fusex_xla_SUITE, and the
# C-level handler test (ffi_call_test: Host; ffi_call_test_cuda: with the
# CUDA runtime, where nvcc is found).
XLA_TEST_DIR := $(BUILD)/test_xla
XLA_FAKE_LIB := $(XLA_TEST_DIR)/xla_extension/lib/libxla_extension.so
XLA_FIXTURES := $(XLA_FAKE_LIB) $(XLA_TEST_DIR)/fake_exla_nif.so $(XLA_TEST_DIR)/ffi_call_test
XLA_TEST_FLAGS := -std=c11 -O1 -g -fPIC $(WARN) -D_GNU_SOURCE -isystem $(XLA_FFI_INC) -Iinclude -Itest/xla
CUDA_LIB   := $(if $(NVCC),$(abspath $(dir $(NVCC))../lib64))

xla-fixtures: xla
	+@$(call xla_submake,$(XLA_FIXTURES))

$(XLA_FAKE_LIB): test/xla/fake_xla_api.c test/xla/fake_xla_api.h test/xla/fake_xla_extension.cc $(XLA_HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(XLA_TEST_FLAGS) -c test/xla/fake_xla_api.c -o $(XLA_TEST_DIR)/fake_xla_api.o
	$(CXX) -std=c++17 -O1 -fPIC -shared $(WARN) -isystem $(XLA_FFI_INC) -Itest/xla test/xla/fake_xla_extension.cc \
	  $(XLA_TEST_DIR)/fake_xla_api.o -Wl,-soname,libxla_extension.so -o $@ -lpthread

$(XLA_TEST_DIR)/fake_exla_nif.so: test/xla/fake_exla_nif.c $(XLA_FAKE_LIB)
	$(CC) $(XLA_TEST_FLAGS) -I$(ERTS_INC) -shared $< -L$(dir $(XLA_FAKE_LIB)) -lxla_extension \
	  -Wl,-rpath,'$$ORIGIN/xla_extension/lib' -o $@

XLA_CTEST_SRC := test/xla/ffi_call_test.c test/xla/fake_xla_api.c
$(XLA_TEST_DIR)/ffi_call_test: $(XLA_CTEST_SRC) test/xla/fake_xla_api.h $(HEADERS) $(XLA_SO)
	@mkdir -p $(dir $@)
	$(CC) $(XLA_TEST_FLAGS) $(XLA_CTEST_SRC) $(XLA_SO) -Wl,-rpath,$(abspath priv) -ldl -lm -lpthread -o $@

$(XLA_TEST_DIR)/ffi_call_test_cuda: $(XLA_CTEST_SRC) test/xla/fake_xla_api.h $(HEADERS) $(XLA_SO)
	@mkdir -p $(dir $@)
	$(CC) $(XLA_TEST_FLAGS) -DFX_XLA_TEST_CUDA -isystem $(CUDA_INC) $(XLA_CTEST_SRC) $(XLA_SO) \
	  -Wl,-rpath,$(abspath priv) -L$(CUDA_LIB) -lcudart_static -lrt -ldl -lm -lpthread -o $@

# Static cudart: the backend needs the driver (libcuda.so.1) at run time,
# and cuBLASLt and cuBLAS (blas.cu), found through the toolkit's library
# directory recorded as the run path (or the loader's own path).
priv/fusex_cuda.so: $(CUDA_OBJ)
	@mkdir -p priv
	$(NVCC) -shared $(NVCC_GENCODE) -cudart static -o $@ $^ -L$(CUDA_LIB) -Xlinker -rpath=$(CUDA_LIB) \
	  -lcublasLt -lcublas -lgomp

# ---- tests ----

$(BUILD)/fusex_check: $(CTEST_OBJ) $(BUILD)/libfusex_core.a
	$(CC) -o $@ $(CTEST_OBJ) $(BUILD)/libfusex_core.a -lcheck -lsubunit -lrt $(LDLIBS)

# FUSEX_PRIV tells the C tests where the CUDA backend is.
test-c: nif $(BUILD)/fusex_check
	FUSEX_PRIV=priv $(BUILD)/fusex_check

# The CUDA kernels on the CPU (test/emu; test/emu/emu.h says what is
# emulated and what is not): build/emu/fusex_cuda.so stands in for
# priv/fusex_cuda.so, made of the real launchers (every c_src/cuda/*.cu but
# the backend, pointer interop and cuBLASLt) compiled by $(CXX), the
# emulator's scheduler, backend and products, and the CPU backend's memory
# ops; then the Check
# suites run with cuda:0 as that device, every CUDA result compared with
# the CPU. Needs the CUDA headers (cuda_runtime.h, cuda_fp16.h,
# cuda_bf16.h), not a GPU or nvcc itself. FUSEX_QUICK=1 for the smaller
# sweeps; FUSEX_EMU_SEED picks the interleaving (a fresh one each run,
# printed; 0 for the fixed order).
EMU_HAVE    := $(if $(CUDA_INC),$(wildcard $(CUDA_INC)/cuda_runtime.h))
# cuBLASLt (blas.cu) has no emulation: test/emu/blas.cc stands in for it
# (the same checks and epilogue split, the product a loop).
EMU_KERNELS := $(filter-out c_src/cuda/backend.cu c_src/cuda/interop.cu c_src/cuda/blas.cu,$(CUDA_SRC))
EMU_OBJ     := $(EMU_KERNELS:%.cu=$(BUILD)/emu/%.o) $(BUILD)/emu/test/emu/emu.o $(BUILD)/emu/test/emu/backend.o \
               $(BUILD)/emu/test/emu/blas.o
# -O1: the kernels' templates take g++ half as long again at -O2 and run
# ~10 % faster. -march=native where the compiler takes it: the kernels' fmaf
# is an instruction rather than a libm call (twice as fast), and the
# emulator runs where it is built. The kernels' own warnings are nvcc's
# business: g++'s flow analysis sees uninitialised registers that every
# path writes first.
EMU_NATIVE  := $(shell $(CXX) -march=native -E -x c++ /dev/null >/dev/null 2>&1 && echo -march=native)
EMU_CXXFLAGS := -std=c++17 -O1 $(EMU_NATIVE) -g -fPIC -fvisibility=hidden $(WARN) -Wno-unknown-pragmas -MMD -MP \
                -include test/emu/emu.h -Itest/emu -isystem $(CUDA_INC) -Iinclude -Ic_src
EMU_KFLAGS  := -x c++ -fdata-sections -Wno-class-memaccess -Wno-uninitialized -Wno-maybe-uninitialized
# test/emu/cuda/launch.cuh shadows c_src/cuda/launch.cuh: -Itest/emu first.
$(BUILD)/emu/c_src/cuda/%.o: c_src/cuda/%.cu test/emu/emu.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  EMU   $<")
	$(Q)$(CXX) $(EMU_CXXFLAGS) $(EMU_KFLAGS) -c $< -o $@

$(BUILD)/emu/test/emu/%.o: test/emu/%.cc test/emu/emu.h
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  EMU   $<")
	$(Q)$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

-include $(EMU_OBJ:.o=.d)

$(BUILD)/emu/fusex_cuda.so: $(EMU_OBJ) $(BUILD)/libfusex_core.a test/emu/shared.ld
	$(CXX) -shared -o $@ $(EMU_OBJ) $(BUILD)/libfusex_core.a -Wl,--exclude-libs,ALL -Wl,--no-undefined \
	  -Wl,-T,test/emu/shared.ld $(LDLIBS)

EMU_SUITES  := ops optim linrec ssm rnn exec replay op linear norm conv model
EMU_SEED     = $${FUSEX_EMU_SEED:-$$(date +%s)}

test-emu:
ifneq ($(EMU_HAVE),)
	$(MAKE) -j$(JOBS) $(BUILD)/fusex_check $(BUILD)/emu/fusex_cuda.so
	@for suite in $(EMU_SUITES); do \
	  echo "test-emu: the $$suite suite on the emulated cuda:0"; \
	  FUSEX_PRIV=$(BUILD)/emu FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 FUSEX_EMU_SEED=$(EMU_SEED) \
	    CK_RUN_SUITE=$$suite CK_FORK=no $(BUILD)/fusex_check || exit 1; \
	done
else
	@echo "test-emu: SKIPPED: no CUDA headers (cuda_runtime.h under CUDA_INC='$(CUDA_INC)'; install the CUDA toolkit or set CUDA_INC)"
	@test "$${FUSEX_REQUIRE_EMU:-}" != 1 || { echo "test-emu: FAILED: FUSEX_REQUIRE_EMU=1" >&2; exit 1; }
endif

test-erl: all xla-fixtures
	$(REBAR3) eunit
	FUSEX_TEST_XLA_DIR=$(abspath $(XLA_TEST_DIR)) $(REBAR3) ct --readable=compact
	@$(MAKE) --no-print-directory example-erl

# examples/erlang/train_and_serve.escript: train a MinGRU model, serve it
# frame by frame (a second).
example-erl: all
	escript examples/erlang/train_and_serve.escript

# The ExUnit suite, with Nx from hex, the offline kit, or none (then the
# Nx tests are listed as skipped); see tools/test_ex.sh.
test-ex:
	@bash tools/test_ex.sh
	@$(MAKE) --no-print-directory example-ex
	@$(MAKE) --no-print-directory fresh-project

# README.md's Elixir install lines on a new Mix project (the offline kit's
# Nx and Axon), and README's Elixir examples run in it (tools/fresh_project.sh;
# about 25 s, most of it compiling Nx and Axon).
fresh-project:
	@bash tools/fresh_project.sh

# examples/elixir/train_and_serve.exs with the suites' Nx (skipped, saying
# so, without Nx).
example-ex:
	@FUSEX_EX_RUN=examples/elixir/train_and_serve.exs bash tools/test_ex.sh

# The XLA handlers called as XLA calls them, through a stand-in FFI API
# (test/xla/ffi_call_test.c): Host here; on a GPU the CUDA handlers on a
# stream of the test's own against the Host ones (also under
# compute-sanitizer, in sanitize).
test-xla-c: xla-fixtures
	@test -f $(XLA_TEST_DIR)/ffi_call_test || { echo "test-xla-c: not built (see \"fusex: XLA targets not built\" above)"; exit 1; }
	$(XLA_TEST_DIR)/ffi_call_test

test-xla-c-gpu: xla
	+@$(call xla_submake,$(XLA_TEST_DIR)/ffi_call_test_cuda)
	$(XLA_TEST_DIR)/ffi_call_test_cuda

# fusex for JAX (python/fusex_jax) on the CPU, in a venv with jax 0.9.0 made
# from PyPI when missing (tools/jax_venv.sh; it fails, saying why, where it
# cannot be made). FUSEX_SEED and FUSEX_JAX_ONLY (a substring of case names)
# in the environment pick the seed and the cases.
JAX_VENV := $(BUILD)/jax-venv
test-jax: nif
	@test -f $(XLA_SO) || { echo "test-jax: $(XLA_SO) was not built (see \"fusex: XLA targets not built\" above)"; exit 1; }
	@py=$$(bash tools/jax_venv.sh $(JAX_VENV)) && PYTHONPATH=python $$py test/python/test_fusex_jax.py
	@$(MAKE) --no-print-directory example-jax

# examples/jax/train_and_serve.py: train a MinGRU model under jax.grad,
# serve it frame by frame (a few seconds).
example-jax: nif
	@py=$$(bash tools/jax_venv.sh $(JAX_VENV)) && PYTHONPATH=python $$py examples/jax/train_and_serve.py

# The same on the GPU with the machine's own python3 and JAX (CUDA), which
# must be there: nothing is installed. Also compares with the CPU handlers.
test-jax-gpu: nif
	@test -f $(XLA_SO) || { echo "test-jax-gpu: $(XLA_SO) was not built"; exit 1; }
	FUSEX_JAX_PLATFORM=cuda PYTHONPATH=python python3 test/python/test_fusex_jax.py

# The build runs one job a core: the CUDA units (a family and an input type
# each) take most of it and compile independently.
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

test: deps
	$(MAKE) -j$(JOBS) all
	$(MAKE) test-c test-emu test-erl test-ex test-xla-c test-jax selftest demo

# The same suites, forced onto CUDA; fails where there is no GPU.
test-gpu: all $(BUILD)/fusex_check
	FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 $(MAKE) test-c test-erl test-ex
	$(MAKE) test-xla-c-gpu test-jax-gpu
	$(MAKE) sanitize

# The cross-process CUDA IPC test against PyTorch alone (also part of
# test-gpu through test-erl); skipped with the reason where there is no GPU
# or no torch.
test-ipc: all
	FUSEX_DEVICE=cuda $(REBAR3) ct --suite=fusex_ipc_SUITE --readable=compact

# compute-sanitizer over the C kernel tests on the GPU (memcheck, racecheck,
# synccheck: the streaming kernels' named barrier).
sanitize: nif $(BUILD)/fusex_check
	FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 FUSEX_PRIV=priv CK_FORK=no FUSEX_QUICK=1 \
	  compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 $(BUILD)/fusex_check
	FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 FUSEX_PRIV=priv CK_FORK=no FUSEX_QUICK=1 \
	  compute-sanitizer --tool racecheck --error-exitcode 1 $(BUILD)/fusex_check
	FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 FUSEX_PRIV=priv CK_FORK=no FUSEX_QUICK=1 \
	  compute-sanitizer --tool synccheck --error-exitcode 1 $(BUILD)/fusex_check
	+@$(call xla_submake,$(XLA_TEST_DIR)/ffi_call_test_cuda)
	for tool in memcheck racecheck synccheck; do \
	  compute-sanitizer --tool $$tool --error-exitcode 1 $(XLA_TEST_DIR)/ffi_call_test_cuda || exit 1; \
	done

# ---- AddressSanitizer + UndefinedBehaviorSanitizer ----
# The NIF and the Check suite built again with -fsanitize=address,undefined
# in build-asan/ (its NIF in build-asan/priv, so the normal build is never
# touched), then the Check suites (FUSEX_QUICK sweeps) and the Erlang suites
# (eunit and ct, fuzz included) against it: the BEAM, not built with ASan,
# gets the runtime by LD_PRELOAD and loads the sanitized NIF from
# FUSEX_PRIV_DIR. Any report fails the run (UBSan does not recover). No
# CUDA backend: it is not built there, so everything runs on the CPU.
# Options, and why (docs/TESTING.md has more):
#   allocator_may_return_null=1  a failed malloc returns NULL, as without
#                                ASan, so the out-of-memory paths are tested
#   malloc_fill_byte=255         fresh memory reads as NaN: an output an op
#   max_malloc_fill_size         forgets to write fails its comparison
#   detect_leaks                 on for the C tests; off for the BEAM, whose
#                                own allocators (mmap'd carriers LSan does not
#                                scan) hold the only pointers to live tensors
#                                at exit; the Erlang suites check fusex's
#                                memory accounting back to baseline instead
ASAN       := build-asan
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
ASAN_CFLAGS := -O1 -g $(ASAN_FLAGS) -std=c11 -D_GNU_SOURCE -fPIC -fopenmp $(WARN) -Iinclude -Ic_src
ASAN_CORE_OBJ := $(CORE_SRC:%.c=$(ASAN)/%.o)
ASAN_NIF_OBJ := $(NIF_SRC:%.c=$(ASAN)/%.o)
ASAN_CTEST_OBJ := $(CTEST_SRC:%.c=$(ASAN)/%.o)
ASAN_LIB   = $(shell $(CC) -print-file-name=libasan.so)
ASAN_ENV_COMMON := UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
                   LSAN_OPTIONS=suppressions=$(abspath tools/asan/lsan.supp):print_suppressions=0
ASAN_OPTS  := allocator_may_return_null=1:malloc_fill_byte=255:max_malloc_fill_size=1048576:abort_on_error=1
EBIN_TEST  := $(abspath _build/test/lib/fusex)

$(ASAN)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $< (asan)")
	$(Q)$(CC) $(ASAN_CFLAGS) $(DEPFLAGS) -I$(ERTS_INC) -c $< -o $@

-include $(shell find $(ASAN) -name '*.d' 2>/dev/null)

$(ASAN)/libfusex_core.a: $(ASAN_CORE_OBJ)
	ar rcs $@ $^

$(ASAN)/priv/fusex_nif.so: $(ASAN_NIF_OBJ) $(ASAN)/libfusex_core.a
	@mkdir -p $(dir $@)
	$(CC) -shared $(ASAN_FLAGS) -o $@ $(ASAN_NIF_OBJ) $(ASAN)/libfusex_core.a $(LDLIBS)

$(ASAN)/fusex_check: $(ASAN_CTEST_OBJ) $(ASAN)/libfusex_core.a
	$(CC) $(ASAN_FLAGS) -o $@ $(ASAN_CTEST_OBJ) $(ASAN)/libfusex_core.a -lcheck -lsubunit -lrt $(LDLIBS)

# The Erlang suites' modules as rebar3 compiles them for eunit and ct.
EUNIT_MODS = $(shell ls test/*_tests.erl | sed 's|test/||; s|\.erl||' | paste -sd, -)
# fusex_xla_SUITE tests priv/fusex_xla.so (the XLA targets, a library of
# their own, not built with the sanitizers) through stand-ins of EXLA: it
# has nothing of the sanitized NIF to run, and runs in make test.
CT_SUITES  = $(shell ls test/*_SUITE.erl | grep -v fusex_xla_SUITE | sed 's|test/||; s|\.erl||' | paste -sd, -)

# (ct's call through the environment: make would keep the backslashes of a
# command split over lines inside its quotes.)
test-asan: export CT_EVAL = R = ct:run_test([{dir, "$(EBIN_TEST)/test"}, {suite, [$(CT_SUITES)]}, \
  {logdir, "$(abspath $(ASAN))/ct_logs"}, {auto_compile, false}]), \
  case R of {_, 0, {_, 0}} -> halt(0); _ -> io:format("~p~n", [R]), halt(1) end.
test-asan: $(ASAN)/priv/fusex_nif.so $(ASAN)/fusex_check
	$(REBAR3) as test compile
	$(ASAN_ENV_COMMON) ASAN_OPTIONS=$(ASAN_OPTS):detect_leaks=1 FUSEX_PRIV=$(ASAN)/priv FUSEX_QUICK=1 \
	  CK_FORK=no $(ASAN)/fusex_check
	$(ASAN_ENV_COMMON) ASAN_OPTIONS=$(ASAN_OPTS):detect_leaks=0 LD_PRELOAD=$(ASAN_LIB) \
	  FUSEX_PRIV_DIR=$(abspath $(ASAN)/priv) FUSEX_ASAN=1 \
	  $(ERL) -noshell -pa $(EBIN_TEST)/ebin $(EBIN_TEST)/test -eval \
	  'case eunit:test([$(EUNIT_MODS)], [verbose]) of ok -> halt(0); _ -> halt(1) end.'
	@mkdir -p $(ASAN)/ct_logs
	$(ASAN_ENV_COMMON) ASAN_OPTIONS=$(ASAN_OPTS):detect_leaks=0 LD_PRELOAD=$(ASAN_LIB) \
	  FUSEX_PRIV_DIR=$(abspath $(ASAN)/priv) FUSEX_ASAN=1 \
	  $(ERL) -noshell -pa $(EBIN_TEST)/ebin $(EBIN_TEST)/test -eval "$$CT_EVAL"

bench: all
	$(ERL) -noshell -pa _build/default/lib/fusex/ebin -eval 'fusex_bench:main(init:get_plain_arguments())' -extra $(BENCH_ARGS)

# Trains two small recurrent policies (a GRU, Mamba) and plays them frame by frame
# (src/fusex_demo.erl, docs/MODELS.md).
demo: deps
	$(MAKE) all
	$(ERL) -noshell -pa _build/default/lib/fusex/ebin -eval 'fusex_demo:main()'

# Every op on every device against the CPU reference, one table a device
# (src/fusex_selftest.erl).
selftest: deps
	$(MAKE) all
	$(ERL) -noshell -pa _build/default/lib/fusex/ebin -eval 'fusex_selftest:main()'

docs:
	$(REBAR3) edoc

# docs/API-ELIXIR.md, the Elixir API reference, from the modules' docs
# (tools/elixir_api.exs; test/ex/fusex_api_doc_test.exs checks it is
# current). It covers the modules built on Nx and Axon: the suites' Nx.
docs-ex:
	@FUSEX_REQUIRE_NX=1 FUSEX_EX_RUN=tools/elixir_api.exs bash tools/test_ex.sh --write docs/API-ELIXIR.md

clean:
	rm -rf $(BUILD) $(ASAN) priv/fusex_nif.so priv/fusex_cuda.so priv/fusex_xla.so _build
