// The CUDA backend's persistent device scratch and the data its stages share.
//
// Binning: every (camera b, visible sphere i) pair gets a slot range of length
// "tiles stored" (an exclusive scan over b*N + i gives sphere_slots). Each slot u holds
// one (tile, sphere) instance with sort key (b * n_tiles + tile) << 32 | float bits of zc
// (zc > 0, so its bits order like its value). A stable radix sort of the keys orders
// every tile's instances by (zc, index); tile_ranges then marks each tile's run. A tile
// stores only the spheres with zc up to its depth bound (tile_depth_bound.cu): the ones
// early termination can let a pixel of it reach.
#pragma once

#include <cstdint>

#include "../core/scene_view.h"
#include "../core/tiling.h"
#include "device_buffer.h"
#include "pulsar/camera.h"
#include "pulsar/renderer.h"
#include "pulsar/intersection.h"
#include "pulsar/sphere_setup.h"

namespace pulsar {

// One sphere as seen from one camera (stage 1), what the render kernels load per entry.
// The first fields are what every pixel tests before anything else (one 16-byte load
// in float32); the geometry follows.
template <typename T>
struct GpuSphere {
  T closest_depth;              // zc, world units
  std::int16_t x0, y0, x1, y1;  // inclusive pixel bounds (empty: x0 > x1)
  T cx, cy, cz;      // perspective: centre - eye (world); orthographic: camera-frame coords
  T dist;            // |centre - eye|
  T radius, opacity;
  PairTerms<T> terms;  // per-sphere constants of the pair tests
};

struct CudaScratch {
  int device = 0;
  int sm_count = 1;
  DeviceBuffer spheres;         // GpuSphere<T> [B, N]
  DeviceBuffer depth_range;     // uint32 [B, 2]: ~bits of the smallest, bits of the largest visible zc
  DeviceBuffer cover_histogram; // uint64 [B * n_tiles, buckets] (tile_depth_bound.cu)
  DeviceBuffer tile_depth_bound;  // float [B * n_tiles]: no pixel processes a sphere with larger zc
  DeviceBuffer tile_counts;     // int64 [B * N]: tiles stored per sphere
  DeviceBuffer sphere_slots;    // int64 [B * N + 2]: exclusive scan of tile_counts, then the
                                // count of small-box instances (count_kernel)
  // Everything per (tile, sphere) instance, one allocation in two phases (InstanceArena).
  DeviceBuffer instance_arena;
  bool sort_keys_start_in_b = false;  // which key buffer the next sort starts in (setup_bin.cu)
  // The maps that survive the sort, in the arena's first 8 bytes per instance:
  std::int32_t* entry_sphere = nullptr;   // [n_instances]: sphere index of a sorted position
  std::int32_t* entry_slot = nullptr;     // [n_instances]: slot u of a sorted position; instance
                                          // gradients are stored by slot, so that each sphere's
                                          // rows are contiguous for the reduction
  void* instance_grads = nullptr;         // T [n_instances, 5 + C] by slot, behind the maps
                                          // (set by the backward)
  DeviceBuffer tile_ranges;     // int2 [B * n_tiles]: [begin, end) of each tile's sorted entries
  DeviceBuffer cub_temp;        // CUB workspace
  int backward_splits = 1;         // blocks per tile in the last backward (render_backward.cu)
  DeviceBuffer tile_camera_grads;  // T [B * n_tiles * backward_splits, kCameraGradValues]
  DeviceBuffer tile_background_grads;  // T [B * n_tiles * backward_splits, C]
  // Pinned, read back once per binning: [0] the instance count, [1] how many of them
  // belong to spheres whose box holds at most kSmallBoxPixels pixels.
  std::int64_t* host_count = nullptr;
  std::int64_t n_instances = 0;
  std::int64_t small_box_instances = 0;  // of n_instances, those of spheres with small boxes

  std::size_t bytes() const {
    return spheres.capacity() + depth_range.capacity() + cover_histogram.capacity() +
           tile_depth_bound.capacity() + tile_counts.capacity() + sphere_slots.capacity() +
           instance_arena.capacity() + tile_ranges.capacity() + cub_temp.capacity() +
           tile_camera_grads.capacity() + tile_background_grads.capacity();
  }
};

// Byte layout of instance_arena for n instances. Binning: sort keys (uint64) and slots
// (int32), each double-buffered, and the sphere of each slot (int32), 28 bytes per
// instance, the two key buffers at offsets 0 and 8n. After the sort only the maps
// entry_sphere and entry_slot (8 bytes per instance) survive, at offset 0; the
// backward's gradient rows take the space behind them. Peak: 8 + max(20, row bytes) per
// instance, not 28 + row bytes.
struct InstanceArena {
  std::size_t n;
  std::size_t keys_b() const { return 8 * n; }
  std::size_t slots_a() const { return 16 * n; }
  std::size_t slots_b() const { return 20 * n; }
  std::size_t slot_sphere() const { return 24 * n; }
  std::size_t binning_bytes() const { return 28 * n; }
  std::size_t maps_bytes() const { return 8 * n; }
  std::size_t grads() const { return maps_bytes(); }
  std::size_t backward_bytes(std::size_t row_bytes) const { return maps_bytes() + row_bytes * (n > 0 ? n : 1); }
};

// CameraGrad<T> flattened (CameraGrad::to_array).
constexpr int kCameraGradValues = CameraGrad<float>::kValues;

// A sphere whose pixel box holds at most this many pixels is small (count_kernel counts
// their instances); when at least half the instances are small, the backward gives each
// entry 8 or 16 lanes instead of a warp (render_backward.cu).
constexpr int kSmallBoxPixels = 32;

// Per-instance gradient layout: [position 3, radius, opacity, features C].
constexpr int kGpuInstPos = 0, kGpuInstRadius = 3, kGpuInstOpacity = 4, kGpuInstFeatures = 5;

template <typename T>
void cuda_setup_and_bin(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                        cudaStream_t stream, CudaScratch& scratch);
// Per tile of every camera, a depth beyond which no pixel processes a sphere (float
// [B * n_tiles], in scratch), or null when early termination is off.
template <typename T>
const float* cuda_tile_depth_bound(const RendererConfig& config, const SceneArgs& scene,
                                   const RenderOptions& options, cudaStream_t stream, CudaScratch& scratch);
template <typename T>
void cuda_render_forward(const RendererConfig& config, const SceneArgs& scene,
                         const RenderOptions& options, const ForwardOutputs& out, cudaStream_t stream,
                         CudaScratch& scratch);
template <typename T>
void cuda_render_backward(const RendererConfig& config, const SceneArgs& scene,
                          const RenderOptions& options, const BackwardArgs& args,
                          const GradientOutputs& grads, cudaStream_t stream, CudaScratch& scratch);
template <typename T>
void cuda_reduce_gradients(const RendererConfig& config, const SceneArgs& scene,
                           const GradientOutputs& grads, cudaStream_t stream, CudaScratch& scratch);

inline unsigned blocks_for(std::int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

}  // namespace pulsar
