# fusex build. `make` builds the NIF (C only) and, where nvcc is found, the
# CUDA backend the NIF loads at run time; `make test` installs what is
# missing, builds and runs every suite; see README.md for the rest.

ERL        ?= erl
REBAR3     ?= rebar3
NVCC       ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
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

CORE_SRC   := $(wildcard c_src/core/*.c) $(wildcard c_src/cpu/*.c)
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

.PHONY: all nif deps erl test test-c test-erl test-ex test-emu test-gpu test-ipc sanitize bench demo docs clean \
        test-emu-ssm test-asan

all: nif erl

nif: $(NIF_SO) $(CUDA_SO)

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

# Static cudart: the backend needs only the driver (libcuda.so.1) at run time.
priv/fusex_cuda.so: $(CUDA_OBJ)
	@mkdir -p priv
	$(NVCC) -shared $(NVCC_GENCODE) -cudart static -o $@ $^ -lgomp

# ---- tests ----

$(BUILD)/fusex_check: $(CTEST_OBJ) $(BUILD)/libfusex_core.a
	$(CC) -o $@ $(CTEST_OBJ) $(BUILD)/libfusex_core.a -lcheck -lsubunit -lrt $(LDLIBS)

# FUSEX_PRIV tells the C tests where the CUDA backend is.
test-c: nif $(BUILD)/fusex_check
	FUSEX_PRIV=priv $(BUILD)/fusex_check

# The linrec CUDA kernels run on the CPU by tools/cuda_emu (a thread per
# CUDA thread) against the CPU reference: their tiling and look-back are
# checked where there is no GPU.
EMU_SRC := tools/cuda_emu/emu.cc tools/cuda_emu/linrec_emu.cc
$(BUILD)/linrec_emu: $(EMU_SRC) $(wildcard tools/cuda_emu/*.h tools/cuda_emu/cuda/*.cuh) $(HEADERS) $(BUILD)/libfusex_core.a
	$(CXX) -std=c++17 -O1 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -Itools/cuda_emu -Iinclude -Ic_src \
	  $(EMU_SRC) $(BUILD)/libfusex_core.a $(LDLIBS) -o $@

test-emu: $(BUILD)/linrec_emu
	$(BUILD)/linrec_emu $${FUSEX_SEED:-$$(date +%s)} 32

# The selective scan's CUDA kernels run on the CPU under the ssm Check
# suite's CUDA branch (tools/ssm_emu: a fiber per CUDA thread), so their
# logic is checked where there is no GPU. Needs the CUDA headers, not a GPU.
CUDA_INC   := $(if $(NVCC),$(abspath $(dir $(NVCC))../include))
SSM_EMU_OBJ := $(BUILD)/ssm_emu/emu.o $(BUILD)/ssm_emu/ssm_emu.o $(BUILD)/ssm_emu/main.o \
               $(BUILD)/ssm_emu/test_ssm.o $(BUILD)/ssm_emu/testutil.o
EMU_CXXFLAGS := -std=c++17 -O2 -g $(WARN) -Wno-unknown-pragmas -I$(CUDA_INC) -Itools/ssm_emu \
                -Iinclude -Ic_src

$(BUILD)/ssm_emu/%.o: tools/ssm_emu/%.cc tools/ssm_emu/emu.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(BUILD)/ssm_emu/main.o: tools/ssm_emu/main.c test/c/testutil.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itest/c -c $< -o $@

$(BUILD)/ssm_emu/test_ssm.o: test/c/test_ssm.c test/c/testutil.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itest/c -Dfx_test_device=emu_test_device -c $< -o $@

$(BUILD)/ssm_emu/testutil.o: test/c/testutil.c test/c/testutil.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itest/c -c $< -o $@

$(BUILD)/ssm_emu/ssm_emu: $(SSM_EMU_OBJ) $(BUILD)/libfusex_core.a
	$(CXX) -o $@ $(SSM_EMU_OBJ) $(BUILD)/libfusex_core.a -lcheck -lsubunit -lrt $(LDLIBS)

# FUSEX_QUICK=1 for a short run; the whole sweep takes a minute or two.
test-emu-ssm:
ifneq ($(NVCC),)
	$(MAKE) $(BUILD)/ssm_emu/ssm_emu
	$(BUILD)/ssm_emu/ssm_emu
else
	@echo "test-emu-ssm: skipped (nvcc and the CUDA headers not found)"
endif

test-erl: all
	$(REBAR3) eunit
	$(REBAR3) ct --readable=compact

# The ExUnit suite, with Nx from hex, the offline kit, or none (then the
# Nx tests are listed as skipped); see tools/test_ex.sh.
test-ex:
	@bash tools/test_ex.sh

test: deps
	$(MAKE) all
	$(MAKE) test-c test-erl test-ex

# The same suites, forced onto CUDA; fails where there is no GPU.
test-gpu: all $(BUILD)/fusex_check
	FUSEX_DEVICE=cuda FUSEX_REQUIRE_CUDA=1 $(MAKE) test-c test-erl test-ex
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
CT_SUITES  = $(shell ls test/*_SUITE.erl | sed 's|test/||; s|\.erl||' | paste -sd, -)

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

demo: deps
	$(MAKE) all
	$(ERL) -noshell -pa _build/default/lib/fusex/ebin -eval 'fusex_demo:main()'

docs:
	$(REBAR3) edoc

clean:
	rm -rf $(BUILD) $(ASAN) priv/fusex_nif.so priv/fusex_cuda.so _build
