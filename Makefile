# One entry point for set-up, build, tests and the main job.
#   make            virtualenv + pinned packages + compiled extensions (idempotent, fast when done)
#   make test       the test suite
#   make train      the main job: synthetic data -> train tiny SNIPER on CPU -> COCO AP table; again over an
#                   earlier run: make train TRAIN_ARGS=--resume (continue it) or TRAIN_ARGS=--overwrite (start over)
#   make MXNET=mxnet-cu117   the same with a CUDA build of MXNet 1.9.1: every CUDA 11 wheel of 1.9.1 on PyPI,
#                            mxnet-cu110 ... mxnet-cu117 (README: the driver each needs); the venv
#                            remembers it, so later `make test` / `make train` keep that build
# The newest supported interpreter on the PATH: the pins (numpy 1.23 for MXNet 1.9.1) exist for 3.8-3.11.
PYTHON ?= $(shell for v in 3.11 3.10 3.9 3.8; do command -v python$$v && break; done || command -v python3)
SUPPORTED_PYTHONS := 3.8 3.9 3.10 3.11
VENV := .venv
MXNET_VARIANTS := mxnet mxnet-cu110 mxnet-cu111 mxnet-cu112 mxnet-cu113 mxnet-cu114 mxnet-cu115 mxnet-cu116 mxnet-cu117
MXNET ?= $(shell cat $(VENV)/.mxnet-variant 2>/dev/null || echo mxnet)
MXNET_VERSION := 1.9.1
GLUONCV_VERSION := 0.10.5.post0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(MXNET)-$(MXNET_VERSION)
OPS_LIB := lib/ops/libsniper_ops.so
OPS_SRC := $(wildcard lib/ops/src/*.cc lib/ops/src/*.h)
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
# `make ops-cuda-check`: the GPU variant compiled and linked on any machine, without a GPU or a CUDA
# toolkit, against CUDA 11.7 (mxnet-cu117's) from pip packages installed into build/cuda/pkg, not the
# venv (nothing imports them): the runtime headers and libcudart, and the compiler package for the crt/
# headers they include. It needs an MXNet (headers) but not this venv's stamp, so it also runs with
# PY=python3 on a machine without network once the packages are there. tests/test_cuda_build.py runs it
# and reads the operator's registration.
CUDA_CHECK_DIR := build/cuda
CUDA_CHECK_PACKAGES := nvidia-cuda-runtime-cu11==11.7.99 nvidia-cuda-nvcc-cu11==11.7.99
CUDA_CHECK_HOME := $(CUDA_CHECK_DIR)/pkg/nvidia/cuda_runtime
CUDA_CHECK_INCLUDES := $(CUDA_CHECK_HOME)/include $(CUDA_CHECK_DIR)/pkg/nvidia/cuda_nvcc/include
OPS_CUDA_LIB := $(CUDA_CHECK_DIR)/libsniper_ops_cuda.so
# One recipe for both variants: $(1) output, $(2) extra compiler flags, $(3) extra linker flags.
define build_ops
	$(eval MXINC := $(shell $(PY) -c "import mxnet,os;print(os.path.dirname(mxnet.__file__))"))
	$(CXX) $(CXXFLAGS_OPS) $(2) -I$(MXINC)/include -Ilib/ops/src \
		$(filter %.cc,$(OPS_SRC)) $(MXINC)/src/lib_api.cc -o $(1) $(3)
endef

.PHONY: all venv build extensions test train clean distclean ops-cuda-check
all: build

venv: $(STAMP)
$(STAMP): requirements.txt constraints.txt
	@case " $(MXNET_VARIANTS) " in *" $(MXNET) "*) ;; *) echo "error: MXNET=$(MXNET) is not one of: \
	$(MXNET_VARIANTS) (the MXNet $(MXNET_VERSION) wheels on PyPI)" >&2; exit 1;; esac
	@version=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	case " $(SUPPORTED_PYTHONS) " in *" $$version "*) ;; *) echo "error: $(PYTHON) is Python $${version:-?}; this \
	project needs Python 3.8-3.11 (MXNet 1.9.1 needs numpy 1.23, which has no release for 3.12+). Install one and \
	run: make PYTHON=python3.11" >&2; exit 1;; esac
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip<25"
	# one MXNet build per venv: remove the others (they share the `mxnet` package folder)
	$(PY) -m pip uninstall -y -q $(filter-out $(MXNET),$(MXNET_VARIANTS)) 2>/dev/null || true
	$(PY) -m pip install -q -c constraints.txt "$(MXNET)==$(MXNET_VERSION)" -r requirements.txt
	# gluoncv asks for the non-headless opencv-python; its real dependencies are in requirements.txt
	$(PY) -m pip install -q --no-deps gluoncv==$(GLUONCV_VERSION)
	rm -f $(VENV)/.installed-* && echo $(MXNET) > $(VENV)/.mxnet-variant && touch $@

build: extensions $(OPS_LIB)

# setuptools and cythonize rebuild only what changed (or what was deleted), so this is cheap to re-run.
extensions: $(STAMP)
	$(PY) setup.py -q build_ext --inplace

# The MultiProposalTarget operator, loaded at run time with mx.library.load.
$(OPS_LIB): $(STAMP) $(OPS_SRC)
	$(call build_ops,$@,$(OPS_VARIANT_FLAGS),$(OPS_VARIANT_LDFLAGS))

ops-cuda-check: $(OPS_CUDA_LIB)
$(CUDA_CHECK_DIR)/pkg/.installed:
	$(PY) -m pip install -q --no-deps --upgrade --target $(CUDA_CHECK_DIR)/pkg $(CUDA_CHECK_PACKAGES)
	touch $@
$(OPS_CUDA_LIB): $(OPS_SRC) $(CUDA_CHECK_DIR)/pkg/.installed
	$(call build_ops,$@,$(call CUDA_FLAGS,$(CUDA_CHECK_INCLUDES)),-L$(CUDA_CHECK_HOME)/lib -l:libcudart.so.11.0)

test: build
	$(PY) -m pytest -q tests

train: build
	$(PY) main_train.py --cfg configs/faster/sniper_synthetic_tiny.yml --eval $(TRAIN_ARGS)

clean:
	rm -rf build $(OPS_LIB)
	find lib chip_generator \( -name '*.so' -o -name '*.cpp' -path '*_cy*' \) -delete
	find lib chip_generator -name '*.pyx' | sed 's/\.pyx$$/.c/' | xargs rm -f
	find lib chip_generator -name '*.pyx' | sed 's/\.pyx$$/.cpp/' | xargs rm -f

distclean: clean
	rm -rf $(VENV) data/synthetic data/synthetic-* output
