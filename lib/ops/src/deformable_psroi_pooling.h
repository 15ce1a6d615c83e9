// Deformable position-sensitive ROI pooling on the host, parallel over all cores (OpenMP), free of MXNet
// types so that the operator glue (deformable_psroi_pooling_op.cc) only moves tensors in and out.
//
// Semantics are those of MXNet 1.9.1's CPU _contrib_DeformablePSROIPooling (see lib/ops/__init__.py),
// computed in the same float32 operations and the same accumulation order, so results match it to the
// last bit except where the reference itself is order-dependent.
#ifndef SNIPER_OPS_DEFORMABLE_PSROI_POOLING_H_
#define SNIPER_OPS_DEFORMABLE_PSROI_POOLING_H_

namespace sniper {

struct PSROIPoolingParams {
  float spatial_scale = 0;
  int output_dim = 0;
  int group_size = 0;
  int pooled_size = 0;
  int part_size = 0;  // 0 in the attributes means pooled_size; always resolved here
  int sample_per_part = 1;
  float trans_std = 0;
  bool no_trans = false;
};

struct PSROIPoolingShape {
  int batch, channels, height, width;  // data (batch, channels, height, width)
  int num_rois;                        // rois (num_rois, 5) [batch index, x1, y1, x2, y2]
  int num_classes;                     // trans (num_rois, 2 * num_classes, part_size, part_size); 1 without
};

// out and top_count: (num_rois, output_dim, pooled_size, pooled_size). `trans` is ignored with no_trans.
// Every roi's batch index must lie in [0, batch) (the glue checks).
void DeformablePSROIPoolingForward(const PSROIPoolingParams& params, const PSROIPoolingShape& shape,
                                   const float* data, const float* rois, const float* trans, float* out,
                                   float* top_count);

// Writes data_grad (the shape of data) and, unless no_trans or null, trans_grad (the shape of trans).
void DeformablePSROIPoolingBackward(const PSROIPoolingParams& params, const PSROIPoolingShape& shape,
                                    const float* out_grad, const float* top_count, const float* data,
                                    const float* rois, const float* trans, float* data_grad, float* trans_grad);

}  // namespace sniper

#endif  // SNIPER_OPS_DEFORMABLE_PSROI_POOLING_H_
