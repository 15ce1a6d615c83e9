"""A checkout of the reference (or a bare clone of it): its files, its Python 2 modules through the shim,
and its C++ chip generator compiled with a wrapper of ours."""
import ctypes
import glob
import importlib.util
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np

from dev.parity.shim import load_python2_module, overlay_module, stub_module

# The wrapper around the reference's lib/chips/cchips.cpp: its cgenerate shuffles the candidate windows with
# random_shuffle(ids.begin(), ids.end()) while its candidate list ``chips`` is in scope; the macro below
# records the shuffled candidates there (the project replays that order), srand(seed) fixes the shuffle,
# and harness_keep_order skips it (candidates in enumeration order, which the project reproduces without a
# recording: the miner's comparison).
CHIPS_WRAPPER = r"""
#include <algorithm>
#include <iostream>
#include <iterator>
#include <set>
#include <stdlib.h>
#include <vector>

static std::vector<std::vector<float> > harness_candidates;
static int harness_keep_order = 0;

template <class It> static void harness_shuffle(It first, It last) {
  if (!harness_keep_order) std::random_shuffle(first, last);
}

extern "C" void harness_set_keep_order(int keep) { harness_keep_order = keep; }

static void harness_record(const std::vector<std::vector<float> >& chips, const std::vector<int>& ids) {
  harness_candidates.clear();
  for (size_t i = 0; i < ids.size(); i++) harness_candidates.push_back(chips[ids[i]]);
}

#define random_shuffle(first, last) (harness_shuffle(first, last), harness_record(chips, ids))
#include "cchips.cpp"
#undef random_shuffle

extern "C" int harness_generate(int width, int height, int chip_size, const float* boxes, int num_boxes,
                                int stride, unsigned seed, float* chips_out, int max_chips,
                                float* candidates_out, int max_candidates, int* num_candidates) {
  std::vector<std::vector<float> > box_rows(num_boxes, std::vector<float>(4));
  for (int i = 0; i < num_boxes; i++)
    for (int k = 0; k < 4; k++) box_rows[i][k] = boxes[4 * i + k];
  srand(seed);
  harness_candidates.clear();
  std::vector<std::vector<float> > picked = chips::cgenerate(width, height, chip_size, box_rows, num_boxes, stride);
  *num_candidates = (int)harness_candidates.size();
  for (int i = 0; i < (int)harness_candidates.size() && i < max_candidates; i++)
    for (int k = 0; k < 4; k++) candidates_out[4 * i + k] = harness_candidates[i][k];
  for (int i = 0; i < (int)picked.size() && i < max_chips; i++)
    for (int k = 0; k < 4; k++) chips_out[4 * i + k] = picked[i][k];
  return (int)picked.size();
}
"""


def compile_shared_library(sources_dir, source, library, what):
    """``g++`` ``source`` (includes from ``sources_dir``) into the shared ``library``; a RuntimeError
    naming ``what`` and the compiler's message if it fails."""
    command = ["g++", "-std=c++11", "-O2", "-fPIC", "-shared", "-I", sources_dir, source, "-o", library]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"compiling {what} failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    return library


# The commits docs/reference_differences.md was measured against: the reference's master (2021-08-21) and the
# fork's commit its SNIPER-mxnet submodule pins. Another commit may compute otherwise: the harness says which
# commit it read and refuses others unless told (dev/parity_compare.py, dev/parity_proposal_target.py).
REFERENCE_COMMIT = "66d7d5bff7f2e1e45e7e299c570e43e8698311aa"
FORK_COMMIT = "00ab7a26553c45703c4a6e76e2fc7f2b6e581565"


def check_pinned(checkouts, any_commit):
    """Warnings (one line each) for ``checkouts`` not at their pinned commit unmodified; with ``any_commit``
    false the first is raised instead (a FileNotFoundError, as for a folder that is no checkout)."""
    problems = [problem for _, problem in (checkout.provenance() for checkout in checkouts) if problem]
    if problems and not any_commit:
        raise FileNotFoundError(f"{problems[0]}; --any-commit compares it anyway")
    return [f"WARNING: {problem}: figures may differ from the documented ones" for problem in problems]


def provenance_table(reference, fork):
    """The harness's first table: which commits it read (``fork`` None: not given)."""
    rows = [["reference (mahyarnajibi/SNIPER)", *_provenance_cells(reference)]]
    rows.append(["fork (mahyarnajibi/SNIPER-mxnet)", *(_provenance_cells(fork) if fork else ["not given: its tables "
                                                                                             "left out", "-"])])
    return ["Checkouts read", ["checkout", "read", "differs from the pinned commit"], rows]


def _provenance_cells(checkout):
    read, problem = checkout.provenance()
    return [read, "no" if problem is None else "**yes**"]


class Checkout:
    """A checkout at ``path``: a working tree, or a git directory (its HEAD is read). ``marker`` is a file
    every checkout of it has; ``what`` names it in the error for a folder that is not one; ``pinned`` is the
    commit the documented figures were measured on."""

    def __init__(self, path, marker, what, option, pinned):
        self.path = os.path.abspath(path)
        self.option, self.pinned = option, pinned
        self.bare = (not os.path.isfile(os.path.join(self.path, marker))
                     and os.path.isfile(os.path.join(self.path, "HEAD")))
        if not self.bare and not os.path.isfile(os.path.join(self.path, marker)):
            raise FileNotFoundError(f"{option} {path}: not a checkout of {what} (no {marker}, and not a git "
                                    f"directory)")

    def commit(self):
        """(the commit read, or None where ``path`` is not a git checkout of its own; whether tracked files
        differ from that commit)."""
        git = ["git", "--git-dir", self.path] if self.bare else ["git", "-C", self.path]
        if not self.bare:
            top = subprocess.run(git + ["rev-parse", "--show-toplevel"], capture_output=True, text=True)
            if top.returncode or os.path.realpath(top.stdout.strip()) != os.path.realpath(self.path):
                return None, False  # a copy without git, or a folder inside another repository
        head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode:
            return None, False
        modified = not self.bare and bool(subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                                                         capture_output=True, text=True).stdout.strip())
        return head.stdout.strip(), modified

    def provenance(self):
        """(what was read, in words; None when it is the pinned commit unmodified, else why it is not)."""
        commit, modified = self.commit()
        if commit is None:
            return (f"{self.path}: no git commit (not a checkout of its own)",
                    f"{self.option} {self.path}: its commit cannot be read (not a git checkout), the pinned one is "
                    f"{self.pinned[:8]}")
        read = f"{self.path} at {commit[:12]}" + (" with modified files" if modified else "")
        if commit != self.pinned:
            return read, (f"{self.option} {self.path}: commit {commit[:12]} is not the pinned {self.pinned[:12]} "
                          f"that docs/reference_differences.md was measured on "
                          f"(git -C {self.path} checkout {self.pinned[:8]})")
        if modified:
            return read, f"{self.option} {self.path}: tracked files differ from the pinned commit {self.pinned[:12]}"
        return read + " (pinned)", None

    def read(self, relative):
        """The text of file ``relative`` (e.g. ``lib/chips/cchips.cpp``)."""
        if self.bare:
            try:
                return subprocess.run(["git", "--git-dir", self.path, "show", f"HEAD:{relative}"], check=True,
                                      capture_output=True, text=True).stdout
            except subprocess.CalledProcessError as err:
                raise FileNotFoundError(f"{self.path}: no {relative} ({err.stderr.strip()})") from None
        with open(os.path.join(self.path, relative)) as f:
            return f.read()

    def copy(self, relative, workdir, name=None):
        """File ``relative`` written into ``workdir`` (as ``name``, default its own name); its path."""
        os.makedirs(workdir, exist_ok=True)
        target = os.path.join(workdir, name or os.path.basename(relative))
        with open(target, "w") as f:
            f.write(self.read(relative))
        return target


class ReferenceCheckout(Checkout):
    """The reference (mahyarnajibi/SNIPER) at ``path``."""

    def __init__(self, path):
        super().__init__(path, os.path.join("lib", "chips", "cchips.cpp"), "the SNIPER reference", "--reference",
                         REFERENCE_COMMIT)

    def bbox_transform(self, overlaps=None):
        """lib/bbox/bbox_transform.py; ``overlaps`` is its compiled lib/bbox/bbox.pyx (``bbox_extension``),
        stubbed when None (clip_boxes needs none)."""
        overlaps = overlaps or stub_module("bbox", bbox_overlaps_cython=None, ignore_overlaps_cython=None)
        return load_python2_module(self.read("lib/bbox/bbox_transform.py"), "reference_bbox_transform",
                                   {"bbox": overlaps})

    def compile_pyx(self, relative, workdir):
        """The reference's Cython module ``relative`` (e.g. ``lib/bbox/bbox.pyx``) compiled at language level
        2 into ``workdir`` and imported (under its own name, outside sys.modules)."""
        name = os.path.splitext(os.path.basename(relative))[0]
        self.copy(relative, workdir)
        build = ("from setuptools import setup, Extension\nfrom Cython.Build import cythonize\nimport numpy\n"
                 f"setup(ext_modules=cythonize([Extension({name!r}, [{name + '.pyx'!r}], "
                 "include_dirs=[numpy.get_include()])], compiler_directives={'language_level': 2}, quiet=True), "
                 "script_args=['build_ext', '--inplace'])")
        done = subprocess.run([sys.executable, "-c", build], cwd=workdir, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"compiling the reference's {relative} failed:\n{done.stderr[-2000:]}")
        (library,) = glob.glob(os.path.join(workdir, f"{name}.*.so"))
        spec = importlib.util.spec_from_file_location(name, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def bbox_extension(self, workdir):
        """lib/bbox/bbox.pyx (its overlap functions), compiled."""
        return self.compile_pyx("lib/bbox/bbox.pyx", workdir)

    def nms_module(self, workdir):
        """lib/nms/nms.py over its compiled lib/nms/cpu_nms.pyx (soft-NMS, NMS; the GPU one stubbed)."""
        return load_python2_module(self.read("lib/nms/nms.py"), "nms.nms", {
            "cpu_nms": self.compile_pyx("lib/nms/cpu_nms.pyx", workdir),
            "gpu_nms": stub_module("gpu_nms", gpu_nms=None)})

    def tester_module(self, workers, transform):
        """lib/inference.py, for ``Tester.aggregate`` (the multi-scale merge): its worker pools run serially,
        ``workers`` (``data_workers``) gives its NMS worker; iterators, MXNet and drawing are stubs."""
        stubs = {
            "mxnet": stub_module("mxnet"), "tqdm": stub_module("tqdm", tqdm=lambda iterable, **kwargs: iterable),
            "bbox": stub_module("bbox", __path__=[], bbox_transform=transform), "bbox.bbox_transform": transform,
            "iterators": stub_module("iterators", __path__=[]),
            "iterators.PrefetchingIter": stub_module("iterators.PrefetchingIter", PrefetchingIter=object),
            "iterators.MNIteratorTest": stub_module("iterators.MNIteratorTest", MNIteratorTest=object),
            "iterators.MNIteratorTestAutoFocus": stub_module("iterators.MNIteratorTestAutoFocus",
                                                             MNIteratorTestAutoFocus=object),
            "data_utils": stub_module("data_utils", __path__=[]), "data_utils.data_workers": workers,
            "data_utils.visualization": stub_module("data_utils.visualization", visualize_dets=None),
            "chips": stub_module("chips", __path__=[]),
            "chips.chips_inference": stub_module("chips.chips_inference", add_chips=None),
        }
        return load_python2_module(self.read("lib/inference.py"), "reference_inference", stubs,
                                   overrides={"Pool": SerialPool})

    def data_workers(self, chips, overlaps, nms=None):
        """lib/data_utils/data_workers.py: its ``chip_worker`` (chip_extractor, box_assigner), ``anchor_worker``
        and ``im_worker``. Its chip generator is lib/chips/chip_generator.py over ``chips`` (a ReferenceChips,
        candidates unshuffled), its overlaps the compiled ``overlaps``, its NMS ``nms`` (``nms_module``; None: a
        stub), its anchors lib/data_utils/generate_anchor.py; MXNet's ``nd.array`` gives NumPy arrays, the mask
        code is a stub."""
        transform = self.bbox_transform(overlaps)
        bbox = stub_module("bbox", __path__=[], bbox_transform=transform)
        chips_module = stub_module("chips", generate=lambda boxes, width, height, size, stride:
                                   chips.generate(boxes, width, height, size, stride, seed=None)[0].tolist())
        generator = load_python2_module(self.read("lib/chips/chip_generator.py"), "chips.chip_generator", {
            "chips": chips_module, "bbox": bbox, "bbox.bbox_transform": transform})
        stubs = {
            "mxnet": stub_module("mxnet", nd=stub_module("mxnet.nd", array=ndarray_as_numpy)),
            "nms": stub_module("nms", __path__=[]),
            "nms.nms": nms or stub_module("nms.nms", nms_wrapper=None),
            "data_utils": stub_module("data_utils", __path__=[]),
            "data_utils.mask_utils": stub_module("data_utils.mask_utils", crop_polys=None, poly_encoder=None),
            "generate_anchor": load_python2_module(self.read("lib/data_utils/generate_anchor.py"), "generate_anchor"),
            "bbox": bbox, "bbox.bbox_transform": transform,
            "chips": stub_module("chips", __path__=[], chip_generator=generator), "chips.chip_generator": generator,
        }
        return load_python2_module(self.read("lib/data_utils/data_workers.py"), "reference_data_workers", stubs)

    def test_iterators(self, workers):
        """(MNIteratorTestAutoFocus, MNIteratorTest): the reference's test iterators (lib/iterators), the first
        for detection, the second for proposal extraction, over ``workers`` (``data_workers``: their image
        worker); MXNet's iterator, batch and arrays are NumPy stand-ins."""
        mxnet = stub_module("mxnet", io=stub_module("mxnet.io", DataIter=StandInDataIter, DataBatch=SimpleNamespace),
                            nd=stub_module("mxnet.nd", array=ndarray_as_numpy,
                                           zeros=lambda shape, ctx=None, dtype=np.float32: np.zeros(shape, dtype)))
        base = load_python2_module(self.read("lib/iterators/MNIteratorBase.py"), "MNIteratorBase", {"mxnet": mxnet})
        stubs = {"mxnet": mxnet, "MNIteratorBase": base, "data_utils": stub_module("data_utils", __path__=[]),
                 "data_utils.data_workers": workers}
        return tuple(getattr(load_python2_module(self.read(f"lib/iterators/{name}.py"), name, stubs), name)
                     for name in ("MNIteratorTestAutoFocus", "MNIteratorTest"))

    def coco_module(self):
        """lib/dataset/coco.py, for its box rule (``coco._load_coco_annotation``) and its results writer
        (``coco_results_one_category_kernel``); pycocotools, the mask code and the imdb base are stubs."""
        package = "reference_dataset"
        stubs = {
            package: stub_module(package, __path__=[]),
            "imdb": stub_module("imdb", IMDB=object),
            f"{package}.pycocotools": stub_module(f"{package}.pycocotools", __path__=[]),
            f"{package}.pycocotools.coco": stub_module(f"{package}.pycocotools.coco", COCO=None),
            f"{package}.pycocotools.cocoeval": stub_module(f"{package}.pycocotools.cocoeval", COCOeval=None),
            "mask": stub_module("mask", __path__=[]),
            "mask.mask_voc2coco": stub_module("mask.mask_voc2coco", mask_voc2coco=None),
            "bbox": stub_module("bbox", __path__=[]),
            "bbox.bbox_transform": self.bbox_transform(),
        }
        return load_python2_module(self.read("lib/dataset/coco.py"), f"{package}.coco", stubs, package=package)

    def chip_generator(self, workdir):
        """The reference's C++ greedy cover, compiled into ``workdir``: a ReferenceChips."""
        self.copy("lib/chips/cchips.cpp", workdir)
        self.copy("lib/chips/cchips.h", workdir)
        source, library = os.path.join(workdir, "harness_chips.cpp"), os.path.join(workdir, "harness_chips.so")
        with open(source, "w") as f:
            f.write(CHIPS_WRAPPER)
        compile_shared_library(workdir, source, library, "the reference's cchips.cpp")
        return ReferenceChips(library)

    def mask_network(self, float16=True):
        """The class ``resnet_mx_101_e2e_mask`` of the reference's mask symbol file (``MASK_SYMBOL``; its base
        class from symbols/symbol.py, the OHEM operator it star-imports and never calls a stub) on the installed
        MXNet with lib/ops loaded, which registers MultiProposalTargetMask and MaskRcnnTarget under the fork's
        names with its input keywords. ``float16`` False: its casts to float16 cast to float32 (``float32_mxnet``),
        the graph otherwise as written."""
        import mxnet as mx

        import lib.ops  # noqa: F401  (the fork's mask operators, for the reference's mx.sym calls)

        stubs = {"mxnet": mx if float16 else float32_mxnet(), "symbols": stub_module("symbols", __path__=[]),
                 "symbols.symbol": load_python2_module(self.read("symbols/symbol.py"), "symbols.symbol"),
                 "operator_py": stub_module("operator_py", __path__=[]),
                 "operator_py.box_annotator_ohem": stub_module("operator_py.box_annotator_ohem")}
        return load_python2_module(self.read(MASK_SYMBOL), "resnet_mx_101_e2e_mask", stubs).resnet_mx_101_e2e_mask


MASK_SYMBOL = "symbols/faster/resnet_mx_101_e2e_mask.py"


def float32_mxnet():
    """The installed MXNet, except that ``mx.sym.Cast`` (``mx.symbol.Cast``) to float16 casts to float32 (a
    node that changes nothing on float32 data): a symbol file with float16 casts then runs on the CPU, where
    MXNet 1.9 has no float16 matrix product ("FP16 gemm on cpu not implemented!")."""
    import mxnet as mx

    def cast(*args, **kwargs):
        if np.dtype(kwargs.get("dtype", np.float32)) == np.float16:
            kwargs["dtype"] = np.float32
        return mx.sym.Cast(*args, **kwargs)

    symbol = overlay_module("mxnet.symbol", mx.sym, Cast=cast)
    return overlay_module("mxnet", mx, sym=symbol, symbol=symbol)


def ndarray_as_numpy(data, ctx=None, dtype=None):
    """``mx.nd.array`` for the reference's workers: a NumPy array (float32 unless ``dtype``)."""
    return np.array(data, dtype=dtype or np.float32)


class StandInDataIter:
    """``mx.io.DataIter`` for the reference's iterators: what they call of it."""

    def __init__(self, batch_size=0):
        pass

    def getpad(self):
        return 0

    def getindex(self):
        return None


class SerialPool:
    """multiprocessing.Pool's ``map`` and ``close`` in the calling process (the reference's merge asks for 32
    workers)."""

    def __init__(self, processes=None):
        pass

    def map(self, function, iterable):
        return [function(item) for item in iterable]

    def close(self):
        pass


class ReferenceChips:
    """ctypes binding of the compiled wrapper: ``generate(boxes, width, height, chip_size, stride, seed)``
    -> (picked chips (K, 4), shuffled candidate windows (N, 4)), float32, as cgenerate saw them."""

    def __init__(self, library):
        self._lib = ctypes.CDLL(library)
        self._lib.harness_generate.restype = ctypes.c_int

    def generate(self, boxes, width, height, chip_size, stride, seed):
        """``seed`` None: no shuffle (candidates in the reference's enumeration order)."""
        self._lib.harness_set_keep_order(int(seed is None))
        seed = 0 if seed is None else seed
        boxes = np.ascontiguousarray(boxes, np.float32).reshape(-1, 4)
        # candidates: corners + grid + edges, at most (W / stride + 2) x (H / stride + 2) + 3
        max_candidates = (width // stride + 3) * (height // stride + 3) + 3
        chips = np.zeros((max_candidates, 4), np.float32)
        candidates = np.zeros((max_candidates, 4), np.float32)
        count = ctypes.c_int(0)
        pointer = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))  # noqa: E731
        picked = self._lib.harness_generate(int(width), int(height), int(chip_size), pointer(boxes), len(boxes),
                                            int(stride), ctypes.c_uint(seed), pointer(chips), max_candidates,
                                            pointer(candidates), max_candidates, ctypes.byref(count))
        if count.value > max_candidates:
            raise RuntimeError(f"reference chip generator: {count.value} candidates, buffer for {max_candidates}")
        return chips[:picked].copy(), candidates[:count.value].copy()
