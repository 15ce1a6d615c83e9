# One entry point for set-up, build, tests and the main job (`make help` prints this list).
#   make            virtualenv + pinned packages + compiled extensions (idempotent, fast when done)
#   make PYTHON=python3.11   the same with that interpreter (default: the newest supported one on the PATH)
#   make test       the test suite (make test-all: with the slow end-to-end tests too)
#   make train      the main job: synthetic data -> train tiny SNIPER on CPU -> COCO AP table; again over an
#                   earlier run: make train TRAIN_ARGS=--resume (continue it) or TRAIN_ARGS=--overwrite (start over)
#   make MXNET=mxnet-cu117   the same with a CUDA build of MXNet 1.9.1: every CUDA 11 wheel of 1.9.1 on PyPI,
#                            mxnet-cu110 ... mxnet-cu117 (docs/gpu.md: the driver each needs); the venv
#                            remembers it, so later `make test` / `make train` keep that build
#   make mxnet-gpu MXNET_SRC=DIR   MXNet 1.9.1 built from source with sm_90 (Hopper) code, CUDA 13 + cuDNN 9
#                                  (hours; resumable), then: make MXNET=mxnet-local-gpu
#   make mxnet-gpu-smoke MXNET_SRC=DIR   only SNIPER's CUDA units of that build, each checked for sm_90 code
#   make ops-cuda-check   the operator library's GPU variant compiled against CUDA 11.7 and 13.0 from pip
#   make clean      compiled parts (keeps the venv and the MXNet GPU build); make distclean: everything made
#   make help       this list
# Two lanes of pinned packages: Python 3.8-3.11 with NumPy 1.23 (constraints.txt) and Python 3.12-3.13 with
# NumPy 2 (constraints-numpy2.txt; MXNet 1.9.1 imports under it through tools/numpy2_compat, which the venv
# gets as a start-up hook). The venv remembers its Python: a later `make` keeps it.
NUMPY1_PYTHONS := 3.8 3.9 3.10 3.11
NUMPY2_PYTHONS := 3.12 3.13
SUPPORTED_PYTHONS := $(NUMPY1_PYTHONS) $(NUMPY2_PYTHONS)
# The newest supported interpreter on the PATH that runs (a pyenv shim of a version not selected fails).
PYTHON_CANDIDATES = $(addprefix python,$(shell echo $(SUPPORTED_PYTHONS) | tr ' ' '\n' | sort -rV)) python3
NEWEST_PYTHON = $(shell for p in $(PYTHON_CANDIDATES); do $$p -c 'import sys; sys.exit("%d.%d" % \
	sys.version_info[:2] not in "$(SUPPORTED_PYTHONS)".split())' >/dev/null 2>&1 && { echo $$p; break; }; done)
ifeq ($(origin PYTHON),undefined)
PYTHON = $(eval PYTHON := $(NEWEST_PYTHON))$(PYTHON)
endif
PYTHON_VERSION_OF = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
INSTALL_PYTHON := one with pyenv (pyenv install 3.13), uv (uv python install 3.13) or the system's packages \
	(Ubuntu 24.04: apt install python3.12-venv; Debian 13: apt install python3.13-venv), then: make PYTHON=python3.13
VENV := .venv
MXNET_VARIANTS := mxnet mxnet-cu110 mxnet-cu111 mxnet-cu112 mxnet-cu113 mxnet-cu114 mxnet-cu115 mxnet-cu116 mxnet-cu117 \
	mxnet-local-gpu
# `mxnet-local-gpu`: the stock CPU wheel's Python package with libmxnet.so replaced by `make mxnet-gpu`'s (the
# Python code of the CPU and CUDA wheels is the same), and the CUDA 13 libraries it links as pip wheels.
MXNET_GPU_BUILD ?= build/mxnet-gpu
MXNET_GPU_JOBS ?= 2
MXNET_GPU_LIB := $(MXNET_GPU_BUILD)/install/libmxnet.so
MXNET_GPU_VERSIONS := tools/mxnet_gpu/versions.sh
CUDA13_RUNTIME_WHEELS := $(shell . ./$(MXNET_GPU_VERSIONS) && echo $$CUDA_RUNTIME_WHEELS)
MXNET_PIP = $(if $(filter mxnet-local-gpu,$(MXNET)),mxnet,$(MXNET))
MXNET ?= $(shell cat $(VENV)/.mxnet-variant 2>/dev/null || echo mxnet)
MXNET_VERSION := 1.9.1
GLUONCV_VERSION := 0.10.5.post0
PY := $(VENV)/bin/python
SITE_PACKAGES = $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
NUMPY2_COMPAT := tools/numpy2_compat/sniper_numpy2_compat.py
STAMP := $(VENV)/.installed-$(MXNET)-$(MXNET_VERSION)
OPS_LIB := lib/ops/libsniper_ops.so
OPS_SRC := $(wildcard lib/ops/src/*.cc lib/ops/src/*.h)
# The deformable RoI pooling behind a plain C ABI, without MXNet (the ONNX Runtime back end's compiled head path)
POOL_LIB := lib/ops/libsniper_pool.so
POOL_SRC := lib/ops/src/deformable_psroi_pooling.cc lib/ops/src/c_api/deformable_roi_pool.cc
CXXFLAGS_OPS := -std=c++17 -O3 -fPIC -shared -fopenmp -Wall -Wno-unused-function
# With a CUDA MXNet the operator also gets a GPU forward (inputs copied to the host and back).
CUDA_FLAGS = -DSNIPER_WITH_CUDA $(addprefix -I,$(1))
OPS_VARIANT_FLAGS :=
OPS_VARIANT_LDFLAGS :=
ifneq ($(findstring mxnet-cu,$(MXNET)),)
CUDA_HOME ?= /usr/local/cuda
OPS_VARIANT_FLAGS := $(call CUDA_FLAGS,$(CUDA_HOME)/include)
OPS_VARIANT_LDFLAGS := -L$(CUDA_HOME)/lib64 -lcudart
endif
ifeq ($(MXNET),mxnet-local-gpu)
# the CUDA 13 runtime (headers and library) the venv got with the variant, found at run time as libmxnet.so does
VENV_CUDA13 = $(shell $(PY) -c "import nvidia,os;print(os.path.join(nvidia.__path__[0],'cu13'))")
OPS_VARIANT_FLAGS = $(call CUDA_FLAGS,$(VENV_CUDA13)/include)
OPS_VARIANT_LDFLAGS = -L$(VENV_CUDA13)/lib -l:libcudart.so.13 -Wl,-rpath,$(VENV_CUDA13)/lib
# without the NVIDIA driver (a build or CI machine), libmxnet.so loads against the toolchain's libcuda stub,
# which answers "no device": MXNet then counts 0 GPUs and runs on the CPU
ifeq ($(shell ldconfig -p 2>/dev/null | grep -c 'libcuda\.so\.1 '),0)
export LD_LIBRARY_PATH := $(abspath $(MXNET_GPU_BUILD))/toolchain/cuda/nvidia/cu13/lib/stubs$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH))
# make's $(shell) does not see exported variables
PY_ENV := LD_LIBRARY_PATH=$(LD_LIBRARY_PATH)
endif
endif
# `make ops-cuda-check`: the GPU variant compiled and linked on any machine, without a GPU or a CUDA
# toolkit, against CUDA 11.7 (mxnet-cu117's) from pip packages installed into build/cuda/pkg, not the
# venv (nothing imports them): the runtime headers and libcudart, and the compiler package for the crt/
# headers they include. It needs an MXNet (headers) but not this venv's stamp, so it also runs with
# PY=python3 on a machine without network once the packages are there. tests/ops/test_cuda_build.py runs it
# and reads the operator's registration.
CUDA_CHECK_DIR := build/cuda
CUDA_CHECK_PACKAGES := nvidia-cuda-runtime-cu11==11.7.99 nvidia-cuda-nvcc-cu11==11.7.99
CUDA_CHECK_HOME := $(CUDA_CHECK_DIR)/pkg/nvidia/cuda_runtime
CUDA_CHECK_INCLUDES := $(CUDA_CHECK_HOME)/include $(CUDA_CHECK_DIR)/pkg/nvidia/cuda_nvcc/include
OPS_CUDA_LIB := $(CUDA_CHECK_DIR)/libsniper_ops_cuda.so
# The same against CUDA 13.0 (mxnet-local-gpu's, and the H200 image's): runtime and crt/ header wheels.
CUDA13_CHECK_DIR := build/cuda13
CUDA13_CHECK_PACKAGES := $(filter nvidia-cuda-runtime==% nvidia-cuda-crt==%,$(shell . ./$(MXNET_GPU_VERSIONS) && echo $$CUDA_WHEELS))
CUDA13_CHECK_HOME := $(CUDA13_CHECK_DIR)/pkg/nvidia/cu13
OPS_CUDA13_LIB := $(CUDA13_CHECK_DIR)/libsniper_ops_cuda.so
# One recipe for both variants: $(1) output, $(2) extra compiler flags, $(3) extra linker flags.
define build_ops
	$(eval MXINC := $(shell $(PY_ENV) $(PY) -c "import mxnet,os;print(os.path.dirname(mxnet.__file__))"))
	$(CXX) $(CXXFLAGS_OPS) $(2) -I$(MXINC)/include -Ilib/ops/src \
		$(filter %.cc,$(OPS_SRC)) $(MXINC)/src/lib_api.cc -o $(1) $(3)
endef

.PHONY: all help python-check venv build extensions test test-all train clean distclean ops-cuda-check mxnet-gpu \
	mxnet-gpu-smoke
all: build
	@echo "ready ($(VENV): Python $(call PYTHON_VERSION_OF,$(PY)), MXNet $(MXNET)); next: make test, make train \
	(the main job), make help (every target)"

help:
	@sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' Makefile

# An existing venv keeps its Python (`make` says which); a PYTHON of another version given on the command line
# or in the environment, an interpreter that does not run or one not supported is refused in one line.
python-check:
ifneq ($(wildcard $(PY)),)
	@venv=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	$(if $(filter file,$(origin PYTHON)),true,[ "$(call PYTHON_VERSION_OF,$(PYTHON))" = "$$venv" ]) || { echo \
	"error: $(VENV) was made by Python $$venv, PYTHON=$(PYTHON) is \
	$(if $(call PYTHON_VERSION_OF,$(PYTHON)),Python $(call PYTHON_VERSION_OF,$(PYTHON)),not a running Python): \
	remove it first (rm -rf $(VENV)) or run make PYTHON=python$$venv" >&2; exit 1; }
else
	@version="$(call PYTHON_VERSION_OF,$(PYTHON))"; what="is Python $$version"; [ -n "$$version" ] || \
	what="does not run"; case " $(SUPPORTED_PYTHONS) " in *" $$version "*) ;; \
	*) echo "error: $(if $(PYTHON),$(PYTHON) $$what,no Python \
	$(firstword $(SUPPORTED_PYTHONS))-$(lastword $(SUPPORTED_PYTHONS)) on the PATH); this project needs Python \
	$(firstword $(SUPPORTED_PYTHONS))-$(lastword $(SUPPORTED_PYTHONS)): install $(INSTALL_PYTHON)" >&2; exit 1;; esac
endif

venv: $(STAMP)
$(STAMP): | python-check
$(STAMP): requirements.txt constraints.txt constraints-numpy2.txt $(NUMPY2_COMPAT) $(if $(filter mxnet-local-gpu,$(MXNET)),$(wildcard $(MXNET_GPU_LIB)) $(MXNET_GPU_VERSIONS))
	@case " $(MXNET_VARIANTS) " in *" $(MXNET) "*) ;; *) echo "error: MXNET=$(MXNET) is not one of: \
	$(MXNET_VARIANTS) (the MXNet $(MXNET_VERSION) wheels on PyPI, and mxnet-local-gpu: make mxnet-gpu)" >&2; exit 1;; esac
	@[ "$(MXNET)" != mxnet-local-gpu ] || [ -f $(MXNET_GPU_LIB) ] || { echo "error: MXNET=mxnet-local-gpu needs \
	$(MXNET_GPU_LIB): build it with make mxnet-gpu MXNET_SRC=DIR (docs/gpu.md)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip<25"
	# one MXNet build per venv: remove the others (they share the `mxnet` package folder)
	$(PY) -m pip uninstall -y -q $(filter-out $(MXNET_PIP) mxnet-local-gpu,$(MXNET_VARIANTS)) 2>/dev/null || true
	# mxnet-local-gpu's package is the CPU wheel's with another libmxnet.so: reinstall it after that variant
	[ "$$(cat $(VENV)/.mxnet-variant 2>/dev/null)" != mxnet-local-gpu ] || $(PY) -m pip uninstall -y -q mxnet
	# MXNet without its dependencies: its metadata asks for numpy<2, which the NumPy 2 lane replaces (pip check
	# reports that there); its real ones (numpy, requests, graphviz) are in requirements.txt
	$(PY) -m pip install -q --no-deps "$(MXNET_PIP)==$(MXNET_VERSION)"
	$(PY) -m pip install -q -c $$($(PY) -c 'import sys; print("constraints-numpy2.txt" if "%d.%d" % \
	sys.version_info[:2] in "$(NUMPY2_PYTHONS)".split() else "constraints.txt")') -r requirements.txt
	$(if $(filter mxnet-local-gpu,$(MXNET)),$(PY) -m pip install -q --no-deps $(sort $(CUDA13_RUNTIME_WHEELS) \
	$(CUDA13_CHECK_PACKAGES)) && \
	cp $(MXNET_GPU_LIB) "$$($(PY) -c 'import mxnet.libinfo as i,os;print(os.path.dirname(i.__file__))')/libmxnet.so")
	# gluoncv asks for the non-headless opencv-python; its real dependencies are in requirements.txt
	$(PY) -m pip install -q --no-deps gluoncv==$(GLUONCV_VERSION)
	# start-up hooks of every interpreter of the venv: MXNet under NumPy 2, and the checkout on sys.path (the
	# Python API and tools from any folder, no PYTHONPATH)
	$(PY) $(NUMPY2_COMPAT) $(SITE_PACKAGES)
	# (a venv linked in from another checkout, as dev/compare_commits.py's worktrees have, keeps naming that one)
	[ -L $(VENV) ] || echo "$(CURDIR)" > $(SITE_PACKAGES)/sniper_checkout.pth
	rm -f $(VENV)/.installed-* && echo $(MXNET) > $(VENV)/.mxnet-variant && touch $@

build: extensions $(OPS_LIB) $(POOL_LIB)

# setuptools and cythonize rebuild only what changed (or what was deleted), so this is cheap to re-run.
extensions: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

# The MultiProposalTarget operator, loaded at run time with mx.library.load.
$(OPS_LIB): $(STAMP) $(OPS_SRC)
	$(call build_ops,$@,$(OPS_VARIANT_FLAGS),$(OPS_VARIANT_LDFLAGS))

# The same pooling code for lib/inference/compiled_pooling.py (ctypes): no MXNet, no Python, so one build
# serves both Python lanes.
$(POOL_LIB): $(POOL_SRC) lib/ops/src/deformable_psroi_pooling.h
	$(CXX) $(CXXFLAGS_OPS) -Ilib/ops/src $(POOL_SRC) -o $@

ops-cuda-check: $(OPS_CUDA_LIB)
$(CUDA_CHECK_DIR)/pkg/.installed:
	$(PY) -m pip install -q --no-deps --upgrade --target $(CUDA_CHECK_DIR)/pkg $(CUDA_CHECK_PACKAGES)
	touch $@
$(OPS_CUDA_LIB): $(OPS_SRC) $(CUDA_CHECK_DIR)/pkg/.installed
	$(call build_ops,$@,$(call CUDA_FLAGS,$(CUDA_CHECK_INCLUDES)),-L$(CUDA_CHECK_HOME)/lib -l:libcudart.so.11.0)
ops-cuda-check: $(OPS_CUDA13_LIB)
$(CUDA13_CHECK_DIR)/pkg/.installed: $(MXNET_GPU_VERSIONS)
	$(PY) -m pip install -q --no-deps --upgrade --target $(CUDA13_CHECK_DIR)/pkg $(CUDA13_CHECK_PACKAGES)
	touch $@
$(OPS_CUDA13_LIB): $(OPS_SRC) $(CUDA13_CHECK_DIR)/pkg/.installed
	$(call build_ops,$@,$(call CUDA_FLAGS,$(CUDA13_CHECK_HOME)/include),-L$(CUDA13_CHECK_HOME)/lib -l:libcudart.so.13)

# MXNet 1.9.1 with sm_90 machine code and compute_90 PTX from MXNET_SRC (apache/mxnet 1.9.1 with submodules),
# in MXNET_GPU_BUILD (toolchain, patched sources, ninja build; a second run continues where one stopped).
mxnet-gpu mxnet-gpu-smoke:
	@[ -n "$(MXNET_SRC)" ] || { echo "error: give the MXNet 1.9.1 sources: make $@ MXNET_SRC=DIR (a clone made \
	with git clone --recursive -b 1.9.1 https://github.com/apache/mxnet)" >&2; exit 1; }
	JOBS=$(MXNET_GPU_JOBS) tools/mxnet_gpu/build.sh $(if $(filter mxnet-gpu,$@),all,smoke) "$(MXNET_SRC)" \
		"$(MXNET_GPU_BUILD)" $(PYTHON)
	$(if $(filter mxnet-gpu,$@),@echo "built $(MXNET_GPU_LIB); install it into the venv: make MXNET=mxnet-local-gpu")

test: build
	$(PY) -m pytest -q tests

# also the tests marked slow (pytest.ini): long end-to-end runs of kinds the default run already covers
test-all: build
	$(PY) -m pytest -q -m "" tests

train: build
	$(PY) main_train.py --cfg configs/faster/sniper_synthetic_tiny.yml --eval $(TRAIN_ARGS)

# clean keeps the default MXNet GPU build (hours of compiling, build/mxnet-gpu); distclean removes it too
clean:
	[ ! -d build ] || find build -mindepth 1 -maxdepth 1 ! -name mxnet-gpu -exec rm -rf {} +
	rm -f $(OPS_LIB) $(POOL_LIB)
	find lib chip_generator \( -name '*.so' -o -name '*.cpp' -path '*_cy*' \) -delete
	find lib chip_generator -name '*.pyx' | sed 's/\.pyx$$/.c/' | xargs rm -f
	find lib chip_generator -name '*.pyx' | sed 's/\.pyx$$/.cpp/' | xargs rm -f

distclean: clean
	rm -rf $(VENV) data/synthetic data/synthetic-* output build
