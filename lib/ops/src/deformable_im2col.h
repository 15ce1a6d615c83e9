// The sampling half of a deformable convolution on the host, parallel over all cores (OpenMP), free of
// MXNet types so that the operator glue (deformable_im2col_op.cc) only moves tensors in and out.
//
// Columns are laid out as an image of C * kh * kw channels at the output resolution: channel c * kh * kw
// + i * kw + j at (y, x) holds input channel c bilinearly sampled at tap (i, j) of output position (y, x),
// moved by that tap's offset. A 1x1 convolution of the columns with the (F, C * kh * kw, 1, 1) view of a
// (F, C, kh, kw) weight is then the deformable convolution. Sampling, its gradients and their border
// rules are those of MXNet 1.9.1's CPU _contrib_DeformableConvolution, in the same float32 operations and
// accumulation order.
#ifndef SNIPER_OPS_DEFORMABLE_IM2COL_H_
#define SNIPER_OPS_DEFORMABLE_IM2COL_H_

namespace sniper {

struct Im2ColGeometry {
  int batch, channels, height, width;  // data (batch, channels, height, width)
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilate_h, dilate_w;
  int deformable_groups;  // channels split into this many groups, each with its own offsets
  int out_height, out_width;

  int taps() const { return kernel_h * kernel_w; }
};

// data (batch, channels, height, width), offset (batch, 2 * taps * groups, out_height, out_width) holding
// (dy, dx) per tap and group -> columns (batch, channels * taps, out_height, out_width).
void DeformableIm2Col(const Im2ColGeometry& g, const float* data, const float* offset, float* columns);

// The gradients of DeformableIm2Col given the columns' gradient; a null output is skipped.
void DeformableIm2ColBackward(const Im2ColGeometry& g, const float* columns_grad, const float* data,
                              const float* offset, float* data_grad, float* offset_grad);

}  // namespace sniper

#endif  // SNIPER_OPS_DEFORMABLE_IM2COL_H_
