// The CPU backend's persistent scratch and the typed views its stages share.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>

#include "../core/host_buffer.h"
#include "parallel_for.h"
#include "../core/tiling.h"
#include "pulsar/blend.h"
#include "pulsar/camera.h"
#include "pulsar/renderer.h"
#include "pulsar/sphere_setup.h"
#include "../core/scene_view.h"

namespace pulsar {

// One sphere as seen from one camera, prepared once per call (stage 1).
template <typename T>
struct SphereRecord {
  Vec3<T> c;          // perspective: centre - eye (world); orthographic: same in the
                      // camera frame (x_unit, y_unit, z_axis components)
  T dist;             // perspective: |c|; orthographic: unused
  T closest_depth;    // zc, world units
  PixelBounds bounds; // pixels the sphere may hit (clamped to the image)
  PairTerms<T> terms; // per-sphere constants of the pair tests
};

struct CpuScratch {
  int threads = 1;
  // The running call's interrupt check (RenderOptions::interrupt_requested), set by the
  // backend before each stage.
  const std::function<bool()>* interrupt = nullptr;
  Workers workers() const { return Workers{threads, interrupt}; }
  HostBuffer records;       // SphereRecord<T> [B, N]
  HostBuffer order;         // int32 [B, N]: per camera, its visible ids sorted by (zc, id)
                            // at the start of its row (the rest unused)
  HostBuffer tile_offsets;  // int64 [B * n_tiles + 1]: entries of tile (b, t) are
                            // entries[offsets[b*n_tiles+t] .. offsets[b*n_tiles+t+1])
  HostBuffer entries;       // int32 [n_instances]: sphere ids
  std::int64_t n_instances = 0;
  // A camera's binning split into parts (setup_bin.cpp): the parts' sorted runs, int32
  // [B, N], and their tile counts, then cursors, int64 [B, parts, n_tiles].
  HostBuffer merge_runs;
  HostBuffer part_tile_counts;
  HostBuffer depth_keys;  // [B, N] sort keys of the visible spheres (setup_bin.cpp, DepthKey)
  HostBuffer instance_grads;  // T [n_instances, 5 + C]: (pos 3, radius, opacity, features C)
  HostBuffer tile_camera_grads;  // CameraGrad<T> [B * n_tiles]
  HostBuffer tile_background_grads;  // T [B * n_tiles, C]
  HostBuffer pixel_scratch;  // per worker (WorkerRows): the forward's features and tracked
                             // hits, the backward's background gradient
  HostBuffer tile_entries;   // per worker (WorkerRows): its tile's TileEntryArrays
  HostBuffer packed_cameras;  // T [B, 15]: cameras converted from camera vectors (Renderer)
  HostBuffer zero_features;   // T [C] of zeros: a partial render's background

  std::size_t bytes() const {
    return records.capacity() + order.capacity() + tile_offsets.capacity() + entries.capacity() +
           merge_runs.capacity() + part_tile_counts.capacity() + depth_keys.capacity() + instance_grads.capacity() +
           tile_camera_grads.capacity() + tile_background_grads.capacity() + pixel_scratch.capacity() +
           tile_entries.capacity() + packed_cameras.capacity() + zero_features.capacity();
  }
};

// Per-worker rows of a stage's scratch, each starting on a cache line of its own: the
// workers write their rows on every pixel or hit at the same time, and rows sharing a
// line would move it between the cores on each write.
template <typename E>
struct WorkerRows {
  E* base;
  std::size_t stride;  // elements from one row to the next
  E* row(int worker) const { return base + stride * std::size_t(worker); }

  static WorkerRows reserve(HostBuffer& buffer, std::size_t count, int workers, const char* what) {
    constexpr std::size_t kLine = 64;
    static_assert(kLine % sizeof(E) == 0, "a row's element must divide the cache line");
    const std::size_t stride_bytes = (count * sizeof(E) + kLine - 1) / kLine * kLine;
    unsigned char* raw = buffer.reserve<unsigned char>(stride_bytes * std::size_t(workers) + kLine, what);
    const std::uintptr_t at = (reinterpret_cast<std::uintptr_t>(raw) + kLine - 1) / kLine * kLine;
    return WorkerRows{reinterpret_cast<E*>(at), stride_bytes / sizeof(E)};
  }
};

// One work item of the per-tile stages: a (camera, tile) pair and what its pixels share.
template <typename T>
struct TileWork {
  int b;                         // camera
  CameraFrame<T> cam;
  SceneView<T> scene;
  BlendParams<T> blend;
  const SphereRecord<T>* records;  // this camera's [N] records
  std::int64_t first, last;      // the tile's entries: entries[first .. last)
  int x_begin, x_end, y_begin, y_end;  // the tile's pixels (clipped to the image)

  static TileWork of(std::int64_t item, const RendererConfig& config, const SceneArgs& s, const RenderOptions& options,
                     const CpuScratch& scratch) {
    const Tiling::Item at = Tiling::of(config.width, config.height).locate(item);
    TileWork w;
    w.b = at.camera;
    w.cam = camera_of<T>(s, w.b, config.orthographic);
    w.scene = SceneView<T>::of(s, w.b, config.n_channels);
    w.blend = blend_params_of(w.cam, config, options);
    w.records = scratch.records.as<SphereRecord<T>>() + std::int64_t(w.b) * s.n_spheres;
    const auto* offsets = scratch.tile_offsets.as<std::int64_t>();
    w.first = offsets[item];
    w.last = offsets[item + 1];
    w.x_begin = at.x0;
    w.y_begin = at.y0;
    w.x_end = w.x_begin + kTileSize < config.width ? w.x_begin + kTileSize : config.width;
    w.y_end = w.y_begin + kTileSize < config.height ? w.y_begin + kTileSize : config.height;
    return w;
  }
};

// The longest tile list of the binning (entries of one (camera, tile) pair).
inline std::int64_t longest_tile_list(const CpuScratch& scratch, std::int64_t items) {
  const auto* offsets = scratch.tile_offsets.as<std::int64_t>();
  std::int64_t longest = 0;
  for (std::int64_t item = 0; item < items; ++item)
    longest = offsets[item + 1] - offsets[item] > longest ? offsets[item + 1] - offsets[item] : longest;
  return longest;
}

// Per-instance gradient layout of stage 3: [position 3, radius, opacity, features C].
constexpr int kInstPos = 0, kInstRadius = 3, kInstOpacity = 4, kInstFeatures = 5;

// Stages, explicitly instantiated for float and double.
template <typename T>
void cpu_setup_and_bin(const RendererConfig& config, const SceneArgs& scene, CpuScratch& scratch);
template <typename T>
void cpu_render_forward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                        const ForwardOutputs& out, CpuScratch& scratch);
template <typename T>
void cpu_render_backward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                         const BackwardArgs& args, const GradientOutputs& grads, CpuScratch& scratch);
template <typename T>
void cpu_partial_state(const RendererConfig& config, const RenderOptions& options, int batch_size,
                       const ForwardOutputs& out, CpuScratch& scratch);
template <typename T>
void cpu_reduce_gradients(const RendererConfig& config, const SceneArgs& scene, const GradientOutputs& grads,
                          CpuScratch& scratch);

}  // namespace pulsar
