"""The test-time RPN proposal layer as an MXNet operator: the reference's rules of lib/boxes/proposals.py
(its docstring states them) on the host, in the test graph of ``TEST.PROPOSAL_LAYER: reference``."""
import mxnet as mx
import numpy as np

from lib.boxes.proposals import proposals

OP_TYPE = "sniper_test_proposal"


class _ProposalOperator(mx.operator.CustomOp):
    def __init__(self, params):
        super().__init__()
        self.params = params

    def forward(self, is_train, req, in_data, out_data, aux):
        cls_prob, bbox_pred, im_info = (array.asnumpy() for array in in_data)
        rois, scores = proposals(cls_prob, bbox_pred, im_info, **self.params)
        self.assign(out_data[0], req[0], mx.nd.array(rois, ctx=out_data[0].context))
        self.assign(out_data[1], req[1], mx.nd.array(scores, ctx=out_data[1].context))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        for index, grad in enumerate(in_grad):
            self.assign(grad, req[index], 0)


@mx.operator.register(OP_TYPE)
class _ProposalProperty(mx.operator.CustomOpProp):
    """Attributes arrive as strings (symbol attributes): parsed once here."""

    def __init__(self, feature_stride, scales, ratios, rpn_pre_nms_top_n, rpn_post_nms_top_n, threshold,
                 rpn_min_size):
        super().__init__(need_top_grad=False)
        self.params = dict(stride=int(feature_stride), scales=_floats(scales), ratios=_floats(ratios),
                           pre_nms_top_n=int(rpn_pre_nms_top_n), post_nms_top_n=int(rpn_post_nms_top_n),
                           nms_thresh=float(threshold), min_size=float(rpn_min_size))

    def list_arguments(self):
        return ["cls_prob", "bbox_pred", "im_info"]

    def list_outputs(self):
        return ["output", "score"]

    def infer_shape(self, in_shape):
        rows = in_shape[0][0] * self.params["post_nms_top_n"]
        return in_shape, [(rows, 5), (rows, 1)], []

    def infer_type(self, in_type):
        """Boxes are float32 whatever the inputs (fp16 coordinates would be off by pixels); the inputs
        should be float32 too: fp16 scores tie far more often."""
        return in_type, [np.float32, np.float32], []

    def create_operator(self, ctx, shapes, dtypes):
        return _ProposalOperator(self.params)


def _floats(text):
    return tuple(float(v) for v in str(text).strip("()[] ").split(",") if v.strip())


def proposal_symbol(cls_prob, bbox_pred, im_info, name, stride, scales, ratios, pre_nms_top_n, post_nms_top_n,
                    nms_thresh, min_size):
    """The layer in a graph: outputs ``{name}_output`` (rois) and ``{name}_score``."""
    return mx.sym.Custom(cls_prob, bbox_pred, im_info, op_type=OP_TYPE, name=name, feature_stride=stride,
                         scales=tuple(scales), ratios=tuple(ratios), rpn_pre_nms_top_n=pre_nms_top_n,
                         rpn_post_nms_top_n=post_nms_top_n, threshold=nms_thresh, rpn_min_size=min_size)
