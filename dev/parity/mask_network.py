"""The parity harness's mask network part: the reference's own mask training graph against the project's.

The reference's ``get_symbol_rcnn(cfg, is_train=True)`` of symbols/faster/resnet_mx_101_e2e_mask.py
(``ReferenceCheckout.mask_network``: converted at run time and built on the installed MXNet with lib/ops,
which registers the fork's MultiProposalTargetMask and MaskRcnnTarget under its names) against
``symbols.training_symbol`` with TRAIN.WITH_MASK, both configured from the published mask config
(configs/faster/sniper_res101_e2e_mask.yml; the reference's class made as its main_train.py makes it, with
the config's batch-norm momentum):

* signatures: argument and auxiliary names and shapes, and the argument types MXNet infers from float32
  inputs, for the config's input (BATCH_IMAGES chips of CHIP_SIZE), with the published ``TRAIN.fp16: true``
  and with ``false``, the reference's casts as written;
* numbers: both graphs bound in float32 on the CPU with the same random parameters and the same random
  chips, one training-mode forward and backward: every output, every parameter's gradient and every
  auxiliary state after the forward (the batch-norms' moving statistics), each as the largest absolute
  difference and that over the largest magnitude of the reference's array. Nothing is sampled on either
  side (the mask proposal target keeps every roi, the mask target rasterises its polygons), so equal
  outputs need equal RPNs. The reference's casts to float16 become casts to float32 (MXNet 1.9 has no
  float16 matrix product on the CPU); the project runs with the stock deformable operators, as the
  reference, and with its compiled CPU ones (``network.CPU_DEFORMABLE_OPS: compiled``, its CPU default),
  whose other summation orders change the last bits. What a last bit does downstream is the third column:
  the stock graph with one res5 weight's elements one or two float32 steps larger. (The graph is piecewise:
  ReLUs, and the poolings' bilinear weights, whose slopes jump where a sampling point crosses a feature
  cell, switch on a last bit; the mask pooling's offset gradients then move by percents.)
"""
import os
import re
from collections import namedtuple
from types import SimpleNamespace

import numpy as np

from lib.bootstrap import ROOT
from lib.config import load_config
from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
from lib.data.chip_masks import encode_polygons
from lib.data.chip_worker import batch_fields
from lib.benchmarking import percent, thread_count

MASK_CONFIG = os.path.join(ROOT, "configs", "faster", "sniper_res101_e2e_mask.yml")
ROUNDING_PROBE = "stage4_unit1_conv2_weight"  # a res5 weight that every head reads
# The columns of the number tables: the project's two builds of the deformable layers (symbols/deformable.py),
# then the stock build with ROUNDING_PROBE's elements one or two float32 steps larger. (name, compiled, probe)
VARIANTS = (("stock deformable operators (as the reference)", False, False),
            ("compiled CPU deformable operators (the project's CPU default)", True, False),
            (f"stock, `{ROUNDING_PROBE}` x (1 + 2^-22): what a last bit does", False, True))
MIN_CHIP_SIZE = 64  # random chips' gts are 16 px to half the chip
# Layer families whose argument types differ by design: the row of docs/reference_differences.md that says why.
DOCUMENTED_TYPE_DIFFERENCES = {"mask_conv_3x3": "fp16 casts of the mask branch"}
AUTOMATIC_BLOCKGRAD = re.compile(r"blockgrad\d+_output$")  # MXNet's name of an unnamed BlockGrad (a counter)
PARAMETER_SUFFIX = re.compile(r"_(weight|bias|gamma|beta|moving_mean|moving_var)$")

# One training step's results: outputs (list, graph order), parameter gradients and auxiliary states after
# the forward ({name: array}).
Step = namedtuple("Step", ["outputs", "gradients", "aux"])
# Two arrays compared element by element: bit-identical, largest absolute difference, that over the largest
# magnitude of the reference's array.
Difference = namedtuple("Difference", ["identical", "abs", "rel"])


def project_mask_config(chips, chip_size, fp16):
    """The published mask config for ``chips`` chips of ``chip_size`` px a device, with ``TRAIN.fp16``."""
    return load_config(MASK_CONFIG, {"TRAIN.BATCH_IMAGES": chips, "TRAIN.CHIP_SIZE": chip_size,
                                     "TRAIN.fp16": fp16})


def reference_mask_config(cfg):
    """What the reference's get_symbol_rcnn reads of its config, from the project's ``cfg`` (the same values)."""
    train = cfg.TRAIN
    return SimpleNamespace(
        network=SimpleNamespace(NUM_ANCHORS=cfg.network.NUM_ANCHORS),
        dataset=SimpleNamespace(NUM_CLASSES=cfg.dataset.NUM_CLASSES),
        TRAIN=SimpleNamespace(fp16=bool(train.fp16), scale=float(train.fp16_loss_scale),
                              AUTO_FOCUS=bool(cfg.network.AUTO_FOCUS), BATCH_IMAGES=train.BATCH_IMAGES,
                              RPN_BATCH_SIZE=train.RPN_BATCH_SIZE),
        TEST=SimpleNamespace(AUTO_FOCUS=bool(cfg.network.AUTO_FOCUS)))


def input_shapes(cfg):
    """The training graph's inputs as the loader sends them ({name: shape}, chips first)."""
    targeter = AnchorTargeter(AnchorTargetParams.from_config(cfg))
    return {f.name: (cfg.TRAIN.BATCH_IMAGES,) + tuple(f.shape) for f in batch_fields(cfg, targeter, rpn_only=False)}


def project_symbol(cfg, compiled_deformable=False):
    """The project's mask training graph for ``cfg`` (``project_mask_config``)."""
    from symbols import training_symbol

    return training_symbol(cfg, cfg.dataset.NUM_CLASSES, cfg.TRAIN.BATCH_IMAGES,
                           compiled_deformable=compiled_deformable)


def reference_symbol(network_class, cfg):
    """The reference's mask training graph for ``cfg``: its ``network_class`` (``ReferenceCheckout.mask_network``)
    made as its main_train.py makes it (400 proposals, the batch-norm momentum), ``get_symbol_rcnn``."""
    network = network_class(n_proposals=400, momentum=cfg.network.BN_MOMENTUM)
    return network.get_symbol_rcnn(reference_mask_config(cfg), is_train=True)


# ------------------------------------------------------------------------------------------------ signatures

def signature(symbol, shapes):
    """({parameter: shape}, {auxiliary state: shape}, {argument: type name}, [output sizes]) of ``symbol`` for
    inputs of ``shapes`` (float32); parameters are the arguments that are not inputs."""
    arg_shapes, out_shapes, aux_shapes = symbol.infer_shape(**shapes)
    arg_types = symbol.infer_type(**{name: np.float32 for name in shapes})[0]
    names = symbol.list_arguments()
    return ({n: tuple(s) for n, s in zip(names, arg_shapes) if n not in shapes},
            dict(zip(symbol.list_auxiliary_states(), map(tuple, aux_shapes))),
            {n: np.dtype(t).name for n, t in zip(names, arg_types)},
            [int(np.prod(s)) for s in out_shapes])


def layer_group(name):
    """A parameter's layer family: ``stageN`` for the ResNet stages, otherwise its name without the parameter
    suffix and a trailing index (``mask_conv_3x3_2_weight`` -> ``mask_conv_3x3``, ``fc_new_1_bias`` ->
    ``fc_new``)."""
    base = PARAMETER_SUFFIX.sub("", name)
    stage = re.match(r"stage\d+", base)
    return stage.group(0) if stage else re.sub(r"_\d+$", "", base)


def grouped(names):
    """``names`` summed up by layer family, in order: ``mask_conv_3x3 (8), offset (2)``; ``-`` for none."""
    counts = {}
    for name in names:
        counts[layer_group(name)] = counts.get(layer_group(name), 0) + 1
    return ", ".join(f"{group} ({count})" for group, count in counts.items()) or "-"


def _one_side_only(mine, theirs):
    """The names only one of two collections has, grouped: ``project only: ...; reference only: ...``."""
    sides = (("project", [n for n in mine if n not in theirs]), ("reference", [n for n in theirs if n not in mine]))
    return "; ".join(f"{side} only: {grouped(names)}" for side, names in sides if names) or "-"


def signature_cells(project, reference, shapes):
    """One column of the signature table for two graphs on inputs of ``shapes``: (the cells of
    ``SIGNATURE_ROWS``, what differs behind each, by layer family)."""
    mine, theirs = signature(project, shapes), signature(reference, shapes)
    cells, differing = [], []
    for index in (0, 1):  # parameters, auxiliary states
        shared = [name for name in theirs[index] if name in mine[index]]
        wrong_shape = [name for name in shared if mine[index][name] != theirs[index][name]]
        cells += [percent(len(shared), len(set(mine[index]) | set(theirs[index]))),
                  percent(len(shared) - len(wrong_shape), len(shared))]
        differing += [_one_side_only(mine[index], theirs[index]), grouped(wrong_shape)]
    shared = [name for name in theirs[2] if name in mine[2]]
    wrong_type = [name for name in shared if mine[2][name] != theirs[2][name]]
    cells.append(percent(len(shared) - len(wrong_type), len(shared)))
    documented = sorted({DOCUMENTED_TYPE_DIFFERENCES[layer_group(n)] for n in wrong_type
                         if layer_group(n) in DOCUMENTED_TYPE_DIFFERENCES})
    differing.append(grouped(wrong_type) + "".join(f" (docs: {row})" for row in documented))
    same_sizes = mine[3] == theirs[3]
    cells.append(f"{len(mine[3])} / {len(theirs[3])}; {'identical' if same_sizes else 'differ'}")
    differing.append("-" if same_sizes else f"{mine[3]} / {theirs[3]}")
    return cells, differing


SIGNATURE_ROWS = ("parameter names identical (of both sides' names)", "parameter shapes identical (shared names)",
                  "auxiliary state names identical", "auxiliary state shapes identical (shared names)",
                  "argument types identical (shared names; from float32 inputs, the reference's casts as written)",
                  "outputs (project / reference); their sizes in elements")


# ------------------------------------------------------------------------------------------------ numbers

def random_parameters(rng, arg_shapes, aux_shapes):
    """({parameter: array}, {auxiliary state: array}), float32: weights normal with He's scale (sqrt(2 /
    fan-in)), batch-norm gammas in [0.5, 1.5], betas and biases N(0, 0.1), moving means N(0, 0.1) and
    variances in [0.5, 1.5]; names in sorted order, so that both sides draw the same numbers."""
    def draw(name, shape):
        if name.endswith("_weight"):
            return rng.normal(0, np.sqrt(2.0 / max(int(np.prod(shape[1:])), 1)), shape)
        if name.endswith(("_gamma", "_moving_var")):
            return rng.uniform(0.5, 1.5, shape)
        return rng.normal(0, 0.1, shape)

    return tuple({name: draw(name, shapes[name]).astype(np.float32) for name in sorted(shapes)}
                 for shapes in (arg_shapes, aux_shapes))


def random_polygon(rng, box):
    """3-8 vertices around the centre of ``box`` (x1, y1, x2, y2), inside it: flat (x, y, ...) float32."""
    count = int(rng.integers(3, 9))
    angles = np.sort(rng.uniform(0, 2 * np.pi, count))
    radii = rng.uniform(0.3, 1.0, count)
    half = (box[2:] - box[:2]) / 2
    centre = box[:2] + half
    return (centre + np.stack([np.cos(angles), np.sin(angles)], 1) * radii[:, None] * half).astype(np.float32).ravel()


def random_mask_chips(rng, shapes, num_classes, gts=8):
    """The loader's arrays for the chips of ``shapes`` (``input_shapes``): pixels in [-128, 128] (mean
    subtracted), RPN labels (90% ignored, 8% negative, 2% positive) with box targets weighted on the
    positives, ``gts`` whole-pixel gt boxes a chip (sides 16 px to half the chip, classes 1 to
    ``num_classes`` - 1) each with one or two polygons inside it in ``gt_masks``, -1 rows after them, the
    chip's size in ``im_info`` and open valid ranges (-1)."""
    chips, _, height, width = shapes["data"]
    anchors, feat_h, feat_w = shapes["bbox_target"][1] // 4, shapes["bbox_target"][2], shapes["bbox_target"][3]
    label = rng.choice([-1, 0, 1], shapes["label"], p=[0.9, 0.08, 0.02]).astype(np.float32)
    positive = (label.reshape(chips, anchors, 1, feat_h, feat_w) == 1).repeat(4, axis=2)
    gt_boxes = np.full(shapes["gt_boxes"], -1, np.float32)
    gt_masks = np.zeros(shapes["gt_masks"], np.float32)
    for chip in range(chips):
        sides = rng.uniform(16, min(height, width) / 2, (gts, 2))
        x1, y1 = rng.uniform(0, width - 1 - sides[:, 0]), rng.uniform(0, height - 1 - sides[:, 1])
        boxes = np.floor(np.stack([x1, y1, x1 + sides[:, 0], y1 + sides[:, 1]], 1)).astype(np.float32)
        classes = rng.integers(1, num_classes, gts)
        gt_boxes[chip, :gts] = np.concatenate([boxes, classes[:, None]], 1)
        polygons = [[random_polygon(rng, box) for _ in range(int(rng.integers(1, 3)))] for box in boxes]
        encode_polygons([len(p) for p in polygons], [len(q) for p in polygons for q in p],
                        np.concatenate([q for p in polygons for q in p]), classes - 1, gt_masks[chip])
    return {"data": rng.uniform(-128, 128, shapes["data"]).astype(np.float32),
            "im_info": np.tile(np.array([[height, width, 1.0]], np.float32), (chips, 1)),
            "valid_ranges": np.full(shapes["valid_ranges"], -1, np.float32),
            "label": label, "bbox_target": rng.normal(0, 1, shapes["bbox_target"]).astype(np.float32),
            "bbox_weight": positive.reshape(shapes["bbox_weight"]).astype(np.float32),
            "gt_boxes": gt_boxes, "gt_masks": gt_masks}


def training_step(symbol, inputs, params, aux):
    """One training-mode forward and backward of ``symbol`` on the CPU in float32, bound with ``inputs``,
    ``params`` and ``aux`` (NumPy arrays by name): a Step of NumPy arrays."""
    import mxnet as mx

    grad_req = {name: "null" if name in inputs else "write" for name in symbol.list_arguments()}
    executor = symbol.simple_bind(mx.cpu(), grad_req=grad_req, **{n: a.shape for n, a in inputs.items()})
    for name, array in executor.arg_dict.items():
        array[:] = inputs[name] if name in inputs else params[name]
    for name, array in executor.aux_dict.items():
        array[:] = aux[name]
    executor.forward(is_train=True)
    executor.backward()
    return Step([out.asnumpy() for out in executor.outputs],
                {n: g.asnumpy() for n, g in executor.grad_dict.items() if n not in inputs and g is not None},
                {n: a.asnumpy() for n, a in executor.aux_dict.items()})


def difference(mine, theirs):
    """A Difference of two arrays of as many elements (compared in memory order, whatever their shapes)."""
    mine, theirs = np.asarray(mine, np.float64).ravel(), np.asarray(theirs, np.float64).ravel()
    if mine.size != theirs.size:
        raise ValueError(f"arrays of {mine.size} and {theirs.size} elements")
    largest = float(np.abs(mine - theirs).max()) if mine.size else 0.0
    scale = float(np.abs(theirs).max()) if theirs.size else 0.0
    return Difference(bool(np.array_equal(mine, theirs)), largest,
                      largest / scale if scale else (0.0 if largest == 0 else float("inf")))


def _worst(differences):
    """Summed up: bit-identical count, largest absolute and largest relative difference."""
    return (sum(d.identical for d in differences), max((d.abs for d in differences), default=0.0),
            max((d.rel for d in differences), default=0.0))


def _figures(largest, relative):
    return f"{largest:.3g} / {relative:.3g}"


def output_rows(project_names, reference_names, columns, theirs):
    """The output table's rows: per output (paired in graph order) its names, shapes, and per column (a
    project Step) the largest absolute / relative difference from ``theirs`` (the reference's Step), with
    what explains a name or shape that differs."""
    rows = []
    for index, (name, reference_name) in enumerate(zip(project_names, reference_names)):
        shapes = (columns[0].outputs[index].shape, theirs.outputs[index].shape)
        notes = ([] if name == reference_name else ["an unnamed BlockGrad in the reference"]
                 if AUTOMATIC_BLOCKGRAD.match(reference_name) else [f"named `{reference_name}` in the reference"]) + (
            ["reshaped in the reference (the same elements)"] if shapes[0] != shapes[1] else [])
        cells = [_figures(*difference(mine.outputs[index], theirs.outputs[index])[1:]) for mine in columns]
        rows.append([f"`{name}`", f"{shapes[0]} / {shapes[1]}", *cells, "; ".join(notes) or "-"])
    return rows


def gradient_rows(columns, theirs):
    """The gradient table's rows: per layer family (in the reference's argument order) its parameter count
    and, per column (a project Step), how many gradients are bit-identical to those of ``theirs`` (the
    reference's Step); the largest absolute / relative difference; then every parameter, then the auxiliary
    states after the forward."""
    names = list(theirs.gradients)
    families = {}
    for name in names:
        families.setdefault(layer_group(name), []).append(name)
    rows = []
    for label, members, field in ([(f"`{group}`", members, "gradients") for group, members in families.items()] +
                                  [("every parameter", names, "gradients"),
                                   ("auxiliary states after the forward", list(theirs.aux), "aux")]):
        cells = []
        for mine in columns:
            same, largest, relative = _worst([difference(getattr(mine, field)[n], getattr(theirs, field)[n])
                                              for n in members])
            cells.append(f"{same} / {len(members)}; {_figures(largest, relative)}")
        rows.append([label, len(members), *cells])
    return rows


def compare_mask_network(reference, chips=2, chip_size=192, seed=0):
    """The mask network part against ``reference`` (a ReferenceCheckout): [(title, header, rows)] of the
    signature, output and gradient tables; the numbers on ``chips`` random chips of ``chip_size`` px."""
    published = load_config(MASK_CONFIG)
    batch, size = published.TRAIN.BATCH_IMAGES, published.TRAIN.CHIP_SIZE
    written, columns, notes = reference.mask_network(float16=True), [], []
    for fp16 in (True, False):
        cfg = project_mask_config(batch, size, fp16)
        cells, differing = signature_cells(project_symbol(cfg), reference_symbol(written, cfg), input_shapes(cfg))
        columns.append(cells)
        notes.append(differing)
    explained = ["; ".join(f"fp16 {state}: {text}" for state, text in zip(("on", "off"), pair) if text != "-") or "-"
                 for pair in zip(*notes)]
    signatures = [[name, *cells, note] for name, *cells, note in zip(SIGNATURE_ROWS, *columns, explained)]

    cfg = project_mask_config(chips, chip_size, False)
    reference_graph, shapes = reference_symbol(reference.mask_network(float16=False), cfg), input_shapes(cfg)
    rng = np.random.default_rng(seed)
    inputs = random_mask_chips(rng, shapes, cfg.dataset.NUM_CLASSES)
    arg_shapes, aux_shapes = signature(reference_graph, shapes)[:2]
    params, aux = random_parameters(rng, arg_shapes, aux_shapes)
    theirs = training_step(reference_graph, inputs, params, aux)
    probed = dict(params, **{ROUNDING_PROBE: params[ROUNDING_PROBE] * np.float32(1 + 2.0 ** -22)})
    mine = [training_step(project_symbol(cfg, compiled), inputs, probed if probe else params, aux)
            for _, compiled, probe in VARIANTS]
    where = f"{chips} random chips of {chip_size} px, seed {seed}, float32, one training step, {thread_count()}"
    variant_names = [name for name, _, _ in VARIANTS]
    return [
        (f"Mask training graph: signatures ({batch} chips of {size} px, the published mask config)",
         ["quantity", "`TRAIN.fp16: true` (published)", "`TRAIN.fp16: false`", "differing (layer families)"],
         signatures),
        (f"Mask training graph: outputs ({where}; largest absolute / relative difference)",
         ["output", "shapes (project / reference)", *variant_names, "explained"],
         output_rows(project_symbol(cfg).list_outputs(), reference_graph.list_outputs(), mine, theirs)),
        (f"Mask training graph: gradients ({where}; bit-identical, largest absolute / relative difference)",
         ["parameters", "count", *variant_names],
         gradient_rows(mine, theirs)),
    ]
