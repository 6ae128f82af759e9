// Stage 1b on CUDA: per tile, a depth beyond which no pixel of the tile processes any
// sphere, so that binning stores only the (tile, sphere) instances early termination can
// reach (docs/model.md section 6). Large spheres otherwise touch dozens of tiles each and
// most of those instances lie far behind where every pixel stops.
//
// Why it is exact: let S be spheres that certainly hit every pixel of a tile, each with
// zc at most E and weight at least w_i there. A pixel that reaches an entry with
// zc > E has processed all of S (they come earlier in its list and are hits), so its
// total weight is at least W = exp(s_bg) + sum w_i and its termination depth at most
// tau(W) (termination depth falls as weight grows). It stops at any entry with
// zc > max(E, tau(W)). Taking S = the certain spheres of the first k depth buckets gives
// one bound per k; the tile keeps the smallest, plus a margin for rounding.
//
// Certain spheres and their weights come from covered_closeness (tile_cover.h) at the
// tile's corner pixels; the depth of a hit is at most o1 <= t (perspective) or |cz|
// (orthographic), which bounds the exponent from below. Weights are summed as fixed-point
// integers relative to exp(s_ref), the largest exponent any hit can have, so the sums
// are exact and the bound does not depend on the order of the atomics.
//
// Passes over runs of depth buckets, with the spheres in depth order (rank order of the
// depth sort) so that a pass runs whole warps. A bound is max(E_k, tau(W_k)) for the
// bucket k that minimises it, and for every k past a pass's last bucket E_k alone exceeds
// that bucket's end: a tile whose bound from the spheres of the passes so far already
// lies within their buckets (settled) keeps that bound bit for bit whatever deeper
// spheres add. The first pass adds its buckets' spheres (CoverSchedule) to every tile;
// each later pass its run of buckets only to the tiles not settled yet, and nothing when
// every tile settled (as where pixels stop within the first few buckets). The bounds
// equal those of one pass over all buckets, whatever the schedule.
#include <cmath>

#include "cuda_scratch.h"
#include "pulsar/blend.h"
#include "pulsar/tile_cover.h"
#include "warp_deal.cuh"

namespace pulsar {

namespace {

constexpr double kFixedOne = 4294967296.0;  // 2^32: weight 1 (relative to exp(s_ref))
// Largest histogram: 2^22 cells of 8 bytes (32 MiB); the bucket count shrinks first.
constexpr std::int64_t kMaxHistogramCells = std::int64_t(1) << 22;
constexpr int kMaxBuckets = 64, kMinBuckets = 4;  // tile_bound_kernel: two buckets per lane

// Where each cover pass's run of buckets ends, in 64ths of the buckets (the last: all).
// A tile the passes so far leave unsettled takes the next pass's spheres, and every pass
// is a launch over all the ranks, so the schedule trades passes against spheres added
// after a tile settles. Opaque spheres (no opacity given) settle most tiles within the
// first quarter of the depth range: four passes, the later ones of a few buckets each, so
// that a tile the first leaves unsettled does not take every deeper sphere at once.
// Translucent spheres settle deeper: two passes, a third then the rest. The ends are
// empirical; they change the work, never the bounds.
struct CoverSchedule {
  int ends64[CameraWords::kMaxCoverPasses];
  int count;
};
constexpr CoverSchedule kOpaqueSchedule{{16, 22, 32, 64}, 4};
constexpr CoverSchedule kTranslucentSchedule{{21, 64}, 2};
// Runs a camera word each (CameraWords::kUnsettled + pass), the last ending at the last bucket.
constexpr bool well_formed(const CoverSchedule& schedule) {
  return schedule.count >= 1 && schedule.count <= CameraWords::kMaxCoverPasses &&
         schedule.ends64[schedule.count - 1] == 64;
}
static_assert(well_formed(kOpaqueSchedule) && well_formed(kTranslucentSchedule), "a cover schedule's passes");

// Per-camera range of the visible spheres' zc (float bits, see depth_range_of).
struct DepthRange {
  float zmin, zmax;
  bool empty;
};

__device__ DepthRange depth_range_of(const std::uint32_t* camera_words, int b) {
  const std::uint32_t* words = camera_words + b * CameraWords::kCount;
  const std::uint32_t lo = words[CameraWords::kLowZc], hi = words[CameraWords::kHighZc];
  return DepthRange{__uint_as_float(~lo), __uint_as_float(hi), hi == 0};
}

// Largest exponent any hit of camera b can have: opacity 1 at the smallest zc.
template <typename T>
__device__ double reference_exponent(const BlendParams<T>& bp, const DepthRange& range) {
  const double n = (double(range.zmin) - double(bp.min_depth)) * double(bp.inv_range);
  return (1.0 - n) * double(bp.inv_gamma);
}

__device__ int bucket_of(float zc, const DepthRange& range, int buckets) {
  const float width = range.zmax - range.zmin;
  if (!(width > 0)) return buckets - 1;
  const int k = int((zc - range.zmin) / width * float(buckets));
  return k < 0 ? 0 : (k >= buckets ? buckets - 1 : k);
}

// Per camera and tile row, one bit per tile whose bound the passes so far left unsettled
// (uint64 words [B, tiles_y, words_per_row], behind the histogram, zeroed with it; set by
// the first pass's tile_bound_kernel, cleared by a later one's when the tile settles). A
// later pass skips a sphere whose core tiles are all settled before its weight bound (a
// double exp) or any pair: when the first pass settles most tiles, the few left (often
// where the spheres thin out, at the image's border) need not cost a pass over every
// deeper sphere's pairs.
struct UnsettledRows {
  unsigned long long* words;
  int tiles_x, tiles_y;

  __host__ __device__ int words_per_row() const { return (tiles_x + 63) / 64; }
  __host__ __device__ std::int64_t count(int cameras) const {
    return std::int64_t(cameras) * tiles_y * words_per_row();
  }
  __device__ unsigned long long* row(int b, int ty) const {
    return words + (std::int64_t(b) * tiles_y + ty) * words_per_row();
  }
  __device__ void mark(int b, int tx, int ty) const { atomicOr(row(b, ty) + tx / 64, 1ull << (tx % 64)); }
  __device__ void clear(int b, int tx, int ty) const { atomicAnd(row(b, ty) + tx / 64, ~(1ull << (tx % 64))); }
  // Whether any tile of [tx0, tx1] x [ty0, ty1] (non-empty) of camera b is marked.
  __device__ bool any(int b, int tx0, int tx1, int ty0, int ty1) const {
    for (int ty = ty0; ty <= ty1; ++ty) {
      const unsigned long long* r = row(b, ty);
      for (int w = tx0 / 64; w <= tx1 / 64; ++w) {
        const int lo = max(tx0 - 64 * w, 0), hi = min(tx1 - 64 * w, 63);
        if (r[w] & (~0ull >> (63 - hi)) & (~0ull << lo)) return true;
      }
    }
    return false;
  }
};

// Cover pass `index` (0 first) adds buckets [lo, hi); each pass starts where the one
// before ended.
struct CoverPass {
  int lo, hi, index;
  UnsettledRows unsettled;  // written by the passes' tile_bound_kernel, read by the later passes
  __host__ __device__ bool later() const { return index > 0; }
};

// What one sphere adds to its tiles' histograms: the tiles whose pixels (clipped to the
// image) all lie in its core, tx0 + [0, tiles_w) x ty0 + [0, count / tiles_w), its weight
// bound relative to exp(s_ref) and its depth bucket (the one its pass chose it by).
// count = 0: none.
struct CoverJob {
  int tx0 = 0, ty0 = 0, tiles_w = 1, count = 0;
  double relative = 0;
  int bucket = 0;
};

// cam: the frame of the sphere's camera b. In a later pass a sphere whose core tiles the
// passes before left all settled (pass.unsettled) gets none. (The pass by value: a
// pointer to the kernel's parameter would put the parameters on every thread's stack.)
template <typename T>
__device__ CoverJob cover_job(const RendererConfig& config, const RenderOptions& options, const GpuSphere<T>& g,
                              const CameraFrame<T>& cam, int b, const DepthRange& range, int bucket, CoverPass pass) {
  CoverJob job;
  if (g.x0 > g.x1 || g.y0 > g.y1) return job;
  if (!may_cover_tiles(cam, g.radius, g.dist, g.opacity)) return job;
  // core_region_bounds wants centre - eye in world units; orthographic records keep the
  // camera-frame coordinates, which map back through the frame's unit axes.
  const Vec3<T> c_world =
      cam.orthographic ? g.cx * cam.x_unit + g.cy * cam.y_unit + g.cz * cam.z_axis : make_vec3(g.cx, g.cy, g.cz);
  const PixelBounds core = clamp_bounds(core_region_bounds(cam, c_world, g.dist, g.radius, config.width, config.height),
                                        config.width, config.height);
  if (core.empty()) return job;
  // Tiles from the first starting inside the core to the last ending inside it (a tile
  // clipped by the image's last row or column ends there).
  const int tiles_x = (config.width + kTileSize - 1) / kTileSize;
  const int tiles_y = (config.height + kTileSize - 1) / kTileSize;
  const int tx0 = (core.x0 + kTileSize - 1) / kTileSize, ty0 = (core.y0 + kTileSize - 1) / kTileSize;
  const int tx1 = core.x1 == config.width - 1 ? tiles_x - 1 : (core.x1 + 1) / kTileSize - 1;
  const int ty1 = core.y1 == config.height - 1 ? tiles_y - 1 : (core.y1 + 1) / kTileSize - 1;
  if (tx1 < tx0 || ty1 < ty0) return job;
  if (pass.later() && !pass.unsettled.any(b, tx0, tx1, ty0, ty1)) return job;
  const BlendParams<T> bp = blend_params_of(cam, config, options);
  // Exponent bound: depth of any hit <= o1 <= t (perspective) or |cz| (orthographic).
  const double far_depth = cam.orthographic ? fabs(double(g.cz)) : double(g.dist);
  const double n_far = (far_depth - double(bp.min_depth)) * double(bp.inv_range);
  const double s_low = double(g.opacity) * (1.0 - n_far) * double(bp.inv_gamma);
  job.relative = double(g.opacity) * exp(s_low - reference_exponent(bp, range));
  job.bucket = bucket;
  job.tx0 = tx0;
  job.ty0 = ty0;
  job.tiles_w = tx1 - tx0 + 1;
  job.count = job.tiles_w * (ty1 - ty0 + 1);
  return job;
}

// Whether camera b may have a sphere that covers a tile (the setup kernel's flag) and,
// for a later pass, a tile whose bound the passes before left unsettled.
__device__ inline bool cover_pass_needed(const std::uint32_t* camera_words, int b, int pass) {
  const std::uint32_t* words = camera_words + b * CameraWords::kCount;
  return words[CameraWords::kCoverCandidates] != 0u && (pass == 0 || words[CameraWords::kUnsettled + pass - 1] != 0u);
}

// Threads per block of the tile depth bound's launches.
constexpr int kThreads = 256;
// The cover kernel in float at four blocks per SM (64 registers, a few bytes spilled),
// where unbounded it takes 68 and three fit: the opaque scenes' four cover passes run
// about a tenth faster. Double is bounded by the block size alone (1).
template <typename T>
constexpr int kCoverBlocksPerSm = sizeof(T) == 4 ? 4 : 1;

// One thread per depth rank finds its sphere's job when its zc lies in the pass's
// buckets; the warp then deals its (sphere, tile) pairs out over its lanes, 32 at a time,
// so that a sphere covering 60 tiles does not keep the lanes of small ones waiting. Each
// pair checks the tile's corners and adds the weight bound to the tile's bucket (in a
// later pass, only for tiles not settled). Whole warps leave together: those of cameras
// without a sphere large enough to cover a tile or with nothing to do in this
// pass before reading any record, those whose ranks lie outside the pass's buckets after
// reading their keys, and those whose spheres cover no tile.
template <typename T>
__global__ void __launch_bounds__(kThreads, kCoverBlocksPerSm<T>)
    cover_kernel(RendererConfig config, SceneArgs scene, RenderOptions options, const GpuSphere<T>* spheres,
                 const std::int32_t* order, const std::uint32_t* rank_keys, const std::uint32_t* camera_words,
                 const std::uint8_t* settled, unsigned long long* histogram, int buckets, CoverPass pass) {
  constexpr unsigned kFullMask = 0xffffffffu;
  if (!(call_percent_allowed_difference(options) > 0)) return;  // no cut (tile_bound_kernel)
  const std::int64_t n = scene.n_spheres;
  const std::int64_t rank = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = int(threadIdx.x % 32);
  const bool valid = rank < n * scene.batch_size;
  // One camera: its flags before anything else (where no sphere may cover a tile, every
  // thread leaves before any load).
  const bool one_camera = scene.batch_size == 1;
  if (one_camera && !cover_pass_needed(camera_words, 0, pass.index)) return;
  const std::int64_t item = valid ? order[rank] : 0;
  const int camera = one_camera ? 0 : split_item(item, n).camera;
  const bool needed = valid && (one_camera || cover_pass_needed(camera_words, camera, pass.index));
  if (!__any_sync(kFullMask, needed)) return;
  bool in_pass = false;
  const DepthRange range = depth_range_of(camera_words, camera);
  int bucket = 0;
  if (needed) {
    const std::uint32_t key = rank_keys[rank];  // float(zc) bits, as in the record; invisible items: all ones
    bucket = bucket_of(__uint_as_float(key), range, buckets);
    in_pass = key != 0xffffffffu && bucket >= pass.lo && bucket < pass.hi;
  }
  if (!__any_sync(kFullMask, in_pass)) return;
  GpuSphere<T> g{};
  CoverJob job;
  // The frame of this lane's camera; the deal below rebuilds it only for a pair of another
  // camera's sphere (never with one camera), not once per pair.
  int frame_camera = camera;
  CameraFrame<T> cam = camera_of<T>(scene, frame_camera, config.orthographic);
  if (in_pass) {
    g = load_sphere(spheres + item);
    job = cover_job(config, options, g, cam, camera, range, bucket, pass);
  }
  if (!__any_sync(kFullMask, job.count > 0)) return;
  const WarpDeal deal = WarpDeal::of(job.count);
  const int tiles_x = (config.width + kTileSize - 1) / kTileSize;
  const int tiles_y = (config.height + kTileSize - 1) / kTileSize;
  for (int base = 0; base < deal.total; base += 32) {
    const int j = base + lane;
    const int owner = deal.owner_of(j);
    const std::int64_t o_item = __shfl_sync(kFullMask, item, owner);
    const int o_first = __shfl_sync(kFullMask, deal.first, owner);
    const int o_tx0 = __shfl_sync(kFullMask, job.tx0, owner), o_ty0 = __shfl_sync(kFullMask, job.ty0, owner);
    const int o_w = __shfl_sync(kFullMask, job.tiles_w, owner);
    const int o_bucket = __shfl_sync(kFullMask, job.bucket, owner);
    const double o_relative = __shfl_sync(kFullMask, job.relative, owner);
    const Vec3<T> c = make_vec3(__shfl_sync(kFullMask, g.cx, owner), __shfl_sync(kFullMask, g.cy, owner),
                                __shfl_sync(kFullMask, g.cz, owner));
    const T dist = __shfl_sync(kFullMask, g.dist, owner), radius = __shfl_sync(kFullMask, g.radius, owner);
    if (j >= deal.total) continue;
    const int b = split_item(o_item, n).camera;
    const int tx = o_tx0 + (j - o_first) % o_w, ty = o_ty0 + (j - o_first) / o_w;
    const std::int64_t tile = std::int64_t(b) * tiles_x * tiles_y + std::int64_t(ty) * tiles_x + tx;
    if (pass.later() && settled[tile]) continue;
    if (b != frame_camera) {
      frame_camera = b;
      cam = camera_of<T>(scene, b, config.orthographic);
    }
    const int px0 = tx * kTileSize, px1 = min(px0 + kTileSize - 1, config.width - 1);
    const int py0 = ty * kTileSize, py1 = min(py0 + kTileSize - 1, config.height - 1);
    const T kappa = covered_closeness(cam, c, dist, radius, px0, py0, px1, py1);
    // 0.999: margin for the rounding of kappa here against the forward's.
    const double w = fmin(1.0, 0.999 * double(kappa) * o_relative);
    const auto fixed = static_cast<unsigned long long>(w * kFixedOne);
    if (fixed > 0) atomicAdd(histogram + tile * buckets + o_bucket, fixed);
  }
}

// One warp per tile; lane l takes buckets l and l + 32 (kMaxBuckets = 64). The running
// weight sums are an exact integer prefix scan, and the minimum over buckets does not
// depend on its order, so the bound is the serial loop's, bit for bit.
// After the first cover pass: every tile's bound from the spheres of its buckets; settled
// when it lies within them (at most the end of bucket pass.hi - 1), final then; otherwise
// the camera is flagged for the next pass. After a later pass: the tiles not settled
// again, when the camera has such tiles (its flag of the pass before). Bits of
// pass.unsettled: set by the first pass for the tiles a later pass takes, cleared by a
// later pass for the tiles it settles. The last pass (pass.hi == buckets) leaves every
// bound final.
template <typename T>
__global__ void tile_bound_kernel(RendererConfig config, SceneArgs scene, RenderOptions options,
                                  std::uint32_t* camera_words, const unsigned long long* histogram, int buckets,
                                  std::int64_t n_tiles, CoverPass pass, float* bound, std::uint8_t* settled) {
  constexpr unsigned kFullMask = 0xffffffffu;
  const std::int64_t item = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32);
  if (item >= n_tiles * scene.batch_size) return;  // whole warps leave together
  const int b = int(item / n_tiles);
  if (pass.later() && (settled[item] || !cover_pass_needed(camera_words, b, pass.index))) return;
  const DepthRange range = depth_range_of(camera_words, b);
  // Without early termination (p = 0 among a call's values, which the host does not read)
  // no tile is cut: its bound is infinite and settled by the first pass.
  const bool cuts = call_percent_allowed_difference(options) > 0;
  double best = INFINITY;
  bool is_settled = !cuts;
  if (!range.empty && cuts) {
    const CameraFrame<T> cam = camera_of<T>(scene, b, config.orthographic);
    const BlendParams<T> bp = blend_params_of(cam, config, options);
    const double s_ref = reference_exponent(bp, range);
    const double background = exp(double(bp.bg_exponent) - s_ref);
    const double width = double(range.zmax) - double(range.zmin);
    // The end of bucket k (the last ends at zmax).
    auto edge_of = [&](int k) {
      return k == buckets - 1 ? double(range.zmax) : double(range.zmin) + width * (k + 1) / buckets;
    };
    unsigned long long carry = 0;  // weight of the buckets before this half
    for (int half = 0; half < 2; ++half) {
      const int k = half * 32 + lane;
      const unsigned long long added = k < buckets ? histogram[item * buckets + k] : 0ull;
      unsigned long long sum = added;  // inclusive scan over the lanes
      for (int offset = 1; offset < 32; offset *= 2) {
        const unsigned long long other = __shfl_up_sync(kFullMask, sum, offset);
        if (lane >= offset) sum += other;
      }
      sum += carry;
      carry = __shfl_sync(kFullMask, sum, 31);
      // Without new weight, tau stays and the edge only grows: no better bound.
      if (k < buckets && (k == 0 || added != 0)) {
        const double total = double(sum) / kFixedOne + background;
        if (total > 0) {
          const double tau = termination_depth_for_weight(bp, log(total) + s_ref);
          best = fmin(best, fmax(edge_of(k), tau));
        }
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) best = fmin(best, __shfl_xor_sync(kFullMask, best, offset));
    is_settled = best <= edge_of(pass.hi - 1);
    // Margin for the forward's rounding of tau and of zc (float keys): far above both.
    best += 1e-4 * double(bp.depth_range()) + 1e-5 * fabs(best);
  }
  if (lane != 0) return;
  const float final_bound = float(best) < best ? nextafterf(float(best), INFINITY) : float(best);
  bound[item] = final_bound;
  std::uint32_t* words = camera_words + b * CameraWords::kCount;
  // Whether a later pass takes this tile: not settled, and the camera has spheres that may
  // cover a tile (without any, every tile stays unsettled and no later pass runs).
  const bool last = pass.hi == buckets;
  const bool next_follows = !last && !is_settled && cover_pass_needed(camera_words, b, 0);
  // The camera's largest bound, from each tile's last one (CameraWords::kMaxBound: floats
  // >= 0 order like their bits).
  if (!next_follows) atomicMax(words + CameraWords::kMaxBound, __float_as_uint(final_bound));
  if (last) return;
  const std::int64_t tile = item - std::int64_t(b) * n_tiles;
  const int tx = int(tile % pass.unsettled.tiles_x), ty = int(tile / pass.unsettled.tiles_x);
  if (!pass.later()) {
    settled[item] = is_settled ? 1 : 0;
    if (next_follows) pass.unsettled.mark(b, tx, ty);
  } else if (is_settled) {
    settled[item] = 1;
    pass.unsettled.clear(b, tx, ty);
  }
  if (!next_follows) return;
  // Many tiles raise the same flag: reading it first keeps most from storing.
  std::uint32_t* flag = words + CameraWords::kUnsettled + pass.index;
  if (*reinterpret_cast<volatile std::uint32_t*>(flag) == 0u) *flag = 1u;
}

// The histogram's buckets per tile for this call, 0 when the bounds do not cut.
int cover_buckets(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options) {
  // A call's values (RenderOptions::values) decide on the device whether the bounds cut.
  const bool may_cut = options.values != nullptr || options.percent_allowed_difference > 0;
  if (!may_cut || scene.n_spheres == 0) return 0;
  const std::int64_t total_tiles = Tiling::of(config.width, config.height).n_tiles() * scene.batch_size;
  const int buckets = int(std::min<std::int64_t>(kMaxBuckets, kMaxHistogramCells / total_tiles));
  return buckets < kMinBuckets ? 0 : buckets;  // too many tiles for the histogram: no cut
}

}  // namespace

CoverHistogram cuda_reserve_cover_histogram(const RendererConfig& config, const SceneArgs& scene,
                                            const RenderOptions& options, CudaScratch& scratch) {
  CoverHistogram h;
  h.buckets = cover_buckets(config, scene, options);
  if (h.buckets == 0) return h;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const UnsettledRows unsettled{nullptr, tiling.tiles_x, tiling.tiles_y};
  // The histogram's cells, then the unsettled tiles' words.
  h.count = std::size_t(tiling.n_tiles() * scene.batch_size) * std::size_t(h.buckets) +
            std::size_t(unsettled.count(scene.batch_size));
  h.words = scratch.cover_histogram.reserve<unsigned long long>(h.count, "tile cover histogram");
  return h;
}

template <typename T>
const float* cuda_tile_depth_bound(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                                   cudaStream_t stream, CudaScratch& scratch, const CoverHistogram& zeroed,
                                   const std::int32_t* order, const std::uint32_t* rank_keys) {
  if (zeroed.buckets == 0) return nullptr;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t n_tiles = tiling.n_tiles();
  const std::int64_t total_tiles = n_tiles * scene.batch_size;
  const int buckets = zeroed.buckets;
  UnsettledRows unsettled{nullptr, tiling.tiles_x, tiling.tiles_y};
  const std::size_t cells = std::size_t(total_tiles) * buckets;
  auto* histogram = zeroed.words;
  unsettled.words = histogram + cells;
  auto* bound = scratch.tile_depth_bound.reserve<float>(std::size_t(total_tiles), "tile depth bounds");
  auto* settled = scratch.tile_settled.reserve<std::uint8_t>(std::size_t(total_tiles), "tile settled flags");
  auto* words = scratch.camera_words.as<std::uint32_t>();  // filled by the setup kernel
  const std::int64_t items = scene.n_spheres * scene.batch_size;
  const auto* spheres = scratch.spheres.as<GpuSphere<T>>();
  const unsigned tile_blocks = blocks_for(total_tiles * 32, kThreads);
  // Every pass on a whole grid, not a grid-stride loop on a few blocks: a later pass may
  // do much of the work (translucent spheres), and an idle pass's warps leave at once
  // (cover_pass_needed).
  CoverPass pass{0, 0, 0, unsettled};
  const CoverSchedule& schedule = scene.opacities ? kTranslucentSchedule : kOpaqueSchedule;
  for (int p = 0; p < schedule.count; ++p) {
    pass.hi = buckets * schedule.ends64[p] / 64;
    if (pass.hi <= pass.lo) continue;  // few buckets: runs that round to none
    cover_kernel<T><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
        config, scene, options, spheres, order, rank_keys, words, settled, histogram, buckets, pass);
    PULSAR_CUDA_LAUNCH_CHECK("cover_kernel");
    tile_bound_kernel<T><<<tile_blocks, kThreads, 0, stream>>>(config, scene, options, words, histogram, buckets,
                                                               n_tiles, pass, bound, settled);
    PULSAR_CUDA_LAUNCH_CHECK("tile_bound_kernel");
    pass.lo = pass.hi;
    ++pass.index;
  }
  return bound;
}

template const float* cuda_tile_depth_bound<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                                   cudaStream_t, CudaScratch&, const CoverHistogram&,
                                                   const std::int32_t*, const std::uint32_t*);
template const float* cuda_tile_depth_bound<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                                    cudaStream_t, CudaScratch&, const CoverHistogram&,
                                                    const std::int32_t*, const std::uint32_t*);

}  // namespace pulsar
