// The CUDA backend's persistent device scratch and the data its stages share.
//
// Binning: the (camera b, sphere i) items are sorted by closest depth zc (ties by item
// index: the sort is stable); in that rank order each item gets a slot range of length
// "tiles stored" (an exclusive scan, sphere_slots), and slot u holds one (tile, sphere)
// instance with sort key b * n_tiles + tile. A stable radix sort of these keys over the
// bits in use keeps every tile's instances in rank order, i.e. by (zc, index);
// tile_ranges then marks each tile's run. A tile stores only the spheres with zc up to
// its depth bound (tile_depth_bound.cu): the ones early termination can let a pixel of
// it reach.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../core/binning_room.h"
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

// Byte layout of depth_order for m = B * N items: uint32 keys (float bits of zc) and int32
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

// The list positions a binning stored: the instance count read back (device_count null),
// or the count on the device, at most the capacity `count`.
__device__ inline std::int64_t stored_count(std::int64_t count, const std::int64_t* device_count) {
  return device_count == nullptr ? count : min(*device_count, count);
}

// With the count on the device (device_count non-null): a count beyond the capacity into
// the renderer's overflow record, as its largest (one thread of the instance sort calls it).
__device__ inline void record_overflow(std::int64_t capacity, const std::int64_t* device_count,
                                       std::int64_t* overflow_record) {
  if (device_count != nullptr && *device_count > capacity)
    atomicMax(reinterpret_cast<unsigned long long*>(overflow_record), static_cast<unsigned long long>(*device_count));
}

// The bits needed to write v (0 for 0).
inline int bit_width(std::uint64_t v) {
  int bits = 0;
  for (; v != 0; v >>= 1) ++bits;
  return bits;
}

// The instance sort by counting (tile_counting_sort.cu) serves a binning of at most
// kMaxCountedSortTiles tiles (all cameras) whose (tile, chunk) count matrix, chunks of
// kSortChunk instances, holds at most kMaxCountedSortCells cells; other binnings sort with
// CUB's radix sort. Each cell is one strided 4-byte write (the counts) and one strided
// read (the scatter), a memory sector each, so the counting's cost grows with the cells,
// the radix sort's only with the instances. Measured on an H200: the counting is the
// faster at W3's 79,000 cells (1024 tiles), the slower over 4096 tiles at 557,000 cells
// (by 4.5 us), 1.1M (15 us) and 1.85M (35 us). 2^18 cells are 131,072 instances over 4096
// tiles or 524,288 over 1024.
constexpr int kMaxCountedSortTiles = 4096;
constexpr int kSortChunk = 2048;
constexpr std::int64_t kMaxCountedSortCells = std::int64_t(1) << 18;

inline int counted_sort_chunks(std::int64_t instances) {
  return int(std::max<std::int64_t>(1, (instances + kSortChunk - 1) / kSortChunk));
}

// Whether a binning of `instances` list positions over `tiles` tiles sorts by counting.
inline bool sorts_instances_by_counting(std::int64_t tiles, std::int64_t instances) {
  return tiles <= kMaxCountedSortTiles && tiles * counted_sort_chunks(instances) <= kMaxCountedSortCells;
}

// The sort key of a (tile, sphere) instance. Its low tile_bits bits hold the tile key
// b * n_tiles + tile, the bits both instance sorts order by. When the sphere index fits in
// the bits above them (packed), it rides there through the sort: the binning then keeps
// no array of each slot's sphere (4 bytes per instance less) and the maps read the sphere
// from the sorted key instead of gathering it by slot. Otherwise the key is the tile key
// alone and the sphere of each slot is stored beside it (InstanceArena::slot_sphere).
struct InstanceKeys {
  int tile_bits = 1;  // at least 1, at most 32 (setup_bin.cu refuses 2^32 tiles)
  bool packed = false;  // then tile_bits < 32

  static InstanceKeys of(std::int64_t total_tiles, std::int64_t n_spheres) {
    InstanceKeys k;
    k.tile_bits = std::max(1, bit_width(std::uint64_t(std::max<std::int64_t>(total_tiles - 1, 0))));
    k.packed =
        k.tile_bits < 32 && k.tile_bits + bit_width(std::uint64_t(std::max<std::int64_t>(n_spheres - 1, 0))) <= 32;
    return k;
  }
  __host__ __device__ std::uint32_t key(std::uint32_t tile_key, std::int32_t sphere) const {
    return packed ? tile_key | (std::uint32_t(sphere) << tile_bits) : tile_key;
  }
  __host__ __device__ std::uint32_t tile(std::uint32_t key) const {
    return key & std::uint32_t((std::uint64_t(1) << tile_bits) - 1u);
  }
  __host__ __device__ std::int32_t sphere(std::uint32_t key) const { return std::int32_t(key >> tile_bits); }
  // The sphere of the instance at slot u whose key is `key`: from the key when packed,
  // else from the binning's array of each slot's sphere.
  __host__ __device__ std::int32_t sphere_of(std::uint32_t key, const std::int32_t* slot_sphere, std::int64_t u) const {
    return packed ? sphere(key) : slot_sphere[u];
  }
};

// Byte layout of instance_arena for n instances. Binning: the sort keys (uint32,
// InstanceKeys) and slots (int32) of the instance sort, each double-buffered, and unless
// the keys are packed the sphere of each slot (int32): 16 or 20 bytes per instance (the
// sort by counting keeps its keys at slots_a and needs no slots: a pair's slot is its
// position). After the sort two int32 maps survive at the start (the sphere and the slot
// of each sorted position: 8 bytes per instance), and the backward's gradient rows take
// the space behind them, one window of slots at a time (RowWindows), from a 256-byte
// boundary so that a row of 32 bytes is one memory sector. A packed arena is 512 bytes
// longer: behind the maps (rounded up to 256 bytes) the rows then get at least 8 n + 256
// bytes, so that four windows of 32-byte rows hold every slot (with 8 n bytes exactly, a
// window rounds down to fewer than n / 4 rows and a fifth would be needed).
struct InstanceArena {
  std::size_t n;
  InstanceKeys keys;  // packed: no slot_sphere

  // The layout of a binning of n list positions for a call's cameras, tiles and spheres:
  // the one the binning writes and its backward reads.
  static InstanceArena of(std::size_t n, const RendererConfig& config, const SceneArgs& scene) {
    const std::int64_t total_tiles = Tiling::of(config.width, config.height).n_tiles() * scene.batch_size;
    return InstanceArena{n, InstanceKeys::of(total_tiles, scene.n_spheres)};
  }
  std::size_t keys_a() const { return 0; }
  std::size_t keys_b() const { return 4 * n; }
  std::size_t slots_a() const { return 8 * n; }
  std::size_t slots_b() const { return 12 * n; }
  std::size_t slot_sphere() const { return 16 * n; }  // unpacked keys only
  std::size_t binning_bytes() const { return keys.packed ? 16 * n + 512 : 20 * n; }
  std::size_t entry_sphere() const { return 0; }
  std::size_t entry_slot() const { return 4 * n; }
  std::size_t maps_bytes() const { return 8 * n; }
  std::size_t rows() const { return (maps_bytes() + 255) / 256 * 256; }
};

// The per-camera words of CudaScratch::camera_words, zeroed per binning, which the setup
// kernel and the tile depth bound fill (uint32; zc > 0, so its float bits order like it).
struct CameraWords {
  static constexpr int kMaxCoverPasses = 4;    // the tile depth bound's cover passes at most (CoverSchedule)
  static constexpr int kLowZc = 0;             // ~bits of the smallest visible zc (max of the complement)
  static constexpr int kHighZc = 1;            // bits of the largest visible zc
  static constexpr int kCoverCandidates = 2;   // nonzero: a visible sphere may cover a tile (may_cover_tiles)
  static constexpr int kUnsettled = 3;         // word kUnsettled + p nonzero: after cover pass p a tile's
                                        // depth bound may fall with deeper spheres
                                        // (tile_depth_bound.cu), p < kMaxCoverPasses - 1
  static constexpr int kMaxBound =
      kUnsettled + kMaxCoverPasses - 1;  // bits of the largest final tile
                                         // depth bound (as for zc, bits order like values >= 0;
                                         // a bound below 0 or NaN, whose bits exceed every
                                         // visible zc's, only turns count_kernel's skip off)
  static constexpr int kChunksSummed = kMaxBound + 1;  // the camera gradient's chunk blocks done
                                                       // (reduce_camera_kernel; back to 0 after)
  static constexpr int kCount = kChunksSummed + 1;  // words per camera
};

struct CudaScratch {
  int device = 0;
  int sm_count = 1;
  DeviceBuffer spheres;  // GpuSphere<T> [B, N]
  DeviceBuffer camera_words;  // uint32 [B, CameraWords::kCount], zeroed per binning
  DeviceBuffer cover_histogram;  // uint64 [B * n_tiles, buckets], then the unsettled tiles' bits
                                 // (UnsettledRows, tile_depth_bound.cu)
  DeviceBuffer tile_depth_bound;  // float [B * n_tiles]: no pixel processes a sphere with larger zc
  DeviceBuffer tile_settled;  // uint8 [B * n_tiles]: 1 once the cover passes so far fix the bound
  // The depth sort of the B * N items (DepthOrder): its double-buffered keys and values,
  // then the item of each rank.
  DeviceBuffer depth_order;
  // int64 [B * N]: tiles stored per item, in rank order (the scan's input); then, from the
  // duplicate kernel on, int2 [B * N]: each item's slots [first, end), by item (item_slots).
  DeviceBuffer tile_counts;
  DeviceBuffer sphere_slots;  // int64 [B * N + 2]: exclusive scan of tile_counts (rank
                              // order), then the count of small-box instances (count_kernel)
  // Everything per (tile, sphere) instance, one allocation in two phases (InstanceArena).
  DeviceBuffer instance_arena;
  DeviceBuffer tile_ranges;  // int2 [B * n_tiles]: [begin, end) of each tile's sorted entries
  DeviceBuffer tile_ends;  // int [B * n_tiles]: entries any pixel of the tile processed (backward)
  DeviceBuffer cub_temp;  // CUB workspace
  DeviceBuffer chunk_tile_counts;  // int32 [tiles, chunks]: the sort by counting's matrix
  DeviceBuffer packed_cameras;  // T [B, 15]: cameras converted from camera vectors (Renderer)
  DeviceBuffer zero_features;  // T [C] of zeros: a partial render's background
  int backward_splits = 1;  // blocks per tile in the last backward (render_backward.cu)
  // Partials per backward block, written in the first backward window, added to in the others.
  DeviceBuffer tile_camera_grads;  // T [B * n_tiles * backward_splits, kCameraGradValues]
  DeviceBuffer tile_background_grads;  // T [B * n_tiles * backward_splits, C]
  DeviceBuffer camera_chunk_sums;  // T [B, chunks, kCameraGradValues] (reduce_gradients.cu)
  // Pinned, read back by a synchronised binning: [0] the instance count, [1] how many of
  // them have a box within their tile of at most kSmallBoxPixels pixels, [2] the overflow
  // record (overflow_record) as it stood.
  std::int64_t* host_count = nullptr;
  cudaEvent_t count_ready = nullptr;  // recorded behind host_count's copy (setup_bin.cu)
  // Pinned: the overflow record as copied behind an unsynchronised binning outside a
  // capture, ready at overflow_ready (read by the next call without waiting).
  std::int64_t* host_overflow = nullptr;
  cudaEvent_t overflow_ready = nullptr;
  bool overflow_pending = false;  // a copy into host_overflow was enqueued and not yet read
  // int64 [1], device memory of its own (never regrown): the largest instance count a
  // binning sized by its capacity could not store, 0 for none. Sticky until the host reads
  // it (CudaBackend::take_overflow).
  std::int64_t* overflow_record = nullptr;
  std::int64_t n_instances = 0;  // instances of the last binning (unsynchronised: not known)
  std::int64_t small_box_instances = 0;  // of n_instances, those with small boxes within their tile
  std::int64_t backward_row_budget = 0;  // RendererConfig::backward_row_budget
  // Instances the binning's lists have room for (InstanceArena's n): the count read back
  // by a synchronised binning, the capacity of an unsynchronised one.
  std::int64_t list_room = 0;
  // The instances the lists hold as far as the host knows: the count read back (at most
  // list_room: a count that outgrew its room is binned again), else the room.
  std::int64_t listed_instances() const { return n_instances >= 0 ? n_instances : list_room; }
  // Instance capacity (docs/design.md, "Capture"): fixed_capacity > 0 sizes every binning
  // (none synchronises); under stream capture, learnt_capacity, grown from the counts read
  // back; otherwise the room eager_room gives from those counts (0: the binning reads its
  // count back before it builds its lists), and 0 for a binning that repeats one whose
  // count outgrew its room (rebin_pending).
  std::int64_t fixed_capacity = 0;
  std::int64_t learnt_capacity = 0;
  BinningRoom eager_room;
  bool rebin_pending = false;
  // The last binning's counts on the device when it was sized by its capacity (its
  // launches are gated on them: LaunchGate); null after a synchronised binning, and after
  // cuda_settle_binning has read them back.
  const std::int64_t* device_counts = nullptr;
  // A binning sized by eager_room whose counts are on their way to host_count and not yet
  // read (cuda_settle_binning reads them once the lists' launches are enqueued).
  bool counts_settle = false;
  bool allocations_kept = false;  // set at the first capture: keep_allocations on every buffer
  bool binning_captured = false;  // the last binning's stream was being captured
  // Between cuda_begin_binning and cuda_finish_binning: the item of each rank (in one of
  // depth_order's buffers; null when no binning is in flight) and the tile depth bounds
  // (null: none).
  const std::int32_t* pending_order = nullptr;
  const float* pending_bound = nullptr;

  // The maps binning leaves (InstanceArena, whose maps lie where they do whatever the
  // keys; tile_counts).
  std::int32_t* entry_sphere() const { return arena_map(maps_layout().entry_sphere()); }
  std::int32_t* entry_slot() const { return arena_map(maps_layout().entry_slot()); }
  InstanceArena maps_layout() const { return InstanceArena{std::size_t(list_room), InstanceKeys{}}; }
  int2* item_slots() const { return tile_counts.as<int2>(); }

  std::int32_t* arena_map(std::size_t offset) const {
    return reinterpret_cast<std::int32_t*>(instance_arena.as<unsigned char>() + offset);
  }

  template <typename Fn>
  void for_each_buffer(Fn fn) {
    for (DeviceBuffer* b :
         {&spheres, &camera_words, &cover_histogram, &tile_depth_bound, &tile_settled, &depth_order, &tile_counts,
          &sphere_slots, &instance_arena, &tile_ranges, &tile_ends, &cub_temp, &chunk_tile_counts, &packed_cameras,
          &tile_camera_grads, &tile_background_grads, &camera_chunk_sums, &zero_features})
      fn(*b);
  }

  std::size_t bytes() const {
    std::size_t total = 0;
    const_cast<CudaScratch*>(this)->for_each_buffer([&](const DeviceBuffer& b) { total += b.capacity(); });
    return total;
  }
};

// Whether a launch runs, decided on the device. A binning sized by its capacity leaves
// its counts on the device, where the host cannot pick between two kernels by them; it
// launches both, each gated by the rule the host applies to counts it read back, and the
// one whose rule fails leaves at once. Null counts: the host chose, the launch runs.
struct LaunchGate {
  enum Rule : int {
    kLargeBoxes,  // fewer than half the instances have small boxes (kSmallBoxPixels)
    kSmallBoxes,  // at least half do
    kManyRows,  // at least 3 instances per (camera, sphere) item on average
    kFewRows,  // fewer
  };
  const std::int64_t* counts = nullptr;  // [0] instances, [1] small-box instances
  Rule rule = kLargeBoxes;
  std::int64_t items = 0;  // (camera, sphere) items, for kManyRows and kFewRows

  static LaunchGate of(const CudaScratch& scratch, Rule rule, std::int64_t items = 0);
  __host__ __device__ static bool large_boxes(std::int64_t instances, std::int64_t small) {
    return small * 2 < instances;
  }
  __host__ __device__ static bool many_rows(std::int64_t instances, std::int64_t items) {
    return instances >= 3 * items;
  }
  __device__ bool open() const {
    if (counts == nullptr) return true;
    switch (rule) {
      case kLargeBoxes: return large_boxes(counts[0], counts[1]);
      case kSmallBoxes: return !large_boxes(counts[0], counts[1]);
      case kManyRows: return many_rows(counts[0], items);
      default: return !many_rows(counts[0], items);
    }
  }
};

inline LaunchGate LaunchGate::of(const CudaScratch& scratch, Rule rule, std::int64_t items) {
  LaunchGate gate;
  gate.counts = scratch.device_counts;
  gate.rule = rule;
  gate.items = items;
  return gate;
}

// The backward stores one gradient row per instance, by slot, for a window of slots at a
// time: it renders every tile's entries with slots in the window (a run of each tile's
// list: slots ascend with depth rank, as the lists do), reduces the window's rows into
// the sphere gradients (adding to the windows before), and reuses the rows. The rows of
// a window may take the arena's binning space behind the maps (12 bytes per instance),
// so that a backward needs no more memory than its binning did, or kMinRowBytes when that
// is more. Each further window costs a launch, a pass over the spheres and the staging of
// its tiles again, so all rows up to kOneWindowRowBytes take one window (scratch beyond
// the binning's, bounded by that constant).
struct RowWindows {
  static constexpr std::int64_t kMinRowBytes = std::int64_t(128) << 20;
  static constexpr std::int64_t kOneWindowRowBytes = std::int64_t(256) << 20;
  std::int64_t count = 1;  // windows (at least one, so that an empty scene still writes zeros)
  std::int64_t size = 0;  // slots per window

  // budget: bytes of rows per window, 0 for the default.
  static RowWindows of(const InstanceArena& layout, std::int64_t row_bytes, std::int64_t budget) {
    RowWindows w;
    const std::int64_t n_instances = std::int64_t(layout.n);
    if (budget <= 0) {
      budget = n_instances * row_bytes <= kOneWindowRowBytes
                   ? kOneWindowRowBytes
                   : std::max<std::int64_t>(std::int64_t(layout.binning_bytes() - layout.rows()), kMinRowBytes);
    }
    const std::int64_t per_window = std::max<std::int64_t>(1, budget / row_bytes);
    w.count = std::max<std::int64_t>(1, (n_instances + per_window - 1) / per_window);
    w.size = (n_instances + w.count - 1) / w.count;
    return w;
  }
};

// CameraGrad<T> flattened (CameraGrad::to_array).
constexpr int kCameraGradValues = CameraGrad<float>::kValues;

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

// Stage 1 in two calls (backend.h): the first enqueues setup, the depth sort, the tile
// depth bound, the tile counts and their scan and the instance count's read-back; the
// second builds the lists, sized by the count (for which it waits: the one host
// synchronisation of a binning) or by a capacity (eager_room: the wait comes after the
// lists' launches, cuda_settle_binning).
template <typename T>
void cuda_begin_binning(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                        cudaStream_t stream, CudaScratch& scratch);
template <typename T>
void cuda_finish_binning(const RendererConfig& config, const SceneArgs& scene, cudaStream_t stream,
                         CudaScratch& scratch);
// The arrays a call writes NaN over when its outputs would be silently wrong: its binning,
// sized by a capacity, overflowed it (its lists miss instances), or its values
// (RenderOptions::values, which no host read) are out of range.
struct OverflowTargets {
  static constexpr int kMax = 6;
  void* values[kMax] = {};
  std::int64_t sizes[kMax] = {};  // elements of T
  int count = 0;
  void add(void* p, std::int64_t n) {
    if (p != nullptr && n > 0 && count < kMax) {
      values[count] = p;
      sizes[count++] = n;
    }
  }
};
// After a binning sized by its capacity (scratch.device_counts non-null) or a call with
// values (options.values): NaN over the targets if its count on the device exceeded the
// capacity or its values are out of range (call_values_valid; one launch; nothing for a
// binning that read its count back and a call without values).
template <typename T>
void cuda_nan_on_failure(const CudaScratch& scratch, const RenderOptions& options, const OverflowTargets& targets,
                         cudaStream_t stream);
// Outside a capture: reads the overflow record an earlier unsynchronised binning copied
// back, if the copy is done (no waiting), and throws for a recorded overflow.
void cuda_check_overflow_copy(CudaScratch& scratch, cudaStream_t stream);
// After cuda_finish_binning of a binning sized by eager_room: waits for its counts
// (copied behind the tile counts' scan) and returns whether they outgrew the room, so
// that the caller bins again (that binning reads its count back before it builds its
// lists); otherwise the counts are the host's from here on, as after a synchronised
// binning, and the stages that read the lists pick their kernels by them. False, without
// waiting, for any other binning.
bool cuda_settle_binning(CudaScratch& scratch, cudaStream_t stream);
// After an overflow record of `needed` instances was read back: zeroes the record on
// `stream` and grows a learnt capacity to hold the count; returns the capacity the
// overflowing call had (for the error).
std::int64_t clear_overflow_record(CudaScratch& scratch, std::int64_t needed, cudaStream_t stream);
// The instance sort by counting (tile_counting_sort.cu): from the sort key of each list
// position below the stored count (count, or at most *device_count when non-null) and,
// unless the keys are packed, the sphere of each slot (else null), the sorted maps
// (entry_sphere, entry_slot), the tile ranges of the tiles with instances, and with the
// count on the device its overflow record.
void cuda_sort_instances_by_counting(std::int64_t count, const std::int64_t* device_count, const std::uint32_t* keys,
                                     InstanceKeys key_layout, const std::int32_t* slot_sphere, int tiles,
                                     cudaStream_t stream, CudaScratch& scratch);
// The cover histogram of the tile depth bound (tile_depth_bound.cu): count uint64 words
// to be zeroed before cuda_tile_depth_bound (the binning's zeroing launch takes them), or
// none (buckets 0) when this call's bounds do not cut.
struct CoverHistogram {
  unsigned long long* words = nullptr;
  std::size_t count = 0;
  int buckets = 0;
};
CoverHistogram cuda_reserve_cover_histogram(const RendererConfig& config, const SceneArgs& scene,
                                            const RenderOptions& options, CudaScratch& scratch);
// Per tile of every camera, a depth beyond which no pixel processes a sphere (float
// [B * n_tiles], in scratch), or null when early termination is off. zeroed: the call's
// cover histogram, all zero; order: the item of each rank of the depth sort; rank_keys:
// the sorted keys (float bits of zc, invisible items all ones).
template <typename T>
const float* cuda_tile_depth_bound(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                                   cudaStream_t stream, CudaScratch& scratch, const CoverHistogram& zeroed,
                                   const std::int32_t* order, const std::uint32_t* rank_keys);
template <typename T>
void cuda_render_forward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                         const ForwardOutputs& out, cudaStream_t stream, CudaScratch& scratch);
template <typename T>
void cuda_render_backward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                          const BackwardArgs& args, const GradientOutputs& grads, cudaStream_t stream,
                          CudaScratch& scratch);
// Sums the rows of slots [lo, hi) (rows[u - lo], 5 + C values each) into the caller's
// sphere gradient arrays: written when first, else added, so that windows reduce in a
// fixed order (render_backward.cu calls it once per window). The rows are overwritten
// (with a static channel count, each item's first row takes its sum).
template <typename T>
void cuda_reduce_sphere_rows(const RendererConfig& config, const SceneArgs& scene, const GradientOutputs& grads,
                             cudaStream_t stream, const CudaScratch& scratch, T* rows, std::int64_t lo, std::int64_t hi,
                             bool first);
// After reduce_gradients: NaN over every requested gradient (cameras as packed [B, 15])
// as cuda_nan_on_failure decides.
template <typename T>
void cuda_gradients_nan_on_failure(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                                   const GradientOutputs& grads, cudaStream_t stream, const CudaScratch& scratch);
// A partial render's last step (backend.h, partial_state).
template <typename T>
void cuda_partial_state(const RendererConfig& config, const RenderOptions& options, int batch_size,
                        const ForwardOutputs& out, cudaStream_t stream);
// Sums the camera and background partials into the caller's arrays.
template <typename T>
void cuda_reduce_gradients(const RendererConfig& config, const SceneArgs& scene, const GradientOutputs& grads,
                           cudaStream_t stream, CudaScratch& scratch);

inline unsigned blocks_for(std::int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

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
