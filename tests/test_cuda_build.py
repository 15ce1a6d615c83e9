"""The GPU variant of the operator library (``-DSNIPER_WITH_CUDA``) compiles and links without a GPU or a
CUDA toolkit (``make ops-cuda-check``, against CUDA 11.7 runtime pip packages), and registers a GPU
forward and backward beside the CPU ones; the default build registers the CPU ones alone with a CPU MXNet."""
import os
import subprocess

import mxnet as mx
import pytest

from lib.bootstrap import ROOT
from lib.ops import LIBRARY_PATH
from lib.ops.registry import registered_operators

CUDA_DIR = os.path.join(ROOT, "build", "cuda")
CUDA_LIBRARY = os.path.join(CUDA_DIR, "libsniper_ops_cuda.so")
CUDART = os.path.join(CUDA_DIR, "pkg", "nvidia", "cuda_runtime", "lib", "libcudart.so.11.0")
PACKAGES_INSTALLED = os.path.join(CUDA_DIR, "pkg", ".installed")


@pytest.fixture(scope="module")
def cuda_library():
    """Runs ``make ops-cuda-check`` (a no-op when up to date); skips when its pip packages cannot be
    installed (no network), fails when they are there and the build does not compile or link."""
    result = subprocess.run(["make", "-s", "ops-cuda-check"], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        if not os.path.exists(PACKAGES_INSTALLED):
            pytest.skip(f"the CUDA runtime pip packages of `make ops-cuda-check` could not be installed "
                        f"(offline?):\n{tail}")
        pytest.fail(f"`make ops-cuda-check` failed:\n{tail}")
    return CUDA_LIBRARY


def test_cuda_variant_registers_gpu_forward_and_backward(cuda_library):
    operators = registered_operators(cuda_library, preload=[CUDART])
    for name in ("MultiProposalTarget", "MultiProposalTargetMask", "MaskRcnnTarget"):  # the host-computing ones
        assert operators[name] == {"forward": ["cpu", "gpu"], "backward": ["cpu", "gpu"]}, name
    # the Makefile's source wildcard feeds both variants: an operator added to lib/ops/src is in both
    assert set(operators) == set(registered_operators(LIBRARY_PATH))


def test_default_variant_matches_the_installed_mxnet():
    """`make` builds the GPU forward exactly when the venv's MXNet is a CUDA build."""
    contexts = ["cpu", "gpu"] if mx.runtime.Features().is_enabled("CUDA") else ["cpu"]
    assert registered_operators(LIBRARY_PATH)["MultiProposalTarget"] == {"forward": contexts, "backward": contexts}


CUDA_WHEELS = [f"mxnet-cu11{minor}" for minor in range(8)]  # every CUDA build of mxnet 1.9.1 on PyPI


def test_make_offers_every_cuda_wheel_of_mxnet_1_9_1_and_refuses_others():
    refused = subprocess.run(["make", "MXNET=mxnet-cu118", "venv"], cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode != 0
    assert f"error: MXNET=mxnet-cu118 is not one of: {' '.join(['mxnet'] + CUDA_WHEELS)} " in refused.stderr
    for wheel in CUDA_WHEELS:  # -n: the recipe printed, not run
        planned = subprocess.run(["make", "-n", f"MXNET={wheel}", "venv"], cwd=ROOT, capture_output=True, text=True)
        assert planned.returncode == 0 and f'"{wheel}==1.9.1"' in planned.stdout, planned.stderr
