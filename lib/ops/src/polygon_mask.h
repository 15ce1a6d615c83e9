// MaskRcnnTarget's computation, free of MXNet types: the reference fork's mask_rcnn_target.cu (its CPU
// forward is empty), which rasterises a gt's polygons with the COCO API's rleFrPoly onto the roi's
// mask_size x mask_size grid. dev/oracles/mask_target.py transcribes the same steps in Python.
#ifndef SNIPER_OPS_POLYGON_MASK_H_
#define SNIPER_OPS_POLYGON_MASK_H_

#include <cstdint>
#include <vector>

namespace sniper {

// COCO's polygon rule (rleFrPoly): the k points (x, y) = xy[2i], xy[2i + 1] on an h x w grid, boundary
// walked at 5x resolution, one crossing per grid column boundary; XORs the polygon's pixels into
// `grid`, column-major (pixel (x, y) at x * h + y) like COCO's masks. `work` is scratch.
void XorPolygon(const double* xy, int k, int h, int w, uint8_t* grid, std::vector<int>* work);

// One roi's target: the union of the polygons of `poly` (the loader's encoding: category, n, the n
// segment lengths, then each segment's x1, y1, x2, y2, ...; `poly_len` floats) relative to
// roi = [b, x1, y1, x2, y2], each side max(1, x2 - x1) spanning `mask_size` cells; 1 inside, 0 outside,
// row-major (y, x). False (mask untouched) when the encoding's counts do not fit in `poly_len`.
bool PolygonMaskTarget(const float* roi, const float* poly, int poly_len, int mask_size, float* mask,
                       std::vector<uint8_t>* grid, std::vector<int>* work);

}  // namespace sniper

#endif  // SNIPER_OPS_POLYGON_MASK_H_
