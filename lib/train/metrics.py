"""Training metrics read from the network's outputs by name.

The RPN metrics compare ``rpn_cls_prob`` with the iterator's anchor labels; the R-CNN metrics compare
``cls_prob`` with the labels the proposal-target operator produced inside the graph (exposed as a
blocked-gradient output). With AutoFocus the FocusPixel metrics compare ``scale_prob`` with the
iterator's ``scale_label``. With masks (TRAIN.WITH_MASK) MaskLogLoss compares ``mask_prob`` with the
28x28 targets MaskRcnnTarget produced in the graph (``mask_targets``). Anchors, rois, cells and mask
pixels labelled -1 are ignored everywhere.
"""
import mxnet as mx
import numpy as np

EPS = 1e-14


class _NamedMetric(mx.metric.EvalMetric):
    """Base: finds its tensors by output / label name once, then computes on NumPy arrays."""

    def __init__(self, name, output_names, label_names, wanted_outputs, wanted_labels=()):
        super().__init__(name)
        missing = [n for n in wanted_outputs if n not in output_names] + \
                  [n for n in wanted_labels if n not in label_names]
        if missing:
            raise ValueError(f"metric {name}: the network has no output/label named {missing}")
        self._out_idx = [output_names.index(n) for n in wanted_outputs]
        self._label_idx = [label_names.index(n) for n in wanted_labels]

    def update(self, labels, preds):
        outs = [preds[i].asnumpy() for i in self._out_idx]
        labs = [labels[i].asnumpy() for i in self._label_idx]
        total, count = self.compute(*outs, *labs)
        self.sum_metric += total
        self.num_inst += count


class RPNAccuracy(_NamedMetric):
    def __init__(self, output_names, label_names):
        super().__init__("RPNAcc", output_names, label_names, ["rpn_cls_prob_output"], ["label"])

    def compute(self, prob, label):
        pred = prob.argmax(axis=1).reshape(label.shape[0], -1)
        keep = label != -1
        return float((pred[keep] == label[keep]).sum()), int(keep.sum())


class RPNLogLoss(_NamedMetric):
    def __init__(self, output_names, label_names):
        super().__init__("RPNLogLoss", output_names, label_names, ["rpn_cls_prob_output"], ["label"])

    def compute(self, prob, label):
        batch = label.shape[0]
        prob = prob.reshape(batch, 2, -1)
        keep = label != -1
        picked = np.take_along_axis(prob, np.where(keep, label, 0).astype(np.int64)[:, None, :], axis=1)[:, 0]
        return float(-np.log(picked[keep] + EPS).sum()), int(keep.sum())


class RPNL1Loss(_NamedMetric):
    def __init__(self, output_names, label_names):
        super().__init__("RPNL1Loss", output_names, label_names, ["rpn_bbox_loss_output"], ["label"])

    def compute(self, loss, label):
        return float(loss.sum()), int((label != -1).sum())


class RCNNAccuracy(_NamedMetric):
    def __init__(self, output_names, label_names):
        super().__init__("RCNNAcc", output_names, label_names, ["cls_prob_output", "rcnn_label_output"])

    def compute(self, prob, label):
        prob = prob.reshape(-1, prob.shape[-1])
        label = label.reshape(-1)
        keep = label != -1
        return float((prob.argmax(axis=1)[keep] == label[keep]).sum()), int(keep.sum())


class RCNNLogLoss(_NamedMetric):
    def __init__(self, output_names, label_names):
        super().__init__("RCNNLogLoss", output_names, label_names, ["cls_prob_output", "rcnn_label_output"])

    def compute(self, prob, label):
        prob = prob.reshape(-1, prob.shape[-1])
        label = label.reshape(-1)
        keep = label != -1
        picked = prob[np.arange(len(label)), np.where(keep, label, 0).astype(np.int64)]
        return float(-np.log(picked[keep] + EPS).sum()), int(keep.sum())


class RCNNL1Loss(_NamedMetric):
    def __init__(self, output_names, label_names):
        super().__init__("RCNNL1Loss", output_names, label_names, ["bbox_loss_output", "rcnn_label_output"])

    def compute(self, loss, label):
        return float(loss.sum()), int((label.reshape(-1) != -1).sum())


def _focus_cells(prob, label):
    """(probabilities (cells, 2), labels (cells,)) of the labelled FocusPixel cells of a batch."""
    prob = prob.reshape(prob.shape[0], 2, -1).transpose(0, 2, 1).reshape(-1, 2)
    label = label.reshape(-1)
    keep = label != -1
    return prob[keep], label[keep].astype(np.int64)


class FocusAccuracy(_NamedMetric):
    def __init__(self, output_names, label_names):
        super().__init__("FocusAcc", output_names, label_names, ["scale_prob_output"], ["scale_label"])

    def compute(self, prob, label):
        prob, label = _focus_cells(prob, label)
        return float((prob.argmax(axis=1) == label).sum()), len(label)


class FocusLogLoss(_NamedMetric):
    """The FocusPixel loss the network minimises: mean -log p(label) over the labelled cells."""

    def __init__(self, output_names, label_names):
        super().__init__("FocusLogLoss", output_names, label_names, ["scale_prob_output"], ["scale_label"])

    def compute(self, prob, label):
        prob, label = _focus_cells(prob, label)
        return float(-np.log(prob[np.arange(len(label)), label] + EPS).sum()), len(label)


class MaskLogLoss(_NamedMetric):
    """The mask loss the network minimises: mean -log p(target) over the labelled pixels of the mask rois
    (the reference's MaskLogLossMetric)."""

    def __init__(self, output_names, label_names):
        super().__init__("MaskLogLoss", output_names, label_names, ["mask_prob_output", "mask_targets_output"])

    def compute(self, prob, target):
        # prob (R, 2, 28, 28), target (R, 28, 28) of 1 / 0 / -1
        keep = target != -1
        picked = np.take_along_axis(prob, np.where(keep, target, 0).astype(np.int64)[:, None], axis=1)[:, 0]
        return float(-np.log(picked[keep] + EPS).sum()), int(keep.sum())


RPN_METRICS = (RPNAccuracy, RPNLogLoss, RPNL1Loss)
RCNN_METRICS = (RCNNAccuracy, RCNNLogLoss, RCNNL1Loss)
FOCUS_METRICS = (FocusAccuracy, FocusLogLoss)
MASK_METRICS = (MaskLogLoss,)


def make_metrics(output_names, label_names, rpn_only=False):
    """A CompositeEvalMetric with the RPN metrics, plus the R-CNN ones unless ``rpn_only``, plus the
    FocusPixel ones when the network has the AutoFocus branch (output ``scale_prob_output``), plus
    MaskLogLoss when it has the mask branch (output ``mask_prob_output``)."""
    composite = mx.metric.CompositeEvalMetric()
    focus = FOCUS_METRICS if "scale_prob_output" in output_names else ()
    masks = MASK_METRICS if "mask_prob_output" in output_names else ()
    for metric in RPN_METRICS + (() if rpn_only else RCNN_METRICS) + focus + masks:
        composite.add(metric(list(output_names), list(label_names)))
    return composite


def loss_values(metric):
    """{name: value} of a composite metric, for logging and the NaN check."""
    names, values = metric.get()
    return dict(zip(names, values))
