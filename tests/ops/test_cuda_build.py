"""The GPU variant of the operator library (``-DSNIPER_WITH_CUDA``) compiles and links without a GPU or a
CUDA toolkit (``make ops-cuda-check``, against the CUDA 11.7 and CUDA 13.0 runtime pip packages), and registers
a GPU forward and backward beside the CPU ones; the default build registers the CPU ones alone with a CPU MXNet.
The build of MXNet itself for Hopper (``make mxnet-gpu``, hours) is not run here: its parts that need no
toolchain are (the patch series against MXNet 1.9.1's files, the progress/ETA reader, the object checker, the
Makefile's refusals)."""
import os
import re
import subprocess
import sys

import mxnet as mx
import pytest

from lib.bootstrap import ROOT
from lib.ops import LIBRARY_PATH
from lib.ops.registry import registered_operators

CUDA_DIR = os.path.join(ROOT, "build", "cuda")
CUDA_LIBRARY = os.path.join(CUDA_DIR, "libsniper_ops_cuda.so")
CUDART = os.path.join(CUDA_DIR, "pkg", "nvidia", "cuda_runtime", "lib", "libcudart.so.11.0")
PACKAGES_INSTALLED = os.path.join(CUDA_DIR, "pkg", ".installed")
CUDA13_LIBRARY = os.path.join(ROOT, "build", "cuda13", "libsniper_ops_cuda.so")
CUDART13 = os.path.join(ROOT, "build", "cuda13", "pkg", "nvidia", "cu13", "lib", "libcudart.so.13")
MXNET_GPU = os.path.join(ROOT, "tools", "mxnet_gpu")
sys.path.insert(0, MXNET_GPU)
import check_objects  # noqa: E402  (tools/mxnet_gpu: the build's helpers)
import progress  # noqa: E402


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


@pytest.mark.parametrize("library, cudart", [(CUDA_LIBRARY, CUDART), (CUDA13_LIBRARY, CUDART13)],
                         ids=["cuda11.7", "cuda13.0"])
def test_cuda_variant_registers_gpu_forward_and_backward(cuda_library, library, cudart):
    operators = registered_operators(library, preload=[cudart])
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


def make(*args):
    return subprocess.run(["make", *args], cwd=ROOT, capture_output=True, text=True)


def test_mxnet_local_gpu_needs_the_built_library_and_installs_it_over_the_cpu_wheel(tmp_path):
    missing = str(tmp_path / "no-build")
    venv = f"VENV={tmp_path / 'venv'}"  # a fresh stamp: this checkout's venv may hold the variant already
    refused = make(venv, "MXNET=mxnet-local-gpu", f"MXNET_GPU_BUILD={missing}", "venv")
    assert refused.returncode != 0
    assert f"error: MXNET=mxnet-local-gpu needs {missing}/install/libmxnet.so" in refused.stderr
    library = tmp_path / "build" / "install" / "libmxnet.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    planned = make("-n", venv, "MXNET=mxnet-local-gpu", f"MXNET_GPU_BUILD={tmp_path / 'build'}", "venv")
    assert planned.returncode == 0, planned.stderr
    # the CPU wheel, the CUDA 13 libraries at the versions the build links, then the library copied over
    assert '"mxnet==1.9.1"' in planned.stdout and "nvidia-cudnn-cu13==9.19.0.56" in planned.stdout
    assert re.search(rf"cp {re.escape(str(library))} .*/libmxnet\.so", planned.stdout)


def test_the_default_variant_installs_and_keeps_the_cpu_wheel(tmp_path):
    """MXNET from the venv's memory (not the command line): the plan installs mxnet and uninstalls only the
    other wheels (a variable read before MXNET was set once planned `pip uninstall mxnet` and `"==1.9.1"`)."""
    planned = make("-n", f"VENV={tmp_path / 'venv'}", "venv")
    assert planned.returncode == 0, planned.stderr
    assert '"mxnet==1.9.1"' in planned.stdout
    uninstall = next(line for line in planned.stdout.splitlines() if "pip uninstall -y -q mxnet-cu110" in line)
    assert " mxnet " not in uninstall and "mxnet-local-gpu" not in uninstall


def test_mxnet_gpu_targets_need_the_sources(tmp_path):
    for target in ("mxnet-gpu", "mxnet-gpu-smoke"):
        refused = make(target)
        assert refused.returncode != 0 and f"error: give the MXNet 1.9.1 sources: make {target} MXNET_SRC=DIR" \
            in refused.stderr
    not_mxnet = subprocess.run([os.path.join(MXNET_GPU, "build.sh"), "smoke", os.path.join(ROOT, "lib"),
                                str(tmp_path / "build")], capture_output=True, text=True)
    assert not_mxnet.returncode != 0 and "is not an MXNet source tree with its submodules" in not_mxnet.stderr


MXNET_MIRROR = "/work/.mirror/apache+mxnet/repo"
PATCHES = sorted(os.path.join(MXNET_GPU, "patches", name) for name in os.listdir(os.path.join(MXNET_GPU, "patches")))


def patched_files(patch):
    with open(patch) as f:
        return [line.split()[1][2:] for line in f if line.startswith("+++ ")]


def test_every_patch_explains_itself_and_touches_few_files():
    assert PATCHES, "the patch series is empty"
    for patch in PATCHES:
        with open(patch) as f:
            text = f.read()
        assert len(text.split("\n--- ")[0].strip()) > 40, f"{patch}: no explanation before the diff"
        assert 1 <= len(patched_files(patch)) <= 3  # small and about one thing


@pytest.mark.skipif(not os.path.isdir(MXNET_MIRROR), reason="no mirror of apache/mxnet on this machine")
def test_the_patch_series_applies_in_order_to_mxnet_1_9_1(tmp_path):
    files = sorted({path for patch in PATCHES for path in patched_files(patch)})
    for path in files:
        original = subprocess.run(["git", "-C", MXNET_MIRROR, "show", f"1.9.1:{path}"], capture_output=True,
                                  check=True).stdout
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(original)
    for patch in PATCHES:
        with open(patch, "rb") as f:
            applied = subprocess.run(["patch", "-p1", "-d", str(tmp_path)], stdin=f, capture_output=True)
        assert applied.returncode == 0, (patch, applied.stdout.decode())
        assert b"offset" not in applied.stdout and b"fuzz" not in applied.stdout, applied.stdout
    cmake = (tmp_path / "CMakeLists.txt").read_text()
    assert "set(CMAKE_CUDA_STANDARD 17)" in cmake and "NOT CMAKE_CUDA_COMPILER AND" in cmake
    assert "#define MXNET_USE_CUDNN 0" in (tmp_path / "src/operator/rnn-inl.h").read_text()


def test_progress_counts_this_runs_edges_and_restarts_on_a_new_total():
    now = [100.0]
    tracker = progress.Progress(clock=lambda: now[0])
    assert progress.parse_status("[0/1] Re-running CMake...") == (0, 1)
    assert progress.parse_status("FAILED: x.o") is None and progress.parse_status(" [3/4]") is None
    tracker.update(0, 1)
    now[0] = 130.0  # the build proper starts after CMake: its clock starts here
    assert tracker.update(101, 560) == "progress: 101/560 (18.0 %), elapsed 0s, ETA ?"  # resumed at 100
    now[0] = 230.0  # 100 s for edges 101..110 (10 edges of this run): 10 s each, 450 left
    assert tracker.update(110, 560) == "progress: 110/560 (19.6 %), elapsed 1m40s, ETA 1h15m"


def test_progress_eta_weighs_the_edges_left_by_kind(tmp_path):
    """10 CUDA units and 10 C++ units planned, 2 jobs; the log says CUDA units took 40 s and C++ ones 10 s.
    After the 10 C++ units (100 s of work, 50 s of wall time), 10 CUDA units of 40 s on 2 jobs are left:
    200 s, where the time per edge so far (5 s) would promise 50 s."""
    plan = progress.read_plan(["[1/21] Building CUDA object CMakeFiles/mxnet.dir/src/a%d.cu.o" % i for i in range(10)]
                              + ["[2/21] Building CXX object CMakeFiles/mxnet.dir/src/b%d.cc.o" % i for i in range(10)]
                              + ["[21/21] Linking CXX shared library libmxnet.so", "warning: x"])
    assert plan == {"cuda": 10, "object": 10, "link": 1}
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n" + "".join(f"{i}\t{i + 10000}\t0\tCMakeFiles/b{i}.cc.o\th\n" for i in range(10))
                   + "0\t99000\t0\tCMakeFiles/old.cu.o\th\n0\t40000\t0\tCMakeFiles/old.cu.o\th\n")  # latest wins
    durations = progress.read_durations(str(log))
    assert durations == {"object": [10.0] * 10, "cuda": [40.0]}
    assert progress.read_durations(str(tmp_path / "absent")) == {}
    now = [0.0]
    tracker = progress.Progress(clock=lambda: now[0], plan=plan, durations=lambda: durations, jobs=2)
    for i in range(10):
        now[0] += 5.0
        text = tracker.update(i + 1, 21, f"Building CXX object CMakeFiles/mxnet.dir/src/b{i}.cc.o")
    # the link has no duration yet: its prior (PRIOR_SECONDS) counts
    expected = (10 * 40.0 + progress.PRIOR_SECONDS["link"]) / 2
    assert text == f"progress: 10/21 (47.6 %), elapsed 50s, ETA {progress.format_duration(expected)}"


def test_progress_filter_passes_ninja_output_through(tmp_path):
    ninja = "[1/3] Building CUDA object a.cu.o\nwarning: x\n[2/3] Building CXX object b.cc.o\n[3/3] Linking libmxnet.so\n"
    result = subprocess.run([sys.executable, os.path.join(MXNET_GPU, "progress.py"), "--every", "1000"],
                            input=ninja, capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    assert [line for line in lines if not line.startswith("progress:")] == ninja.splitlines()
    # the first status line and the last (the build is done) get a progress line, not the ones between
    assert [line.split(" (")[0] for line in lines if line.startswith("progress:")] == \
        ["progress: 1/3", "progress: 3/3"]


def test_object_checker_wants_sm_90_machine_code(tmp_path):
    from elf_helpers import elf_with_sections, fat_binary
    from dev.cuda_kernels import KIND_PTX, KIND_SASS

    good = tmp_path / "convolution.cu.o"
    good.write_bytes(elf_with_sections([(".nv_fatbin", fat_binary([(KIND_SASS, 90, b"\1" * 8),
                                                                      (KIND_PTX, 90, b".version 9.0\0")]))]))
    old = tmp_path / "pooling.cu.o"  # what a CUDA 11 wheel has: no Hopper code, no PTX
    old.write_bytes(elf_with_sections([(".nv_fatbin", fat_binary([(KIND_SASS, 86, b"\2" * 8)]))]))
    host = tmp_path / "storage.cc.o"
    host.write_bytes(elf_with_sections([(".text", b"\x90" * 8)]))
    assert check_objects.describe(str(good)) == (True, f"{good}: sm_90 (SASS sm_90, PTX compute_90)")
    assert check_objects.describe(str(old)) == (False, f"{old}: FAILED: no sm_90 machine code (SASS sm_86, PTX none)")
    assert check_objects.describe(str(host))[0] is False
    assert check_objects.describe(str(tmp_path / "absent.o"))[0] is False
    assert check_objects.main([str(good)]) == 0 and check_objects.main([str(good), str(old)]) == 1
    # a library: one fat binary per CUDA unit, and every one must carry sm_90
    library = tmp_path / "libmxnet.so"
    sm90 = fat_binary([(KIND_SASS, 90, b"\3" * 8)])
    library.write_bytes(elf_with_sections([(".nv_fatbin", sm90 + sm90 + fat_binary([(KIND_PTX, 90, b"\0")]))]))
    assert check_objects.describe(str(library)) == (
        False, f"{library}: FAILED: 1 of 3 fat binaries lack sm_90 machine code (SASS sm_90, PTX compute_90)")
    library.write_bytes(elf_with_sections([(".nv_fatbin", sm90 + sm90)]))
    assert check_objects.describe(str(library)) == (True, f"{library}: sm_90 (SASS sm_90, PTX none, 2 fat binaries)")


@pytest.mark.skipif(not all(os.path.isdir(f"/work/.mirror/{m}/repo") for m in (
    "apache+mxnet", "dmlc+dmlc-core", "dmlc+dlpack", "apache+tvm", "google+googletest")),
    reason="no mirrors of apache/mxnet and its submodules on this machine")
def test_make_source_builds_a_tree_the_build_accepts(tmp_path):
    tree = tmp_path / "mxnet"
    made = subprocess.run([os.path.join(MXNET_GPU, "make_source.sh"), str(tree)], capture_output=True, text=True)
    assert made.returncode == 0 and made.stderr == "", made.stderr
    base = (tree / "include" / "mxnet" / "base.h").read_text()
    assert "#define MXNET_MINOR 9" in base and "#define MXNET_PATCH 1" in base
    for path in ("3rdparty/dmlc-core/include/dmlc/base.h", "3rdparty/tvm/nnvm/src", "3rdparty/dlpack/include",
                 "3rdparty/googletest/googletest", "example/extensions/lib_custom_op", "tests/CMakeLists.txt"):
        assert (tree / path).exists(), path
    dangling = [p for p in tree.rglob("*") if p.is_symlink() and not p.exists()]
    assert dangling == []
    again = subprocess.run([os.path.join(MXNET_GPU, "make_source.sh"), str(tree)], capture_output=True, text=True)
    assert again.returncode != 0 and "exists; give a new folder" in again.stderr
