// The CUDA backend's per-call memory and the data its stages share.
//
// Binning: the (camera b, sphere i) items are sorted by closest depth zc (ties by item
// index: the sort is stable); in that rank order each item gets a slot range of length
// "tiles stored" (an exclusive scan, sphere_slots), and slot u holds one (tile, sphere)
// instance with sort key b * n_tiles + tile. A stable radix sort of these keys over the
// bits in use keeps every tile's instances in rank order, i.e. by (zc, index);
// tile_ranges then marks each tile's run. A tile stores only the spheres with zc up to
// its depth bound (tile_depth_bound.cu): the ones early termination can let a pixel of
// it reach.
//
// Memory: every array of a call lives in the caller's two buffers (CallMemory): the
// binning (BinningView), which a forward writes and its backward reads, and a workspace
// for the call alone (ForwardWorkspace, then BackwardWorkspace over the same bytes). The
// instance count stays on the device (sphere_slots[items]); every array sized by it is
// sized by the call's capacity instead, and the kernels after the count read it there,
// so a call enqueues without waiting for the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../core/scene_view.h"
#include "../core/tiling.h"
#include "cuda_check.h"
#include "pulsar/camera.h"
#include "pulsar/renderer.h"
#include "pulsar/intersection.h"
#include "pulsar/sphere_setup.h"

namespace pulsar {

// One sphere as seen from one camera (stage 1), what the render kernels load per entry.
// The first fields are what every pixel tests before anything else (one 16-byte load
// in float32); the geometry follows. Aligned to 16 bytes so that it is written and read
// in 16-byte accesses (load_sphere, store_sphere), not in a dozen narrow ones per record.
template <typename T>
struct alignas(16) GpuSphere {
  T closest_depth;              // zc, world units
  std::int16_t x0, y0, x1, y1;  // inclusive pixel bounds (empty: x0 > x1)
  T cx, cy, cz;      // perspective: centre - eye (world); orthographic: camera-frame coords
  T dist;            // |centre - eye|
  T radius, opacity;
  PairTerms<T> terms;  // per-sphere constants of the pair tests
};

// A record read and written in 16-byte accesses: the compiler splits the first 16 bytes,
// which mix float and int16 fields, into four narrow ones otherwise.
template <typename T>
union GpuSphereWords {
  GpuSphere<T> sphere;
  int4 words[sizeof(GpuSphere<T>) / 16];
};
template <typename T>
__device__ inline GpuSphere<T> load_sphere(const GpuSphere<T>* at) {
  GpuSphereWords<T> u;
  const int4* src = reinterpret_cast<const int4*>(at);
#pragma unroll
  for (int k = 0; k < int(sizeof(u.words) / 16); ++k) u.words[k] = src[k];
  return u.sphere;
}
template <typename T>
__device__ inline void store_sphere(GpuSphere<T>* at, const GpuSphere<T>& g) {
  GpuSphereWords<T> u;
  u.sphere = g;
  int4* dst = reinterpret_cast<int4*>(at);
#pragma unroll
  for (int k = 0; k < int(sizeof(u.words) / 16); ++k) dst[k] = u.words[k];
}

// Byte layout of the depth sort for m = B * N items: uint32 keys (float bits of zc) and int32
// values (item indices), each double-buffered, 16 bytes per item. After the sort the
// values' current buffer holds the item of each depth rank.
struct DepthOrder {
  std::size_t m;
  std::size_t keys_a() const { return 0; }
  std::size_t keys_b() const { return 4 * m; }
  std::size_t values_a() const { return 8 * m; }
  std::size_t values_b() const { return 12 * m; }
  std::size_t bytes() const { return 16 * m; }
};

// Byte layout of the instance sort for a capacity of n instances: the tile keys (uint32)
// and slots (int32), each double-buffered, and the sphere of each slot (int32): 20 bytes
// per instance. Keys past the instance count hold all ones (zero_binning_kernel), so that
// a sort over the whole capacity leaves them behind every tile's run.
struct InstanceSort {
  std::size_t n;
  std::size_t keys_a() const { return 0; }
  std::size_t keys_b() const { return 4 * n; }
  std::size_t slots_a() const { return 8 * n; }
  std::size_t slots_b() const { return 12 * n; }
  std::size_t slot_sphere() const { return 16 * n; }
  std::size_t bytes() const { return 20 * n; }
};

// The per-camera words of the forward workspace, zeroed per binning, which the setup
// kernel and the tile depth bound fill (uint32; zc > 0, so its float bits order like it).
struct CameraWords {
  static constexpr int kMaxCoverPasses = 4;    // the tile depth bound's cover passes at most (CoverSchedule)
  static constexpr int kLowZc = 0;             // ~bits of the smallest visible zc (max of the complement)
  static constexpr int kHighZc = 1;            // bits of the largest visible zc
  static constexpr int kCoverCandidates = 2;   // nonzero: a visible sphere may cover a tile (may_cover_tiles)
  static constexpr int kUnsettled = 3;         // word kUnsettled + p nonzero: after cover pass p a tile's
                                               // depth bound may fall with deeper spheres
                                               // (tile_depth_bound.cu), p < kMaxCoverPasses - 1
  static constexpr int kMaxBound = kUnsettled + kMaxCoverPasses - 1;  // bits of the largest final tile
                                               // depth bound (as for zc, bits order like values >= 0;
                                               // a bound below 0 or NaN, whose bits exceed every
                                               // visible zc's, only turns count_kernel's skip off)
  static constexpr int kCount = kMaxBound + 1;  // words per camera
};

// Bits of a binning's flags word: why its call's outputs are NaN.
enum BinningFlag : std::uint32_t {
  kBinningOverflowed = 1u,  // more instances than the capacity: the lists are incomplete
  kInvalidValues = 2u,      // RenderOptions::values out of range
};

// The renderer's record on the device of what its calls found (RendererStatus), kept
// across calls: counters, so that a reader tells new events from ones it has seen.
struct DeviceStatus {
  unsigned long long max_instances;
  unsigned int overflows;        // binnings that overflowed their capacity
  unsigned int invalid_values;   // calls whose values were out of range
};

// What one binning reports to the host (pinned memory the device writes, ReportSlots):
// its instance count and small-box count, and the renderer's status as it stood then.
struct BinningReportWords {
  long long instances;
  long long small_box_instances;
  DeviceStatus status;
  unsigned int written;  // nonzero once the device wrote this report
};

// Slots of pinned, device-mapped memory for BinningReportWords, one per call in turn, so that
// a report is read after its own call whatever other calls of the renderer run meanwhile.
constexpr int kReportSlots = 16;

// Hands out aligned pieces of one buffer in order; with no buffer it only counts the bytes
// (the same code sizes a layout and carves it).
class Carver {
 public:
  explicit Carver(void* base = nullptr) : base_(static_cast<unsigned char*>(base)) {}
  template <typename E>
  E* take(std::size_t count) {
    used_ = (used_ + kAlign - 1) / kAlign * kAlign;
    E* at = base_ ? reinterpret_cast<E*>(base_ + used_) : nullptr;
    used_ += count * sizeof(E);
    return at;
  }
  std::size_t bytes() const { return (used_ + kAlign - 1) / kAlign * kAlign; }

 private:
  static constexpr std::size_t kAlign = 256;  // a row of 32 bytes is one memory sector
  unsigned char* base_;
  std::size_t used_ = 0;
};

// The sizes of one call's arrays.
struct CallSizes {
  int batch = 1;                  // B
  std::int64_t items = 0;         // B * N (camera, sphere) items
  std::int64_t total_tiles = 0;   // B * tiles per image
  std::int64_t capacity = 0;      // instances the binning has room for
  std::size_t sphere_bytes = 0;   // sizeof(GpuSphere<T>)
  std::size_t value_bytes = 0;    // sizeof(T)
  int channels = 0;               // C
};

// The packed cameras of a call converted from camera vectors, and in a backward their
// gradient (T [2, B, 15]): first in the workspace of either stage, so that the renderer
// finds them at the workspace's start (Renderer::with_packed_cameras).
inline unsigned char* carve_packed_cameras(Carver& c, const CallSizes& z) {
  return c.take<unsigned char>(2 * std::size_t(z.batch) * CAMERA_PARAMS * z.value_bytes);
}

// The binning in the caller's memory: what the forward's binning writes and every later
// stage, the backward's included, reads.
struct BinningView {
  std::uint32_t* flags = nullptr;        // BinningFlag bits of this call
  unsigned char* spheres = nullptr;      // GpuSphere<T> [items]
  // int64 [items + 2]: the exclusive scan of the tiles each depth rank stores (the slots
  // of rank r are [sphere_slots[r], sphere_slots[r + 1])); [items] is the instance count,
  // [items + 1] how many instances have a box within their tile of at most
  // kSmallBoxPixels pixels (count_kernel).
  std::int64_t* sphere_slots = nullptr;
  int2* item_slots = nullptr;            // [items]: each item's slots [first, end), by item
  int2* tile_ranges = nullptr;           // [total_tiles]: [begin, end) of each tile's sorted entries
  // The lists (CallMemory::entries): [capacity] each.
  std::int32_t* entry_sphere = nullptr;  // the sphere of each sorted position
  std::int32_t* entry_slot = nullptr;    // the slot of each sorted position
  std::int64_t items = 0, capacity = 0;

  const std::int64_t* instances() const { return sphere_slots + items; }
  template <typename T>
  GpuSphere<T>* spheres_as() const { return reinterpret_cast<GpuSphere<T>*>(spheres); }

  // The binning buffer's arrays from `c`, the lists from `entries` ([2, capacity]).
  static BinningView carve(Carver& c, const CallSizes& z, std::int32_t* entries) {
    BinningView v;
    v.flags = c.take<std::uint32_t>(4);
    v.spheres = c.take<unsigned char>(std::size_t(z.items) * z.sphere_bytes);
    v.sphere_slots = c.take<std::int64_t>(std::size_t(z.items) + 2);
    v.item_slots = c.take<int2>(std::size_t(z.items));
    v.tile_ranges = c.take<int2>(std::size_t(z.total_tiles));
    v.entry_sphere = entries;
    v.entry_slot = entries ? entries + z.capacity : nullptr;
    v.items = z.items;
    v.capacity = z.capacity;
    return v;
  }
};

// The binning's scratch, in the call's workspace.
struct ForwardWorkspace {
  std::uint32_t* camera_words = nullptr;         // [B, CameraWords::kCount], zeroed per binning
  unsigned char* depth_order = nullptr;          // DepthOrder of the items
  // int64 [items]: tiles stored per item, in rank order (the scan's input).
  std::int64_t* tile_counts = nullptr;
  unsigned long long* cover_histogram = nullptr; // [cover_words]: tile_depth_bound.cu's histogram and
                                                 // unsettled-tile bits
  std::size_t cover_words = 0;
  float* tile_depth_bound = nullptr;             // [total_tiles]: no pixel processes a sphere with larger zc
  std::uint8_t* tile_settled = nullptr;          // [total_tiles]: 1 once the cover passes so far fix the bound
  unsigned char* instance_sort = nullptr;        // InstanceSort of the capacity
  unsigned char* cub_temp = nullptr;             // CUB's workspace
  std::size_t cub_bytes = 0;
  unsigned char* packed_cameras = nullptr;       // T [2, B, 15]: cameras converted from camera vectors
  unsigned char* zero_features = nullptr;        // T [C] of zeros: a partial render's background

  static ForwardWorkspace carve(Carver& c, const CallSizes& z, std::size_t cover_words, std::size_t cub_bytes) {
    ForwardWorkspace w;
    w.packed_cameras = carve_packed_cameras(c, z);
    w.camera_words = c.take<std::uint32_t>(std::size_t(CameraWords::kCount) * std::size_t(z.batch));
    w.depth_order = c.take<unsigned char>(DepthOrder{std::size_t(z.items)}.bytes());
    w.tile_counts = c.take<std::int64_t>(std::size_t(z.items));
    w.cover_histogram = c.take<unsigned long long>(cover_words);
    w.cover_words = cover_words;
    w.tile_depth_bound = c.take<float>(std::size_t(z.total_tiles));
    w.tile_settled = c.take<std::uint8_t>(std::size_t(z.total_tiles));
    w.instance_sort = c.take<unsigned char>(InstanceSort{std::size_t(z.capacity)}.bytes());
    w.cub_temp = c.take<unsigned char>(cub_bytes);
    w.cub_bytes = cub_bytes;
    w.zero_features = c.take<unsigned char>(std::size_t(z.channels) * z.value_bytes);
    return w;
  }
};

// The backward stores one gradient row per instance, by slot, for a window of slots at a
// time: it renders every tile's entries with slots in the window (a run of each tile's
// list: slots ascend with depth rank, as the lists do), reduces the window's rows into
// the sphere gradients (adding to the windows before), and reuses the rows. The windows
// are laid over the capacity; a window that starts past the call's instance count (read
// on the device) returns at once. All rows up to kOneWindowRowBytes take one window, so
// that the sums do not depend on the capacity; beyond it a window takes the forward
// workspace's room (the instance sort's 20 bytes per instance), so that the backward
// needs no more memory than its forward, at least kMinRowBytes. Each further window costs
// a launch, a pass over the spheres and the staging of its tiles again.
struct RowWindows {
  static constexpr std::int64_t kMinRowBytes = std::int64_t(128) << 20;
  static constexpr std::int64_t kOneWindowRowBytes = std::int64_t(256) << 20;
  std::int64_t count = 1;  // windows (at least one, so that an empty scene still writes zeros)
  std::int64_t size = 1;   // slots per window

  // budget: bytes of rows per window, 0 for the default.
  static RowWindows of(std::int64_t capacity, std::int64_t row_bytes, std::int64_t budget) {
    RowWindows w;
    if (budget <= 0) {
      budget = capacity * row_bytes <= kOneWindowRowBytes
                   ? kOneWindowRowBytes
                   : std::max<std::int64_t>(std::int64_t(InstanceSort{std::size_t(capacity)}.bytes()), kMinRowBytes);
    }
    const std::int64_t per_window = std::max<std::int64_t>(1, budget / row_bytes);
    w.count = std::max<std::int64_t>(1, (capacity + per_window - 1) / per_window);
    w.size = std::max<std::int64_t>(1, std::min(capacity, per_window));
    return w;
  }
};

// Backward blocks per tile: enough for about four waves of four blocks per SM, at most 4,
// so that an image of few tiles still fills the GPU.
inline int backward_splits_of(std::int64_t total_tiles, int sm_count) {
  const std::int64_t wave = 4 * std::int64_t(sm_count);
  return int(std::min<std::int64_t>(4, std::max<std::int64_t>(1, (4 * wave + total_tiles - 1) / total_tiles)));
}

// The backward's scratch, over the call's workspace (the forward's is no longer needed).
struct BackwardWorkspace {
  unsigned char* rows = nullptr;          // T [window size, 5 + C]
  int* tile_ends = nullptr;               // [total_tiles]: entries any pixel of the tile processed (windows > 1)
  unsigned char* tile_camera = nullptr;   // T [total_tiles * splits, kCameraGradValues]
  unsigned char* tile_background = nullptr;  // T [total_tiles * splits, C]
  unsigned char* camera_chunk_sums = nullptr;  // T [B, kCameraChunks, kCameraGradValues]
  unsigned char* packed_cameras = nullptr;     // T [2, B, 15]: packed cameras, then their gradient

  static BackwardWorkspace carve(Carver& c, const CallSizes& z, const RowWindows& windows, int splits);
};

// CameraGrad<T> flattened (CameraGrad::to_array).
constexpr int kCameraGradValues = CameraGrad<float>::kValues;

// The camera reduction's first step splits a camera's tile rows into at most this many
// chunks (reduce_gradients.cu).
constexpr int kCameraChunks = 32;

// Shared memory a block may use without opting in to more (static allocations, and the
// render kernels' launches with dynamic memory), bytes.
constexpr std::size_t kSharedBytesWithoutOptIn = 48 * 1024;

// An instance whose sphere's box within its tile holds at most this many pixels is small
// (count_kernel counts them); when at least half the instances are small, the backward
// gives each entry 8 or 16 lanes instead of a warp (render_backward.cu), and the forward
// keeps one pixel per thread (render_forward.cu). Counted within the tile, not over the
// whole box: the backward's lanes walk the box cut at the tile's edges, which holds
// fewer pixels than the box wherever a sphere straddles tiles.
constexpr int kSmallBoxPixels = 32;

// Per-instance gradient layout: [position 3, radius, opacity, features C].
constexpr int kGpuInstPos = 0, kGpuInstRadius = 3, kGpuInstOpacity = 4, kGpuInstFeatures = 5;

// Everything of one call the stages share: the binning, the workspace (as the stage at
// hand carves it), the report slot and the device's constants.
struct CudaCall {
  BinningView binning;
  ForwardWorkspace forward;
  BackwardWorkspace backward;
  CallSizes sizes;
  int sm_count = 1;
  int backward_splits = 1;
  std::int64_t backward_row_budget = 0;  // RendererConfig::backward_row_budget
  DeviceStatus* status = nullptr;        // the renderer's (device memory)
  BinningReportWords* report = nullptr;  // this call's report slot (device-mapped pinned memory), or null
  // Between the two halves of the binning: the item of each depth rank (in the
  // workspace's DepthOrder) and the tile depth bounds (null: none).
  const std::int32_t* depth_order = nullptr;
  const float* depth_bound = nullptr;
  // kSmallBoxVariant or kLargeBoxVariant where the host knows the binning's counts (a
  // verified call): the one forward kernel to launch; -1: the device chooses.
  int forward_variant = -1;
};

inline BackwardWorkspace BackwardWorkspace::carve(Carver& c, const CallSizes& z, const RowWindows& windows, int splits) {
  BackwardWorkspace w;
  const std::size_t row_values = std::size_t(kGpuInstFeatures + z.channels);
  const std::size_t partial_rows = std::size_t(z.total_tiles) * std::size_t(splits);
  w.packed_cameras = carve_packed_cameras(c, z);
  w.rows = c.take<unsigned char>(std::size_t(windows.size) * row_values * z.value_bytes);
  w.tile_ends = c.take<int>(windows.count > 1 ? std::size_t(z.total_tiles) : 0);
  w.tile_camera = c.take<unsigned char>(partial_rows * kCameraGradValues * z.value_bytes);
  w.tile_background = c.take<unsigned char>(partial_rows * std::size_t(z.channels) * z.value_bytes);
  w.camera_chunk_sums = c.take<unsigned char>(std::size_t(z.batch) * kCameraChunks * kCameraGradValues * z.value_bytes);
  return w;
}

// Stage 1 in two halves, each enqueued without a host synchronisation: up to the
// instance count (and its report, where call.report is set; with count_only, no more);
// then the tiles' lists, their sort over sort_items positions (the capacity, or the count
// where the host has read it).
template <typename T>
void cuda_bin_count(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                    cudaStream_t stream, CudaCall& call, bool count_only);
template <typename T>
void cuda_bin_lists(const RendererConfig& config, const SceneArgs& scene, cudaStream_t stream, const CudaCall& call,
                    std::int64_t sort_items);
// The CUB workspace of a binning of `items` items with room for `capacity` instances.
std::size_t cub_binning_bytes(std::int64_t items, std::int64_t capacity, std::int64_t total_tiles);
// Per tile of every camera, a depth beyond which no pixel processes a sphere (float
// [B * n_tiles], in the workspace), or null when early termination is off. order: the
// item of each rank of the depth sort; rank_keys: the sorted keys (float bits of zc,
// invisible items all ones).
template <typename T>
const float* cuda_tile_depth_bound(const RendererConfig& config, const SceneArgs& scene,
                                   const RenderOptions& options, cudaStream_t stream, CudaCall& call,
                                   const std::int32_t* order, const std::uint32_t* rank_keys);
// The histogram words cuda_tile_depth_bound needs for B cameras (0: it makes no bound).
std::size_t tile_depth_bound_words(const RendererConfig& config, int batch_size);
template <typename T>
void cuda_render_forward(const RendererConfig& config, const SceneArgs& scene,
                         const RenderOptions& options, const ForwardOutputs& out, cudaStream_t stream,
                         const CudaCall& call);
template <typename T>
void cuda_render_backward(const RendererConfig& config, const SceneArgs& scene,
                          const RenderOptions& options, const BackwardArgs& args,
                          const GradientOutputs& grads, cudaStream_t stream, CudaCall& call);
// Sums the rows of slots [lo, hi) (rows[u - lo], 5 + C values each) into the caller's
// sphere gradient arrays: written when first, else added, so that windows reduce in a
// fixed order (render_backward.cu calls it once per window). The rows are overwritten
// (with a static channel count, each item's first row takes its sum).
template <typename T>
void cuda_reduce_sphere_rows(const RendererConfig& config, const SceneArgs& scene,
                             const GradientOutputs& grads, cudaStream_t stream, const CudaCall& call,
                             T* rows, std::int64_t lo, std::int64_t hi, bool first);
// A partial render's last step (backend.h, partial_state).
template <typename T>
void cuda_partial_state(const RendererConfig& config, const RenderOptions& options, int batch_size,
                        const ForwardOutputs& out, cudaStream_t stream);
// Sums the camera and background partials into the caller's arrays.
template <typename T>
void cuda_reduce_gradients(const RendererConfig& config, const SceneArgs& scene,
                           const GradientOutputs& grads, cudaStream_t stream, const CudaCall& call);

// Whether a call's lists are unusable (BinningFlag bits set): its outputs are NaN.
__device__ inline bool binning_failed(const std::uint32_t* flags) { return *flags != 0u; }

// Small boxes: at least half of a binning's instances have a box within their tile of at
// most kSmallBoxPixels pixels (counts: BinningView::instances(), then the small-box count).
// Read on the device by the kernels whose variant it chooses: the host never waits for it.
__device__ inline bool small_boxes(const std::int64_t* counts) { return 2 * counts[1] >= counts[0]; }

// Which of two kernel variants a launch is, where both are launched and the binning's
// counts choose the one that runs (the other returns at once).
constexpr int kAnyBoxes = 0, kSmallBoxVariant = 1, kLargeBoxVariant = 2;
__device__ inline bool variant_runs(int variant, const std::int64_t* counts) {
  return variant == kAnyBoxes || small_boxes(counts) == (variant == kSmallBoxVariant);
}

inline unsigned blocks_for(std::int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

// Camera and sphere of item = camera * n + sphere. Items stay below 2^31
// (cuda_setup_and_bin's limit), so 32-bit division serves (64-bit division is a long
// software routine on the GPU).
struct ItemIndex {
  int camera;
  std::int32_t sphere;
};
__device__ inline ItemIndex split_item(std::int64_t item, std::int64_t n) {
  const unsigned u = unsigned(item), un = unsigned(n);
  const unsigned camera = u / un;
  return {int(camera), std::int32_t(u - camera * un)};
}

}  // namespace pulsar
