// A plain C ABI over deformable_psroi_pooling.h for callers without MXNet: the ONNX Runtime back end loads
// the library built from this file and that one (lib/ops/libsniper_pool.so, `make`) with ctypes and runs its
// head's deformable RoI poolings through it (lib/inference/compiled_pooling.py). One implementation serves
// MXNet's CompiledDeformablePSROIPooling and this entry point.
#include <cstddef>
#include <vector>

#include <omp.h>

#include "../deformable_psroi_pooling.h"

extern "C" {

// Deformable RoI pooling (PS-ROI pooling with group_size 1, part_size == pooled_size, one offset class):
// data (batch, channels, height, width), rois (num_rois, 5) [batch index, x1, y1, x2, y2] in input pixels,
// trans (num_rois, 2, pooled, pooled) or null (no offsets), out (num_rois, channels, pooled, pooled).
// threads > 0: OpenMP threads for this call's thread (0: OpenMP's default). Returns 0, or the 1-based index
// of the first roi whose batch index is outside [0, batch) (nothing written), or -1 for a bad size.
int sniper_deformable_roi_pool(const float* data, int batch, int channels, int height, int width, const float* rois,
                               int num_rois, const float* trans, int pooled, int samples, float spatial_scale,
                               float trans_std, int threads, float* out) {
  if (batch < 1 || channels < 1 || height < 1 || width < 1 || num_rois < 0 || pooled < 1 || samples < 1) return -1;
  for (int n = 0; n < num_rois; ++n) {
    const float index = rois[5 * static_cast<long>(n)];
    if (!(index >= 0 && index < batch) || index != static_cast<float>(static_cast<int>(index))) return n + 1;
  }
  if (threads > 0) omp_set_num_threads(threads);
  sniper::PSROIPoolingParams params;
  params.spatial_scale = spatial_scale;
  params.output_dim = channels;
  params.group_size = 1;
  params.pooled_size = pooled;
  params.part_size = pooled;
  params.sample_per_part = samples;
  params.trans_std = trans_std;
  params.no_trans = trans == nullptr;
  const sniper::PSROIPoolingShape shape{batch, channels, height, width, num_rois, 1};
  std::vector<float> top_count(static_cast<std::size_t>(num_rois) * channels * pooled * pooled);
  sniper::DeformablePSROIPoolingForward(params, shape, data, rois, trans, out, top_count.data());
  return 0;
}

}  // extern "C"
