# qatcheck Makefile. `make` builds ./qatcheck (CPU always; CUDA when nvcc is
# found, NCCL when its header is found, MPI when mpicc is found). `make demo`,
# `make test`, `make asan`.
# It prints what it found, llm.c style.

CC       ?= gcc
PKGS     := hdf5 libcjson yaml-0.1 zlib
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
BLAS_CFLAGS := -I/usr/include/x86_64-linux-gnu/openblas-pthread
BLAS_LIBS   := -lopenblas

CFLAGS   ?= -O2 -g
QC_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wmissing-prototypes -Wno-format-truncation -Isrc -Iinclude $(PKG_CFLAGS) $(BLAS_CFLAGS) -MMD -MP
LDLIBS   := $(PKG_LIBS) $(BLAS_LIBS) -ldl -lm -lpthread

# ---- CUDA / NCCL detection -------------------------------------------------
NO_CUDA ?=
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(NO_CUDA),1)
  NVCC :=
endif
ifeq ($(wildcard src/backend/cuda/*.cu),)
  NVCC :=
endif
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),)
ifneq ($(NVCC),)
  $(info qatcheck: CUDA found: $(NVCC) -> building the cuda backend (sm_90 + PTX))
  QC_CFLAGS += -DQC_HAVE_CUDA=1 -I$(CUDA_HOME)/include
  NVCCFLAGS ?= -O3 -std=c++20 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
               -Xcompiler -Wall,-Wextra,-Werror,-fPIC -I. -Isrc -Iinclude -MMD -MP
  CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
  NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
  ifneq ($(NCCL_H),)
    $(info qatcheck: NCCL found: $(NCCL_H))
    QC_CFLAGS += -DQC_HAVE_NCCL=1
    NVCCFLAGS += -DQC_HAVE_NCCL=1
    CUDA_LIBS += -lnccl
  else
    $(info qatcheck: NCCL not found: distributed checks disabled)
  endif
else
  $(info qatcheck: nvcc (or src/backend/cuda/) not found: building the CPU tool only)
endif

# ---- MPI detection ---------------------------------------------------------------
# With MPI, `mpirun -np N qatcheck vjp|contract` splits the work among N
# processes (src/dist/, docs/distributed.md); run without mpirun, the tool is
# one process as before (MPI is not initialized). NO_MPI=1 builds without.
NO_MPI  ?=
MPICC   ?= mpicc
MPI_CFLAGS := $(if $(filter 1,$(NO_MPI)),,$(shell $(MPICC) -showme:compile 2>/dev/null))
MPI_LIBS   := $(if $(MPI_CFLAGS),$(shell $(MPICC) -showme:link 2>/dev/null),)
ifneq ($(MPI_CFLAGS),)
  $(info qatcheck: MPI found: $(shell command -v $(MPICC)) -> mpirun -np N qatcheck vjp|contract)
  QC_CFLAGS += -DQC_HAVE_MPI=1 $(MPI_CFLAGS)
  LDLIBS    += $(MPI_LIBS)
else
  $(info qatcheck: MPI not found: one process only)
endif

# `make` alone builds `all` (the first rule below would be the stamp's)
.DEFAULT_GOAL := all

# ---- sources -----------------------------------------------------------------
LAYERS  := core numerics model modules reference classes engine sweep dist io report backend cli
SRC_C   := src/main.c $(foreach l,$(LAYERS),$(wildcard src/$(l)/*.c))
SRC_CU  := $(if $(NVCC),$(wildcard kernels/*.cu src/backend/cuda/*.cu),)
# CUDA and CPU-only objects differ (QC_HAVE_CUDA): keep them apart
BUILD   ?= $(if $(NVCC),build,build-nocuda)
OBJ_C   := $(SRC_C:%.c=$(BUILD)/%.o)
OBJ_CU  := $(SRC_CU:%.cu=$(BUILD)/%.cu.o)
LIB_OBJ := $(filter-out $(BUILD)/src/main.o,$(OBJ_C))
# The CUDA backend is a shared object beside ./qatcheck, loaded by
# --device cuda only: the CPU tool never loads (or needs) the CUDA libraries.
CUDA_SO := $(if $(NVCC),libqatcheck_cuda.so,)

# The backend's ABI stamp (src/backend/backend.h): the hash of the headers
# that cross the boundary between qatcheck and libqatcheck_cuda.so (the set
# found from the includes by scripts/abi-headers.sh) and the commit go into
# the two objects that stamp it (open.c, the CUDA backend's stamp.cu),
# rebuilt when either changes (abi.stamp is rewritten only then). open.c
# refuses a .so whose hash is not its own, naming both stamps.
# The commit is also every report's source commit (src/core/build.c): only
# this checkout's own (a tree without .git, inside another repository or
# none, is "unknown"), and no git at all is "unknown" too, never an error.
QC_COMMIT := $(if $(wildcard .git),$(shell git describe --always --dirty --abbrev=7 2>/dev/null),)
ifeq ($(strip $(QC_COMMIT)),)
  QC_COMMIT := unknown
endif
QC_ABI_HASH := $(shell sh scripts/abi-headers.sh hash)
ifeq ($(QC_ABI_HASH),)
  $(error qatcheck: scripts/abi-headers.sh hash failed: the backend's ABI stamp cannot be computed)
endif
STAMPED := $(BUILD)/src/backend/open.o $(BUILD)/src/core/build.o $(if $(NVCC),$(BUILD)/src/backend/cuda/stamp.cu.o,) \
           build-fuzz/src/backend/open.o build-fuzz/src/core/build.o
$(STAMPED): $(BUILD)/abi.stamp
$(STAMPED): QC_CFLAGS += -DQC_BUILD_COMMIT='"$(QC_COMMIT)"' -DQC_ABI_HASH='"$(QC_ABI_HASH)"'
$(STAMPED): NVCCFLAGS += -DQC_BUILD_COMMIT='"$(QC_COMMIT)"' -DQC_ABI_HASH='"$(QC_ABI_HASH)"'
$(BUILD)/abi.stamp: FORCE
	@mkdir -p $(dir $@)
	@echo '$(QC_COMMIT) $(QC_ABI_HASH)' >$@.tmp; if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
.PHONY: FORCE
FORCE:

TEST_SRC := $(wildcard tests/unit/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
GPU_TEST_SRC := $(wildcard tests/gpu/*.c)
GPU_TEST_OBJ := $(GPU_TEST_SRC:%.c=$(BUILD)/%.o)
PLUGIN_SRC := $(wildcard tests/plugins/*.c)
PLUGINS := $(PLUGIN_SRC:tests/plugins/%.c=build/plugins/%.so)

.PHONY: bench-bin all tests deps demo test check test-unit test-e2e test-gpu asan clean checks check-independence check-layers bench

BENCH_GPU := $(if $(NVCC),$(BUILD)/bench_gpu_linear,)

# `make` builds the tool (and the CUDA backend where nvcc is found); the test
# binaries need Criterion and are built by `make tests` / `make test`.
all: checks qatcheck $(CUDA_SO)
tests: checks $(BUILD)/symbols.ok $(BUILD)/test_unit $(BUILD)/test_gpu $(PLUGINS) $(BENCH_GPU)

# linked once the objects pass the symbol check (below)
qatcheck: $(OBJ_C) $(BUILD)/symbols.ok
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o $@ $(OBJ_C) $(LDLIBS) -rdynamic

# its undefined qc_* symbols resolve against the executable that loads it (-rdynamic)
# (first: every boundary header its objects were compiled with is in the stamp's hash)
libqatcheck_cuda.so: $(OBJ_CU)
	@sh scripts/abi-headers.sh check $(OBJ_CU:.o=.d)
	$(CC) -shared -o $@ $^ $(CUDA_LIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/test_unit: $(TEST_OBJ) $(LIB_OBJ)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o $@ $^ $(LDLIBS) -lcriterion -rdynamic

$(BUILD)/test_gpu: $(GPU_TEST_OBJ) $(LIB_OBJ)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o $@ $^ $(LDLIBS) -lcriterion -rdynamic

$(BUILD)/bench_gpu_linear: $(BUILD)/bench/gpu_linear.o $(LIB_OBJ) $(OBJ_CU)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS) -rdynamic

build/plugins/%.so: tests/plugins/%.c include/qatcheck_plugin.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(filter-out -MMD -MP,$(QC_CFLAGS)) -fPIC -shared -o $@ $<

# Every build checks the sources (once per change, a stamp): the reference
# is written from the math (no production code, no candidate GEMM path), and
# includes follow the layers' one dependency direction
# (docs/architecture.md). After the objects are built, the same table is
# checked on their symbols (nm): no object uses a symbol of a layer it may
# not use, whatever its includes say; and every function an object exports
# has a user outside it (another object, or a test or bench source: those
# are built after the check, so their sources are read). The structural
# facts the docs state (file sizes, files calling one way, where libraries
# are called) are checked the same way, sources then objects
# (scripts/check-structure.sh).
CHECK_SRC := $(shell find src kernels -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)
checks: $(BUILD)/sources.ok
$(BUILD)/sources.ok: $(CHECK_SRC) src $(wildcard src/*/) scripts/check-layers.sh scripts/check-independence.sh scripts/check-structure.sh
	@mkdir -p $(dir $@)
	@sh scripts/check-independence.sh
	@sh scripts/check-layers.sh
	@sh scripts/check-structure.sh
	@touch $@
SYM_USERS := $(shell find tests bench -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null) $(wildcard kernels/*.cu src/backend/cuda/*.cu)
$(BUILD)/symbols.ok: $(OBJ_C) $(OBJ_CU) scripts/check-layers.sh scripts/check-structure.sh $(SYM_USERS)
	@sh scripts/check-layers.sh . $(BUILD)
	@sh scripts/check-structure.sh . $(BUILD)
	@touch $@
check-independence:
	@sh scripts/check-independence.sh
check-layers:
	@sh scripts/check-layers.sh . $(BUILD)

# Dependencies: `make deps` installs (or checks) them; `make demo` and `make
# test` install them once on a fresh machine (the stamp), not on every run.
DEPS_STAMP := build/.deps-installed
deps:
	@sh scripts/install-deps.sh && mkdir -p build && touch $(DEPS_STAMP)
$(DEPS_STAMP): scripts/install-deps.sh
	@sh scripts/install-deps.sh && mkdir -p build && touch $@

demo: $(DEPS_STAMP)
	@$(MAKE) --no-print-directory -j$(NPROC) all
	sh scripts/demo.sh

# The whole suite (the README's test command; CI runs it): unit tests, every
# e2e script (in parallel), the GPU binary. `make check`: the contributor
# loop (unit tests and the fast e2e subset of tests/fast.list), no
# installer. `tests/run.sh NAME...` runs named tests.
TEST_ENV := TEST_UNIT=$(BUILD)/test_unit TEST_GPU=$(BUILD)/test_gpu
NPROC    := $(shell nproc 2>/dev/null || echo 2)
test: $(DEPS_STAMP)
	@$(MAKE) --no-print-directory -j$(NPROC) all tests
	$(TEST_ENV) sh tests/run.sh

check:
	@$(MAKE) --no-print-directory -j$(NPROC) all tests
	$(TEST_ENV) sh tests/run.sh --fast

test-unit:
	@$(MAKE) --no-print-directory -j$(NPROC) all tests
	$(TEST_ENV) sh tests/run.sh unit

test-e2e:
	@$(MAKE) --no-print-directory -j$(NPROC) all tests
	$(TEST_ENV) sh tests/run.sh $$(cd tests/e2e && ls *.sh | sed 's/\.sh$$//')

test-gpu: all tests
	$(BUILD)/test_gpu --verbose

asan:
	@$(MAKE) --no-print-directory BUILD=build-asan NO_CUDA=1 \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  build-asan/test_unit build-asan/test_gpu build/plugins/linear_plugin.so qatcheck-asan-bin
	ASAN_OPTIONS=detect_leaks=1:exitcode=86 UBSAN_OPTIONS=halt_on_error=1:exitcode=86 QATCHECK=./qatcheck-asan TEST_UNIT=build-asan/test_unit TEST_GPU=build-asan/test_gpu sh tests/run.sh

qatcheck-asan-bin: $(OBJ_C)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o qatcheck-asan $^ $(LDLIBS) -rdynamic

# ---- fuzzing (tests/fuzz/, docs/robustness.md): clang's libFuzzer ----------
# One harness = one file tests/fuzz/NAME.c -> build-fuzz/fuzz_NAME, linked
# with the library built for coverage under ASan + UBSan. `make fuzz` runs
# each for FUZZ_SECONDS (default 60) after replaying tests/fuzz/regress/NAME/.
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_FLAGS   := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
# clang's own warnings beyond gcc's, off where the code means it (tol.c skips a prefix with +)
FUZZ_WNO     := -Wno-unknown-warning-option -Wno-string-plus-int
FUZZ_OBJ     := $(filter-out build-fuzz/src/main.o,$(SRC_C:%.c=build-fuzz/%.o))
FUZZ_BIN     := $(patsubst tests/fuzz/%.c,build-fuzz/fuzz_%,$(wildcard tests/fuzz/*.c))
.PHONY: fuzz fuzz-bin
fuzz-bin: checks $(FUZZ_BIN)
fuzz: fuzz-bin
	FUZZ_SECONDS=$(FUZZ_SECONDS) sh tests/fuzz/run.sh
build-fuzz/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link $(QC_CFLAGS) $(FUZZ_WNO) -c $< -o $@
build-fuzz/fuzz_%: tests/fuzz/%.c $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $(QC_CFLAGS) $(FUZZ_WNO) -o $@ $^ $(LDLIBS)

bench-bin: build/bench/cpu_linear build/bench/sft_read build/bench/sft_gen

build/bench/cpu_linear: bench/cpu_linear.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o $@ $^ $(LDLIBS) -rdynamic

build/bench/sft_read: bench/sft_read.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o $@ $^ $(LDLIBS) -rdynamic

build/bench/sft_gen: bench/sft_gen.c $(BUILD)/src/core/crc32c.o
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(QC_CFLAGS) -o $@ $^ -lm

bench: all
	sh bench/cpu_linear.sh
	sh bench/sft.sh

clean:
	rm -rf build build-nocuda build-asan build-fuzz qatcheck qatcheck-asan libqatcheck_cuda.so

-include $(OBJ_C:.o=.d) $(FUZZ_OBJ:.o=.d) $(OBJ_CU:.o=.d) $(TEST_OBJ:.o=.d) $(GPU_TEST_OBJ:.o=.d) $(BENCH_GPU:%=$(BUILD)/bench/gpu_linear.d)
