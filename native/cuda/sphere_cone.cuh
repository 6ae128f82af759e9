// The cone of rays that may hit a sphere record (ConeRows, include/pulsar/cone_rows.h), as
// the render kernels take it from a staged GpuSphere: the two-pixel forward for its
// coverage words, the backward for an entry's box within its tile.
#pragma once

#include "cuda_scratch.h"
#include "pulsar/camera.h"
#include "pulsar/cone_rows.h"

namespace pulsar {

// An entry whose box covers fewer pixels of its tile keeps the box in both render kernels:
// the cone's setup takes about a hundred instructions, more than the few visits (forward)
// or the part of a round (backward) that its rows could spare there.
constexpr int kConeMinBoxPixels = 12;

// Whether an entry whose box covers `part` of its tile (pixels, non-empty) takes the cone.
__device__ inline bool takes_cone(const PixelBounds& part) {
  return (part.x1 - part.x0 + 1) * (part.y1 - part.y0 + 1) >= kConeMinBoxPixels;
}

// The cone of sphere g under the perspective camera whose packed parameters start at
// packed_camera. The film vectors are read here, not kept in registers through a render
// kernel (its pairs do not use them).
template <typename T>
__device__ inline ConeRows<T> cone_rows_of(const T* packed_camera, const GpuSphere<T>& g) {
  return ConeRows<T>::of(load_vec3(packed_camera + kP00), load_vec3(packed_camera + kPdx),
                         load_vec3(packed_camera + kPdy), make_vec3(g.cx, g.cy, g.cz), g.dist,
                         g.terms.hit_chord(g.radius), PixelBounds{g.x0, g.y0, g.x1, g.y1});
}

}  // namespace pulsar
