"""The network's two deformable layers, built from MXNet's stock operators or from the compiled ones.

MXNet 1.9's CPU kernels of DeformableConvolution and DeformablePSROIPooling run the sampling on one
thread and dominate a CPU pass (BENCHMARKS.md, "Network on the CPU"). lib/ops compiles multi-core host
kernels with the same semantics (its module docstring states them): a deformable convolution becomes the
compiled `DeformableIm2Col` followed by a stock 1x1 Convolution over the columns (the product stays in
MXNet's BLAS / oneDNN), and `CompiledDeformablePSROIPooling` replaces the pooling. Either way the layers
have the same parameter names and shapes, so checkpoints and pretrained weights load into both.

The compiled kernels exist for the host only: `use_compiled_deformable` picks them for CPU contexts
unless the config key ``network.CPU_DEFORMABLE_OPS`` is ``stock``; GPUs always get the stock operators.
"""
import mxnet as mx

CPU_DEFORMABLE_OPS = ("compiled", "stock")
OFFSET_LR_MULT = 0.01  # the roi poolings' part-offset regressors learn at 1/100 of the rate (the reference)
TRANS_STD = 0.1  # their offsets, in roi widths, are the regressor's output times this


def use_compiled_deformable(cfg, contexts):
    """True when the network for ``contexts`` should use the compiled operators: all contexts are CPUs
    and ``network.CPU_DEFORMABLE_OPS`` is ``compiled``."""
    choice = cfg.network.CPU_DEFORMABLE_OPS
    if choice not in CPU_DEFORMABLE_OPS:
        raise ValueError(f"config key network.CPU_DEFORMABLE_OPS = {choice!r}: choose one of {CPU_DEFORMABLE_OPS}")
    return choice == "compiled" and all(ctx.device_type == "cpu" for ctx in contexts)


def deformable_convolution(data, offset, name, in_channels, num_filter, kernel, stride=(1, 1), pad=(0, 0),
                           dilate=(1, 1), num_deformable_group=1, num_group=1, no_bias=True, compiled=False):
    """MXNet's DeformableConvolution of ``data`` (``in_channels`` channels) with ``offset``; parameters
    ``{name}_weight`` (num_filter, in_channels / num_group, *kernel) and, unless ``no_bias``, ``{name}_bias``."""
    sampling = dict(kernel=tuple(kernel), stride=tuple(stride), pad=tuple(pad), dilate=tuple(dilate),
                    num_deformable_group=num_deformable_group)
    if not compiled:
        return mx.sym.contrib.DeformableConvolution(data=data, offset=offset, num_filter=num_filter,
                                                    num_group=num_group, no_bias=no_bias, name=name, **sampling)
    if in_channels % num_group:
        raise ValueError(f"{name}: in_channels {in_channels} is not a multiple of num_group {num_group}")
    from lib import ops  # noqa: F401  (registers DeformableIm2Col)
    columns = mx.sym.DeformableIm2Col(data, offset, name=f"{name}_columns", **sampling)
    # The weight is declared with its shape because shape inference does not run backwards through the
    # reshape to the (F, C * kh * kw, 1, 1) view that the 1x1 convolution of the columns takes.
    weight = mx.sym.var(f"{name}_weight", shape=(num_filter, in_channels // num_group) + tuple(kernel))
    return mx.sym.Convolution(columns, weight=mx.sym.reshape(weight, shape=(num_filter, -1, 1, 1)), kernel=(1, 1),
                              num_filter=num_filter, num_group=num_group, no_bias=no_bias, name=name)


def deformable_roi_pool(data, rois, prefix, pooled_size, spatial_scale, output_dim, sample_per_part, compiled=False):
    """An R-CNN head's pooling (R, output_dim, pooled_size, pooled_size): a plain (offset-free) PS-ROI pooling
    ``{prefix}offset_t`` of each roi regresses its part offsets (fully connected ``{prefix}offset``, learning
    rate x OFFSET_LR_MULT), with which ``{prefix}deformable_roi_pool`` pools the roi."""
    pooling = dict(spatial_scale=spatial_scale, output_dim=output_dim, group_size=1, pooled_size=pooled_size,
                   part_size=pooled_size, sample_per_part=sample_per_part)
    plain = deformable_psroi_pooling(data, rois, name=f"{prefix}offset_t", compiled=compiled, **pooling)
    offset = mx.sym.FullyConnected(
        plain, num_hidden=2 * pooled_size * pooled_size, name=f"{prefix}offset",
        weight=mx.sym.var(f"{prefix}offset_weight", lr_mult=OFFSET_LR_MULT),
        bias=mx.sym.var(f"{prefix}offset_bias", lr_mult=OFFSET_LR_MULT))
    offset = mx.sym.Reshape(offset, shape=(-1, 2, pooled_size, pooled_size), name=f"{prefix}offset_reshape")
    return deformable_psroi_pooling(data, rois, name=f"{prefix}deformable_roi_pool", trans=offset,
                                    trans_std=TRANS_STD, compiled=compiled, **pooling)


def deformable_psroi_pooling(data, rois, name, trans=None, compiled=False, **attrs):
    """MXNet's DeformablePSROIPooling output (R, output_dim, pooled_size, pooled_size); the offset-free
    (``no_trans``) pooling when ``trans`` is None. ``attrs`` are the stock operator's attributes."""
    inputs = [data, rois] if trans is None else [data, rois, trans]
    if not compiled:
        names = ("data", "rois", "trans")
        return mx.sym.contrib.DeformablePSROIPooling(**dict(zip(names, inputs)), no_trans=trans is None, name=name,
                                                     **attrs)
    from lib import ops  # noqa: F401  (registers CompiledDeformablePSROIPooling)
    # outputs: the pooling and top_count (the sample counts its backward divides by)
    return mx.sym.CompiledDeformablePSROIPooling(*inputs, no_trans=trans is None, name=name, **attrs)[0]
