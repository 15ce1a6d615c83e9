// COCO's polygon rasterisation restated (the steps of maskApi.c's rleFrPoly and the RLE decode, as
// a parity scan over the crossing positions instead of run lengths), and the fork's use of it.
#include "polygon_mask.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace sniper {

void XorPolygon(const double* xy, int k, int h, int w, uint8_t* grid, std::vector<int>* work) {
  if (k <= 0) return;
  const double scale = 5;
  // Vertices at 5x, truncated toward zero after + 0.5 as C's (int) does; the ring closed.
  std::vector<int> x(k + 1), y(k + 1);
  for (int j = 0; j < k; ++j) {
    x[j] = static_cast<int>(scale * xy[2 * j] + .5);
    y[j] = static_cast<int>(scale * xy[2 * j + 1] + .5);
  }
  x[k] = x[0];
  y[k] = y[0];
  // Every edge walked one unit at a time along its longer axis, from its lower end of that axis,
  // points stored in the edge's own direction.
  std::vector<int>& u = *work;
  u.clear();
  std::vector<int> v;
  for (int j = 0; j < k; ++j) {
    int xs = x[j], xe = x[j + 1], ys = y[j], ye = y[j + 1];
    const int dx = std::abs(xe - xs), dy = std::abs(ys - ye);
    const bool flip = (dx >= dy && xs > xe) || (dx < dy && ys > ye);
    if (flip) {
      std::swap(xs, xe);
      std::swap(ys, ye);
    }
    if (dx >= dy) {
      // A zero-length edge (dx = dy = 0) has the slope 0 / 0 in COCO; its one point repeats the
      // previous edge's end x, so its y is never read there: ys stands in.
      const double s = dx == 0 ? 0.0 : static_cast<double>(ye - ys) / dx;
      for (int d = 0; d <= dx; ++d) {
        const int t = flip ? dx - d : d;
        u.push_back(t + xs);
        v.push_back(static_cast<int>(ys + s * t + .5));
      }
    } else {
      const double s = static_cast<double>(xe - xs) / dy;
      for (int d = 0; d <= dy; ++d) {
        const int t = flip ? dy - d : d;
        v.push_back(t + ys);
        u.push_back(static_cast<int>(xs + s * t + .5));
      }
    }
  }
  // Where the walk changes column at 5x and the boundary is a grid column centre, the pixel row below
  // the crossing toggles: pixels (x, y') with y' >= that row flip. Position x * h + y in column-major.
  const int cells = h * w;
  std::vector<uint8_t> toggles(static_cast<size_t>(cells) + 1, 0);
  for (size_t j = 1; j < u.size(); ++j) {
    if (u[j] == u[j - 1]) continue;
    double xd = static_cast<double>(u[j] < u[j - 1] ? u[j] : u[j] - 1);
    xd = (xd + .5) / scale - .5;
    if (std::floor(xd) != xd || xd < 0 || xd > w - 1) continue;
    double yd = static_cast<double>(v[j] < v[j - 1] ? v[j] : v[j - 1]);
    yd = (yd + .5) / scale - .5;
    if (yd < 0) {
      yd = 0;
    } else if (yd > h) {
      yd = h;
    }
    yd = std::ceil(yd);
    const int position = static_cast<int>(xd) * h + static_cast<int>(yd);
    toggles[position] ^= 1;  // position h * w (the last column's bottom) lies past the grid
  }
  uint8_t inside = 0;
  for (int p = 0; p < cells; ++p) {
    inside ^= toggles[p];
    grid[p] ^= inside;
  }
}

bool PolygonMaskTarget(const float* roi, const float* poly, int poly_len, int mask_size, float* mask,
                       std::vector<uint8_t>* grid, std::vector<int>* work) {
  if (poly_len < 2 || !(poly[1] >= 0) || !(poly[1] <= poly_len)) return false;
  const int num_segments = static_cast<int>(poly[1]);
  int end = 2 + num_segments;
  if (end > poly_len) return false;
  for (int i = 0; i < num_segments; ++i) {
    const float length = poly[2 + i];
    if (!(length >= 0) || !(length <= poly_len)) return false;
    end += static_cast<int>(length);
    if (end > poly_len) return false;
  }
  const float w = std::max(1.0f, roi[3] - roi[1]);
  const float h = std::max(1.0f, roi[4] - roi[2]);
  const float size = static_cast<float>(mask_size);
  const int cells = mask_size * mask_size;
  grid->assign(cells, 0);
  std::vector<uint8_t> segment(cells);
  std::vector<double> xy;
  int offset = 2 + num_segments;
  for (int i = 0; i < num_segments; ++i) {
    const int length = static_cast<int>(poly[2 + i]);
    const int points = length / 2;
    // The fork hands COCO (y, x) pairs in float32 cell units, so that COCO's column-major grid is the
    // row-major (y, x) mask.
    xy.resize(2 * points);
    for (int p = 0; p < points; ++p) {
      xy[2 * p] = (poly[offset + 2 * p + 1] - roi[2]) * size / h;
      xy[2 * p + 1] = (poly[offset + 2 * p] - roi[1]) * size / w;
    }
    std::fill(segment.begin(), segment.end(), 0);
    XorPolygon(xy.data(), points, mask_size, mask_size, segment.data(), work);
    for (int c = 0; c < cells; ++c) (*grid)[c] |= segment[c];
    offset += length;
  }
  for (int c = 0; c < cells; ++c) mask[c] = (*grid)[c] ? 1.0f : 0.0f;
  return true;
}

}  // namespace sniper
