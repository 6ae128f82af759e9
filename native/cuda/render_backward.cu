// Stage 3 on CUDA: one block per (camera, tile), or a few per tile when tiles are few.
// Sphere-major: the block stages a batch of its tile's entries in shared memory (one
// thread per entry), then each warp takes one staged entry at a time (or, for small
// spheres, one per group of 8 or 16 lanes, in the order of their rounds) and its lanes
// take the pixels of that sphere's bounds within the tile, so the warp or group works
// on one sphere and its gradient is one reduce-scatter written straight into that
// (tile, sphere) instance's row, which no other warp writes. A pair counts when the
// pixel's forward processed it: it is a hit and lies before the pixel's traversal end
// (docs/model.md section 8). Camera terms accumulate per lane and background
// terms per pixel; both are reduced once per block. Every sum has a fixed order, so
// gradients are bitwise reproducible, and nothing touches global memory atomically.
//
// The rows of a window of slots at a time (RowWindows): each window's launch renders the
// entries with slots in it (a run of each tile's list), then cuda_reduce_sphere_rows adds
// the window's rows to the sphere gradients. Every block runs the first window, which
// records how many entries its tile processes (tile_ends) and adds the background's
// pixel terms; in a later window only the blocks with processed entries in it render
// (adding to the camera partials the first wrote), the others zero the rows of their
// unreached entries and leave. No block's rows are cleared before its launch: each
// block zeroes the rows of the entries its tile never reached (zero_unreached_rows).
#include <algorithm>
#include <limits>
#include <type_traits>

#include "cuda_scratch.h"
#include "sphere_cone.cuh"
#include "warp_reduce.cuh"
#include "pulsar/blend.h"
#include "pulsar/pixel_ray.h"

namespace pulsar {

namespace {

constexpr int kThreads = kTileSize * kTileSize;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

struct GradFlags {
  bool features, blend, geometry;
  bool opacity;  // dL/dopacity wanted (blend is then set too)
};

// Which gradients a kernel computes: the flags at run time, or every one with no depth
// moments (the common call) as a template parameter, with or without dL/dopacity (a call
// without opacities then skips the opacity terms in every pair).
enum GradSet : int { kGradsByFlags = 0, kAllGrads = 1, kAllButOpacity = 2 };

// The slots [lo, hi) one launch renders; first: the first window of a backward; whole:
// the only window (every slot in it).
struct SlotWindow {
  std::int64_t lo, hi;
  bool first, whole;
};

// The first of slots[0, count) (ascending) that is at least value; count if none.
__device__ int first_slot_at_least(const std::int32_t* slots, int count, std::int64_t value) {
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (slots[mid] < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Zeroes one gradient row of `stride` values. Rows whose bytes are a multiple of 16
// (float with 3 channels: 32 bytes) are written in 16-byte stores: the rows are
// scattered, one sector each, and narrow stores cost a transaction per value.
template <typename T>
__device__ void zero_row(T* row, int stride) {
  if ((stride * sizeof(T)) % 16 == 0) {  // the rows start 256-byte aligned (InstanceArena)
    int4* words = reinterpret_cast<int4*>(row);
    for (int k = 0; k < int(stride * sizeof(T) / 16); ++k) words[k] = make_int4(0, 0, 0, 0);
  } else {
    for (int f = 0; f < stride; ++f) row[f] = T(0);
  }
}

// Zeroes the rows of the tile's list positions [from, to) (their slots in the window
// starting at slot lo): entries no pixel of the tile reached, whose rows the reduction
// still sums. Only these rows need it (every reached entry's row is written whole), so no
// memset of all the window's rows precedes the launch.
template <typename T>
__device__ void zero_unreached_rows(const std::int32_t* slots, int from, int to, T* rows, std::int64_t lo, int stride) {
  for (int p = from + int(threadIdx.x); p < to; p += int(blockDim.x)) zero_row(rows + (slots[p] - lo) * stride, stride);
}

// Reduce-scatter of N values per lane over each aligned group of WIDTH lanes (N and
// WIDTH powers of two, N <= WIDTH <= 32): returns the group's sum of value
// scatter_index<N, WIDTH>(lane). Each halving step exchanges the half of the values the
// partner keeps (N/2 + N/4 + ... shuffles, then the remaining butterfly steps on one
// value): 9 shuffles for 8 values over 32 lanes where 8 separate shuffle trees take 40.
// Every lane of a run of WIDTH / N consecutive lanes ends with the same sum; v is
// overwritten. All 32 lanes must call it.
template <int WIDTH, int N, typename T>
__device__ T group_sum_scatter(T (&v)[N], int lane) {
  static_assert(N >= 1 && N <= WIDTH && WIDTH <= 32 && (N & (N - 1)) == 0 && (WIDTH & (WIDTH - 1)) == 0,
                "N, WIDTH: powers of two, N <= WIDTH <= 32");
  int offset = WIDTH / 2;
#pragma unroll
  for (int half = N / 2; half >= 1; half /= 2, offset /= 2) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const T send = upper ? v[i] : v[i + half];
      const T keep = upper ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(kFullMask, send, offset);
    }
  }
  T sum = v[0];
  for (; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  return sum;
}

// Which value's sum lane `lane` holds after group_sum_scatter<WIDTH, N>, and whether it is
// the first lane holding it (one lane per value writes it).
template <int N, int WIDTH>
__device__ constexpr int scatter_index(int lane) {
  return (lane % WIDTH) / (WIDTH / N);
}
template <int N, int WIDTH>
__device__ constexpr bool scatter_writer(int lane) {
  return lane % (WIDTH / N) == 0;
}

constexpr int next_pow2(int n) { return n <= 1 ? 1 : 2 * next_pow2((n + 1) / 2); }

// Fixed-order block sum: value(k), k < count, summed over the block's threads into
// out[0..count) (added to it when `add`): shuffle trees per warp, then the warps in index
// order. scratch holds kWarps * count values; the block synchronises before returning.
template <typename T, typename ValueFn>
__device__ void block_sum(int count, ValueFn value, T* scratch, T* out, bool add) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int k = 0; k < count; ++k) {
    const T s = warp_sum(value(k));
    if (lane == 0) scratch[warp * count + k] = s;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < count; k += kThreads) {
    T s = 0;
    for (int w = 0; w < kWarps; ++w) s += scratch[w * count + k];
    out[k] = add ? out[k] + s : s;
  }
  __syncthreads();
}

// Perspective camera gradients reach the film through each pixel's ray direction d =
// normalize(sensor offset). The backward of that normalisation is linear in dL/dd, so the
// block sums dL/dd per pixel first and applies it once per pixel instead of once per
// pair. Each warp owns one copy of the per-pixel sums (its lanes hold distinct pixels at
// any time), so no two threads add into the same place and the sum order stays fixed.
// Used when the copies fit the shared memory (float with up to about 350 channels) and
// the warps work on one entry at a time; never in double, nor with groups of lanes.

// A pixel's unit ray direction (perspective) and ln of its total weight (m + ln D), read
// together: one 16-byte load in float instead of four narrow ones.
template <typename T>
struct alignas(4 * sizeof(T)) RayAndTotal {
  T x, y, z, log_total;
};

// A pixel's dL/dimage . image and dL/dimage (static channel count), read together: aligned
// to their size where that is 2 or 4 values (one 8- or 16-byte load in float with 1 or 3
// channels, a stride without bank conflicts), else to one value (4 channels: a 5-word
// stride, which has none either).
constexpr int pixel_grads_values(int c_static) { return 1 + (c_static > 0 ? c_static : 1); }
constexpr std::size_t pixel_grads_align(int c_static, std::size_t value_bytes) {
  return pixel_grads_values(c_static) == 2 || pixel_grads_values(c_static) == 4
             ? pixel_grads_values(c_static) * value_bytes
             : value_bytes;
}
template <typename T, int C_STATIC>
struct alignas(pixel_grads_align(C_STATIC, sizeof(T))) PixelGrads {
  T dot;                                    // dL/dimage . image, less dL/dM_0 (1 - M_0) (render())
  T image[C_STATIC > 0 ? C_STATIC : 1];     // dL/dimage
};

// What the block stages per pixel of its tile (index q = ly * 16 + lx), so that a pair
// reads its pixel's terms from shared memory instead of recomputing or fetching them.
// Each pixel's values that a pair reads together are one record (RayAndTotal,
// PixelGrads): per whole-tile pair round 2 loads instead of 8 (float, 3 channels).
template <typename T, int C_STATIC>
struct PixelStage {
  int end[kThreads];                      // traversal end (entries the forward processed)
  RayAndTotal<T> ray_total[kThreads];     // the ray only in perspective
  PixelGrads<T, C_STATIC> grads[kThreads];  // dL/dimage only with a static channel count
  // The depth outputs (render()): the mean (two parts) and variance of the hits'
  // normalised depths and 1 / M_0 (0 where nothing is covered); dL/dmean and dL/dvariance
  // (blend.h, DepthStatsGrad). dL/dM_0 joins the image's term of each hit (PixelGrads::dot).
  T mom[kThreads][4], grad_mom[kThreads][2];
};

// One entry of the tile's list as the warps read it. A batch of entries is staged in
// shared memory by one thread each: the dependent loads (the list position's sphere,
// then its record, features and slot) and the box arithmetic are paid once per entry
// instead of once per warp, and no warp stalls on the sphere record's load.
template <typename T, int C_STATIC>
struct StagedEntry {
  T cx, cy, cz, dist, radius, opacity;  // as GpuSphere
  PairTerms<T> terms;
  T features[C_STATIC > 0 ? C_STATIC : 1];  // static channel count only
  std::int32_t sphere, slot;                // sphere index; the instance's slot (its row)
  // The rectangle of the tile whose pixels the entry's pairs walk (tile-local): the
  // sphere's box within the tile, or within that the cone's (stage_entry); box_h 0: none.
  std::uint8_t lx0, ly0, box_w, box_h;
  std::uint16_t div_magic;  // ceil(512 / box_w): k / box_w = (k * div_magic) >> 9 for 0 <= k <= 32
};

// The staged entry of sphere `id` (its record g), at slot `slot` of the tile whose first
// pixel is (tile_x0, tile_y0); features: the sphere's C_STATIC values (none when 0).
// CONE_BOX (perspective only; packed_camera, the call's packed camera, is read only then):
// where the box covers at least kConeMinBoxPixels of the tile, the pairs walk the smaller
// rectangle that holds its rows' columns of the sphere's cone (ConeRows::bounds_within),
// none where they have none: a large sphere's box holds about a fifth of misses, most of
// them in the tiles its rim crosses, and its corner tiles none of its pixels.
template <typename T, int C_STATIC, bool CONE_BOX>
__device__ StagedEntry<T, C_STATIC> stage_entry(const GpuSphere<T>& g, std::int32_t id, std::int32_t slot,
                                                const T* features, int tile_x0, int tile_y0, const T* packed_camera) {
  StagedEntry<T, C_STATIC> se;
  se.cx = g.cx;
  se.cy = g.cy;
  se.cz = g.cz;
  se.dist = g.dist;
  se.radius = g.radius;
  se.opacity = g.opacity;
  se.terms = g.terms;
  for (int ch = 0; ch < C_STATIC; ++ch) se.features[ch] = features[ch];
  se.sphere = id;
  se.slot = slot;
  PixelBounds box{max(int(g.x0), tile_x0), max(int(g.y0), tile_y0), min(int(g.x1), tile_x0 + kTileSize - 1),
                  min(int(g.y1), tile_y0 + kTileSize - 1)};  // image pixels, never empty
  if (CONE_BOX && takes_cone(box)) {
    const ConeRows<T> cone = cone_rows_of(packed_camera, g);
    if (cone.active) box = cone.bounds_within(box);
  }
  const bool none = box.empty();
  se.lx0 = std::uint8_t(none ? 0 : box.x0 - tile_x0);
  se.ly0 = std::uint8_t(none ? 0 : box.y0 - tile_y0);
  se.box_w = std::uint8_t(none ? 1 : box.x1 - box.x0 + 1);
  se.box_h = std::uint8_t(none ? 0 : box.y1 - box.y0 + 1);
  se.div_magic = std::uint16_t((512 + se.box_w - 1) / se.box_w);
  return se;
}

// A pixel's staged terms as a pair reads them: from the stage where the pair uses them
// (StagedPixel: a miss reads only the ray), or loaded once for the two pairs of a
// whole-tile pair (LoadedPixel: the kernels of the common call, perspective with a static
// channel count and no depth moments).
template <typename T, int C_STATIC, bool ORTHO>
struct StagedPixel {
  const PixelStage<T, C_STATIC>& stage;
  int q;  // tile pixel
  const CameraFrame<T>& cam;
  int x, y;                  // image pixel
  const T* inv_ray_lengths;  // per tile pixel (kPairRayFold kernels only)
  // Each accessor reads its whole record (one wide load, which the compiler shares
  // between the accessors of one pair; a narrow load at a 16-byte stride has bank
  // conflicts).
  __device__ PixelRay<T> ray() const {
    PixelRay<T> r;
    if (ORTHO) {
      r = pixel_ray(cam, x, y);
    } else {
      const RayAndTotal<T> rt = stage.ray_total[q];
      r.dir = make_vec3(rt.x, rt.y, rt.z);
    }
    return r;
  }
  __device__ T log_total() const { return RayAndTotal<T>(stage.ray_total[q]).log_total; }
  __device__ T inv_ray_length() const { return inv_ray_lengths[q]; }
  __device__ T grad_dot_image() const { return PixelGrads<T, C_STATIC>(stage.grads[q]).dot; }
  __device__ T grad_image(int ch) const { return PixelGrads<T, C_STATIC>(stage.grads[q]).image[ch]; }
  __device__ const T* moments() const { return stage.mom[q]; }
  __device__ const T* grad_moments() const { return stage.grad_mom[q]; }
};

template <typename T, int C_STATIC>
struct LoadedPixel {
  PixelRay<T> r;
  T total, dot, g[C_STATIC > 0 ? C_STATIC : 1];
  __device__ LoadedPixel(const PixelStage<T, C_STATIC>& stage, int q) {
    const RayAndTotal<T> rt = stage.ray_total[q];
    r.dir = make_vec3(rt.x, rt.y, rt.z);
    total = rt.log_total;
    const PixelGrads<T, C_STATIC> pg = stage.grads[q];
    dot = pg.dot;
    for (int ch = 0; ch < C_STATIC; ++ch) g[ch] = pg.image[ch];
  }
  __device__ PixelRay<T> ray() const { return r; }
  __device__ T log_total() const { return total; }
  __device__ T grad_dot_image() const { return dot; }
  __device__ T grad_image(int ch) const { return g[ch]; }
  __device__ const T* moments() const { return nullptr; }  // never read: no depth moments
  __device__ const T* grad_moments() const { return nullptr; }
};

// One entry's registers over its rounds: the constants its pairs read (held across the
// rounds; re-read from the staged entry in every round, they make the compiler spill)
// and the sums of its pairs, reduced over the warp or group at the entry's end.
template <typename T, int C_STATIC>
struct EntryAccum {
  T exponent_slope;                     // the sphere's blend_exponent_slope (-ds/dz)
  T col[C_STATIC > 0 ? C_STATIC : 1];  // its features (static channel count)
  const T* col_global;                  // its features in global memory (the generic channel path)
  Vec3<T> c_world{0, 0, 0};             // orthographic: centre - eye
  struct Sums {
    Vec3<T> pos{0, 0, 0};      // orthographic: dL/dc
    CentreGradSums<T> centre;  // perspective: dL/dc in its two parts
    RadiusGradSums<T> radius;
    T opacity = 0;
    T features[C_STATIC > 0 ? C_STATIC : 1] = {};
  } sums;
};

// Whether a kernel takes whole-tile entries two at a time (run_whole_tile_pair in the
// kernel): the common call's kernels (GradSet other than by flags: float, perspective, a
// static channel count) with whole warps and the per-pixel ray sums.
constexpr bool takes_whole_tile_pairs(int grads, int group, bool ray_sums) {
  return grads != kGradsByFlags && group == 32 && ray_sums;
}

// Orders a batch's entries by a small key, stably: order[rank] = entry. Every thread of
// the block calls it; thread t < count holds entry t's key (0 .. KEYS - 1). Ballots per
// key in the first BATCH / 32 warps, then each entry's rank from the per-warp counts.
// Ends with the block synchronised.
template <int BATCH, int KEYS>
__device__ void order_by_key(int key, int count, std::uint8_t* order, int (*counts)[KEYS]) {
  static_assert(BATCH % 32 == 0 && BATCH <= 256, "entries in whole warps, indices in a byte");
  const int t = int(threadIdx.x), warp = t / 32, lane = t % 32;
  const bool mine = t < count;
  unsigned same = 0;  // this warp's lanes with the same key
  if (warp < BATCH / 32) {
    for (int v = 0; v < KEYS; ++v) {
      const unsigned lanes = __ballot_sync(kFullMask, mine && key == v);
      if (lane == 0) counts[warp][v] = __popc(lanes);
      if (mine && key == v) same = lanes;
    }
  }
  __syncthreads();
  if (mine) {
    int rank = __popc(same & ((1u << lane) - 1u));
    for (int v = 0; v < KEYS; ++v)
      for (int w = 0; w < BATCH / 32; ++w)
        if (v < key || (v == key && w < warp)) rank += counts[w][v];
    order[rank] = std::uint8_t(t);
  }
  __syncthreads();
}

// Entries staged at a time: as many as keep the block's static shared memory, with the
// float ray sums, within the 48 KiB a block gets without opting in.
template <typename T, int C_STATIC>
constexpr int staged_batch() {
  return sizeof(T) == 4 && C_STATIC <= 3 ? 128 : 64;
}

// Four blocks per SM (64 registers) with whole warps, which then run faster than with
// three. With lane groups (GROUP < 32), three (80 registers): at 64 that kernel spills
// in its rounds (the fused chord keeps more values live). ORTHO: the camera is
// orthographic (a template parameter, so the perspective kernel keeps no orthographic
// camera terms live). With few tiles, `splits` blocks share a tile: block s of the tile
// takes every splits-th entry from the s-th on, and writes its own partial camera and
// background rows (split 0 alone adds the background's pixel terms).
// GRADS (GradSet): kAllGrads and kAllButOpacity fix the flags at compile time, so that the
// rounds test none of them.
// Rows: the window's, rows[u - window.lo] for slot u. tile_ends: written in the first
// window and read in the others (null with one window).
template <typename T, int C_STATIC, bool ORTHO, bool RAY_SUMS, int GROUP, int GRADS>
__global__ void __launch_bounds__(kThreads, GROUP == 32 ? 4 : 3)
    render_backward_kernel(RendererConfig config, SceneArgs scene, RenderOptions options, BackwardArgs args,
                           GradFlags flags, const GpuSphere<T>* spheres, const std::int32_t* entry_sphere,
                           const std::int32_t* entry_slot, const int2* tile_ranges, int* tile_ends, int splits,
                           SlotWindow window, T* rows, T* tile_camera, T* tile_background, LaunchGate gate) {
  if (!gate.open()) return;  // the kernel of the other lane grouping runs (LaunchGate)
  __shared__ PixelStage<T, C_STATIC> stage;
  // Perspective without ray sums: each pair folds its ray gradient into the camera terms
  // itself, from the pixel's ray and the reciprocal length of its sensor offset, staged
  // here. Not in the ray-sum kernels, which need neither and whose four blocks per
  // multiprocessor fill the shared memory (1 KB more per block leaves room for three).
  constexpr bool kPairRayFold = !ORTHO && !RAY_SUMS;
  __shared__ T inv_ray_lengths[kPairRayFold ? kThreads : 1];
  constexpr int kBatch = staged_batch<T, C_STATIC>();
  __shared__ StagedEntry<T, C_STATIC> staged[kBatch];
  // With lane groups, a warp's entries take as many rounds as the largest of them: the
  // groups take the batch's entries in the order of their rounds (up to kRoundKeys).
  // Whole-tile pairs: the batch's whole-tile entries first (key 0), the others after (1),
  // then those whose cone leaves the tile no pixel (2: no warp takes them, their loader
  // zeroes their rows). In the other cone kernels (whole warps, unordered) such an entry
  // is taken for zero rounds, and its reduce-scatter writes the zero row.
  constexpr bool kPairs = takes_whole_tile_pairs(GRADS, GROUP, RAY_SUMS);
  constexpr int kRoundKeys = kPairs ? 3 : 8;
  constexpr bool kOrdered = GROUP < 32 || kPairs;
  __shared__ std::uint8_t batch_order[kOrdered ? kBatch : 1];
  __shared__ int round_counts[kOrdered ? kBatch / 32 : 1][kRoundKeys];
  __shared__ int max_end;
  extern __shared__ unsigned char smem_raw[];
  T* feature_acc = reinterpret_cast<T*>(smem_raw);  // [kWarps][C], also block-reduction scratch
  // [kWarps][3][kThreads]: per-warp sums of dL/d(ray direction) per pixel (RAY_SUMS).
  T* ray_grad = feature_acc + kWarps * max(kCameraGradValues, config.n_channels);
  constexpr bool kStatic = C_STATIC > 0;  // features and dL/dimage in registers / shared memory

  const int channels = kStatic ? C_STATIC : config.n_channels;
  const int stride = kGpuInstFeatures + channels;
  const std::int64_t item = blockIdx.x / splits;  // (camera, tile)
  const int split = int(blockIdx.x % splits);
  const Tiling::Item at = Tiling::of(config.width, config.height).locate(item);
  const int b = at.camera, tile_x0 = at.x0, tile_y0 = at.y0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const CameraFrame<T> cam = camera_of<T>(scene, b, ORTHO);
  // The whole-warp kernels in float walk an entry's pairs over its cone's rectangle
  // (stage_entry): the lane groups' boxes are small, and in double the cone's arithmetic
  // costs twice as much.
  constexpr bool kConeBoxes = !ORTHO && sizeof(T) == 4 && GROUP == 32;
  const T* packed_camera = packed_camera_of<T>(scene, b);
  const SceneView<T> sv = SceneView<T>::of(scene, b, channels);
  const BlendParams<T> bp = blend_params_of(cam, config, options);
  const std::int64_t image_base = std::int64_t(b) * config.width * config.height;
  const T* grad_image = static_cast<const T*>(args.grad_image);
  const T* image = static_cast<const T*>(args.image);
  constexpr bool ALL_GRADS = GRADS != kGradsByFlags;
  const bool with_moments = !ALL_GRADS && args.grad_depth_moments != nullptr;
  if (ALL_GRADS) flags = GradFlags{true, true, true, GRADS == kAllGrads};
  T* camera_out = tile_camera ? tile_camera + std::int64_t(blockIdx.x) * kCameraGradValues : nullptr;
  T* background_out = tile_background ? tile_background + std::int64_t(blockIdx.x) * channels : nullptr;

  // The tile's entries with slots in the window: [w_begin, w_end) of its list, of which
  // the processed ones are [e_begin, e_end). Past the first window, a block without any
  // processed entry only zeroes its unreached rows and leaves (every thread finds the same).
  const int2 range = tile_ranges[item];
  const std::int32_t* slots = entry_slot + range.x;
  const int list_length = range.y - range.x;
  const int w_begin = window.whole ? 0 : first_slot_at_least(slots, list_length, window.lo);
  const int w_end = window.whole ? list_length : first_slot_at_least(slots, list_length, window.hi);
  int e_begin = 0;
  if (!window.first) {
    const int processed = tile_ends[item];
    e_begin = min(w_begin, processed);
    if (e_begin == processed) {
      if (split == 0) zero_unreached_rows(slots, max(processed, w_begin), w_end, rows, window.lo, stride);
      return;
    }
  }

  // Stage this thread's pixel.
  const int own_x = tile_x0 + int(threadIdx.x) % kTileSize, own_y = tile_y0 + int(threadIdx.x) / kTileSize;
  const bool own_inside = own_x < config.width && own_y < config.height;
  const std::int64_t own_pix = image_base + std::int64_t(own_y) * config.width + own_x;
  if (threadIdx.x == 0) max_end = 0;
  if (RAY_SUMS && tile_camera)
    for (int k = threadIdx.x; k < kWarps * 3 * kThreads; k += kThreads) ray_grad[k] = T(0);
  __syncthreads();
  T bg_share = 0;
  if (own_inside) {
    const T m = static_cast<const T*>(args.blend_state)[2 * own_pix];
    const T d = static_cast<const T*>(args.blend_state)[2 * own_pix + 1];
    stage.end[threadIdx.x] = args.traversal_end[own_pix];
    bg_share = exp(bp.bg_exponent - m) / d;
    PixelGrads<T, C_STATIC> pg;
    pg.dot = 0;
    for (int ch = 0; ch < channels; ++ch) {
      const T g = grad_image[own_pix * channels + ch];
      pg.dot += g * image[own_pix * channels + ch];
      if (kStatic) pg.image[ch] = g;
    }
    if (!kStatic) pg.image[0] = T(0);
    const Vec3<T> dir = ORTHO ? make_vec3(T(0), T(0), T(0)) : pixel_ray(cam, own_x, own_y).dir;
    stage.ray_total[threadIdx.x] = RayAndTotal<T>{dir.x, dir.y, dir.z, m + log(d)};
    if (kPairRayFold) inv_ray_lengths[threadIdx.x] = T(1) / norm(cam.sensor_offset(T(own_x), T(own_y)));
    if (with_moments) {
      const T* mom = static_cast<const T*>(args.depth_moments) + kDepthStats * own_pix;
      const T* g_mom = static_cast<const T*>(args.grad_depth_moments) + kDepthStats * own_pix;
      // A hit's dL/dw * W through the coverage is dL/dM_0 (1 - M_0), with 1 - M_0 the
      // background's share: one term per pixel, folded into gL . C.
      pg.dot -= g_mom[kCoverage] * bg_share;
      // 1 / M_0: the weights b_i = w_i / W_h are a_i / M_0. M_0 is 0 or a normal number
      // here (this kernel and the forward flush denormals in float); in double a
      // denormal M_0 is taken as the smallest normal one, so that no reciprocal overflows.
      const T coverage = mom[kCoverage];
      const T inv_coverage = coverage > T(0) ? T(1) / fmax(coverage, std::numeric_limits<T>::min()) : T(0);
      stage.mom[threadIdx.x][0] = mom[kDepthMean];
      stage.mom[threadIdx.x][1] = mom[kDepthMeanLow];
      stage.mom[threadIdx.x][2] = mom[kDepthVariance];
      stage.mom[threadIdx.x][3] = inv_coverage;
      stage.grad_mom[threadIdx.x][0] = g_mom[kDepthMean];
      stage.grad_mom[threadIdx.x][1] = g_mom[kDepthVariance];
    }
    stage.grads[threadIdx.x] = pg;
    atomicMax(&max_end, stage.end[threadIdx.x]);
  } else {
    stage.end[threadIdx.x] = 0;
  }
  __syncthreads();

  CameraGrad<T> cg;
  DepthRangeSums<T> range_sums;  // the depth range's camera terms, resolved after the loop
  // Each warp works on kGroups entries at once, one per aligned group of GROUP lanes
  // (lane_in_group over the sphere's pixels). A small sphere's box (a few to a few dozen
  // pixels) then fills a group instead of leaving most of a warp idle, and the per-entry
  // work (loads, row reduction) is shared; a large box takes twice the rounds of half the
  // width.
  constexpr int kGroups = 32 / GROUP;
  // Two groups may hold the same pixel, so the per-pixel ray sums (one copy per warp) need
  // whole warps. With groups each pair folds its ray gradient into the camera terms itself
  // (unit_vector_backward per pair, from the ray and reciprocal length staged per pixel),
  // which costs less than groups taking turns at the copy.
  static_assert(!RAY_SUMS || GROUP == 32, "ray sums need one group per warp");
  const int group = lane / GROUP, lane_in_group = lane % GROUP;
  T* const warp_ray_grad = ray_grad + warp * 3 * kThreads;  // this warp's copy of the ray sums
  // Per-entry row values reduced at once (group_sum_scatter); this lane holds the sum of
  // value my_value of its group's row.
  constexpr int kRowValues = next_pow2(kGpuInstFeatures + (kStatic ? C_STATIC : 0));
  static_assert(kRowValues <= GROUP, "a row's values fit its group's lanes");
  static_assert(kStatic || GROUP == 32, "the generic channel path sums features over whole warps");
  const int my_value = scatter_index<kRowValues, GROUP>(lane);
  const bool row_writer = scatter_writer<kRowValues, GROUP>(lane);
  T eye_part = 0;  // writer lanes with my_value < 3: minus the sums of that position component
  if (window.first && tile_ends && split == 0 && threadIdx.x == 0) tile_ends[item] = max_end;
  const int e_end = min(w_end, max_end);
  if (split == 0) zero_unreached_rows(slots, max(max_end, w_begin), w_end, rows, window.lo, stride);

  // An entry's EntryAccum, its sums zero.
  auto begin_entry = [&](const StagedEntry<T, C_STATIC>& se) {
    EntryAccum<T, C_STATIC> acc;
    // The exponent's slope of the entry's sphere: s = slope (max_depth - z) and dL/dz of a
    // pair is -dL/ds times it (plus the moments' part through n).
    acc.exponent_slope = blend_exponent_slope(bp, se.opacity);
    for (int ch = 0; ch < (kStatic ? C_STATIC : 1); ++ch) acc.col[ch] = kStatic ? se.features[ch] : T(0);
    acc.col_global = sv.features + std::int64_t(se.sphere) * channels;  // the generic channel path
    if (ORTHO && flags.geometry) acc.c_world = load_vec3(sv.positions + 3 * std::int64_t(se.sphere)) - cam.eye;
    return acc;
  };

  // Adds the terms of the pair (entry se, the pixel px at image (x, y)) to the entry's
  // sums and the lane's camera sums; returns the pair's weight and sets hit (a miss adds
  // nothing: weight 0, hit false). The ray sums (RAY_SUMS) go to ray_acc, or with
  // shared_ray_sums straight into the warp's copy at ray_at (loaded and stored around a
  // hit's terms). g_img: the pixel's dL/dimage (the generic channel path).
  auto add_pair = [&](const StagedEntry<T, C_STATIC>& se, EntryAccum<T, C_STATIC>& acc, const auto& px, int x, int y,
                      const T* g_img, Vec3<T>& ray_acc, T* ray_at, auto shared_ray_sums, bool& hit) -> T {
    const Vec3<T> c = make_vec3(se.cx, se.cy, se.cz);
    const T radius = se.radius, opacity = se.opacity;
    const PixelRay<T> ray = px.ray();
    const PairHit<T> h = evaluate_pair(cam, c, se.dist, radius, se.terms, ray);
    hit = h.hit;
    if (!h.hit) return T(0);
    const T s = blend_exponent(bp, acc.exponent_slope, h.depth);
    // Weight per unit closeness and opacity: exp(s - ln(total weight)), the argument at
    // most 0, with the forward's own exponential.
    const T unit = softmax_exp(s - px.log_total());
    const T opacity_unit = opacity * unit;  // dw/dkappa, shared with the weight
    const T weight = h.kappa * opacity_unit;
    // gw = dL/dw * total weight through the image and the coverage (PixelGrads::dot).
    T gw = -px.grad_dot_image();
    if (kStatic) {
      // dL/dfeatures here, where dL/dimage is loaded for gw, so that the compiler loads
      // it once (after the geometry it loads it again).
      for (int ch = 0; ch < C_STATIC; ++ch) {
        const T g = px.grad_image(ch);
        gw += g * acc.col[ch];
        if (flags.features) acc.sums.features[ch] += weight * g;
      }
    } else {
      for (int ch = 0; ch < channels; ++ch) gw += g_img[ch] * acc.col_global[ch];
    }
    if (!flags.blend) return weight;
    // The entry's sums are the accumulators of the backward twins (blend.h,
    // intersection.h), so no per-pair zeroes are added to them.
    T grad_s = weight * gw;  // dL/ds
    T hits_unit_g = 0;  // the depth mean and variance's dL/dw per unit closeness and opacity
    T grad_n = 0;       // and their dL/dn
    if (with_moments) {
      // The mean and variance in units of b_i = a_i / M_0 (blend.h, DepthStatsGrad).
      const T* st = px.moments();
      const T* g_st = px.grad_moments();
      const DepthStatsGrad<T> stats{st[0], st[1], st[2], g_st[0], g_st[1]};
      const T n_depth = normalized_depth(bp, h.depth);
      const T hits_g = stats.weight_grad(n_depth);
      const T unit_hits = unit * st[3];  // exp(s) / W_h
      const T share = weight * st[3];    // b_i
      grad_s += share * hits_g;
      hits_unit_g = unit_hits * hits_g;
      grad_n = share * stats.depth_grad(n_depth);
    }
    if (flags.opacity) {  // w = kappa o exp(s): o as a factor and through s
      acc.sums.opacity += h.kappa * unit * gw;
      if (with_moments) acc.sums.opacity += h.kappa * hits_unit_g;
      acc.sums.opacity += blend_exponent_grad_opacity(bp, h.depth, grad_s);
    }
    // dL/dz through s, and in the kernels that may carry moments through their n
    // (grad_n, 0 without them: added unconditionally, which costs less per round than a
    // test of with_moments).
    T grad_depth = blend_exponent_grad_depth(acc.exponent_slope, grad_s);
    if (!ALL_GRADS) grad_depth += normalized_depth_grad(bp, grad_n);
    range_sums.add(grad_depth, h.depth);
    if (!flags.geometry) return weight;
    T grad_kappa = opacity_unit * gw;
    if (with_moments) grad_kappa += opacity * hits_unit_g;
    if (ORTHO) {
      const Vec3<T> sensor_rel = cam.sensor_offset(T(x), T(y));
      T ga = 0, gb = 0, gcz = 0;
      intersect_orthographic_backward(h, c.x - ray.sx, c.y - ray.sy, c.z, se.terms, grad_kappa, grad_depth, ga, gb, gcz,
                                      acc.sums.radius);
      acc.sums.pos += ga * cam.x_unit + gb * cam.y_unit + gcz * cam.z_axis;
      cg.x_unit += ga * (acc.c_world - sensor_rel);
      cg.y_unit += gb * (acc.c_world - sensor_rel);
      cg.z_axis += gcz * acc.c_world;
      cg.add_sensor_offset(-(ga * cam.x_unit + gb * cam.y_unit), T(x), T(y));
    } else if constexpr (kPairRayFold) {  // StagedPixel only: LoadedPixel serves ray-sum kernels
      Vec3<T> grad_ray{0, 0, 0};
      intersect_perspective_backward(h, se.dist, se.terms, grad_kappa, grad_depth, acc.sums.centre, acc.sums.radius,
                                     grad_ray);
      cg.add_sensor_offset(unit_vector_backward(ray.dir, px.inv_ray_length(), grad_ray), T(x), T(y));
    } else if (decltype(shared_ray_sums)::value) {
      // The lanes hold distinct pixels (one group per warp): add to the pixel's sums.
      Vec3<T> ray_sums = make_vec3(ray_at[0], ray_at[kThreads], ray_at[2 * kThreads]);
      intersect_perspective_backward(h, se.dist, se.terms, grad_kappa, grad_depth, acc.sums.centre, acc.sums.radius,
                                     ray_sums);
      ray_at[0] = ray_sums.x;
      ray_at[kThreads] = ray_sums.y;
      ray_at[2 * kThreads] = ray_sums.z;
    } else {
      intersect_perspective_backward(h, se.dist, se.terms, grad_kappa, grad_depth, acc.sums.centre, acc.sums.radius,
                                     ray_acc);
    }
    return weight;
  };

  // The entry's row: position 3, radius, opacity, then the features when they are summed
  // in registers (static channel count); one reduce-scatter for all of them.
  auto finish_entry = [&](const StagedEntry<T, C_STATIC>& se, EntryAccum<T, C_STATIC>& acc, bool has_entry) {
    T* out = rows + (se.slot - window.lo) * stride;
    T values[kRowValues];
    for (int f = 0; f < kRowValues; ++f) values[f] = T(0);
    const Vec3<T> grad_pos = ORTHO ? acc.sums.pos : acc.sums.centre.resolve(make_vec3(se.cx, se.cy, se.cz), se.terms);
    values[kGpuInstPos + 0] = grad_pos.x;
    values[kGpuInstPos + 1] = grad_pos.y;
    values[kGpuInstPos + 2] = grad_pos.z;
    values[kGpuInstRadius] = acc.sums.radius.resolve(se.radius, se.terms.inv_radius);
    values[kGpuInstOpacity] = acc.sums.opacity;
    for (int ch = 0; ch < (kStatic ? C_STATIC : 0); ++ch) values[kGpuInstFeatures + ch] = acc.sums.features[ch];
    const T sum = group_sum_scatter<GROUP>(values, lane);
    const int row_values = flags.features && kStatic ? kGpuInstFeatures + channels : kGpuInstFeatures;
    if (has_entry && row_writer && my_value < row_values) out[my_value] = sum;
    if (has_entry && row_writer && my_value < 3) eye_part -= sum;
    if (!kStatic && flags.features && lane == 0)
      for (int ch = 0; ch < channels; ++ch) out[kGpuInstFeatures + ch] = feature_acc[warp * channels + ch];
    __syncwarp();
  };

  // Two entries whose boxes are both the whole tile (most pairs of large spheres), each
  // lane on the same pixel for both, so that a round's walk, the
  // pixel's terms and its ray sums are paid once for two pairs: 8 rounds, lane pixel
  // q = 32 round + lane. ta, tb: staged indices.
  auto run_whole_tile_pair = [&](int base, int ta, int tb) {
    if constexpr (kPairs) {
      const StagedEntry<T, C_STATIC>& sa = staged[ta];
      const StagedEntry<T, C_STATIC>& sb = staged[tb];
      const int ea = base + ta * splits + split, eb = base + tb * splits + split;  // list positions
      EntryAccum<T, C_STATIC> acc_a = begin_entry(sa), acc_b = begin_entry(sb);
      T* ray_at = warp_ray_grad + lane;
      for (int q = lane; q < kThreads; q += 32, ray_at += 32) {
        const int end = stage.end[q];
        const bool in_a = ea < end, in_b = eb < end;
        if (in_a || in_b) {
          const int x = tile_x0 + q % kTileSize, y = tile_y0 + q / kTileSize;
          const LoadedPixel<T, C_STATIC> px(stage, q);
          Vec3<T> ray_sums = make_vec3(ray_at[0], ray_at[kThreads], ray_at[2 * kThreads]);
          bool hit;  // not needed: the pair kernels sum features in registers
          if (in_a) add_pair(sa, acc_a, px, x, y, nullptr, ray_sums, ray_at, std::false_type{}, hit);
          if (in_b) add_pair(sb, acc_b, px, x, y, nullptr, ray_sums, ray_at, std::false_type{}, hit);
          ray_at[0] = ray_sums.x;
          ray_at[kThreads] = ray_sums.y;
          ray_at[2 * kThreads] = ray_sums.z;
        }
      }
      finish_entry(sa, acc_a, true);
      finish_entry(sb, acc_b, true);
    }
  };

  // Batches of kBatch * splits entries, of which block `split` of the tile stages every
  // splits-th (staged entry t: list position base + t * splits + split); warp w takes
  // the staged entries w * kGroups + group, stepping kWarps * kGroups (with groups, in
  // the order of their rounds; with whole-tile pairs, the pairs first, one per take).
  for (int base = e_begin; base < e_end; base += kBatch * splits) {
    const int batch_count = max(0, min(kBatch, (e_end - base - split + splits - 1) / splits));
    __syncthreads();  // every warp is done with the previous batch
    int round_key = 0;
    if (int(threadIdx.x) < batch_count) {
      const std::int64_t p = range.x + base + int(threadIdx.x) * splits + split;
      const std::int32_t id = entry_sphere[p];
      const GpuSphere<T> g = load_sphere(spheres + std::int64_t(b) * scene.n_spheres + id);
      const StagedEntry<T, C_STATIC> se = stage_entry<T, C_STATIC, kConeBoxes>(
          g, id, entry_slot[p], sv.features + std::int64_t(id) * C_STATIC, tile_x0, tile_y0, packed_camera);
      staged[threadIdx.x] = se;
      if (kPairs) {
        const bool whole_tile = se.box_w == kTileSize && se.box_h == kTileSize;
        round_key = se.box_h == 0 ? 2 : whole_tile ? 0 : 1;
        if (se.box_h == 0) zero_row(rows + (se.slot - window.lo) * stride, stride);
      } else {
        round_key = min((se.box_w * se.box_h + GROUP - 1) / GROUP, kRoundKeys) - 1;
      }
    }
    __syncthreads();
    if (kOrdered) order_by_key<kBatch>(round_key, batch_count, batch_order, round_counts);
    // Whole-tile pairs: the first 2 * pairs entries of batch_order (the whole-tile ones first).
    int pairs = 0, untaken = 0;
    if (kPairs) {
      for (int w = 0; w < kBatch / 32; ++w) {
        pairs += round_counts[w][0];
        untaken += round_counts[w][2];
      }
      pairs /= 2;
    }
    const int takes = batch_count - untaken - pairs;  // a pair is one take
    for (int local = warp * kGroups; local < takes; local += kWarps * kGroups) {
      if (kPairs && local < pairs) {
        run_whole_tile_pair(base, batch_order[2 * local], batch_order[2 * local + 1]);
        continue;
      }
      const bool has_entry = local + group < takes;
      const int taken = (has_entry ? local + group : local) + pairs;
      const int t = kOrdered ? batch_order[taken] : taken;  // staged index
      const StagedEntry<T, C_STATIC>& se = staged[t];
      const int e = base + t * splits + split;  // position in the tile's list
      const int lx0 = se.lx0, ly0 = se.ly0, box_w = se.box_w;
      const int lx1 = lx0 + box_w - 1;
      const int box_pixels = has_entry ? box_w * se.box_h : 0;
      int rounds = (box_pixels + GROUP - 1) / GROUP;  // the most over the warp's groups
      for (int offset = GROUP; offset < 32; offset *= 2)
        rounds = max(rounds, __shfl_xor_sync(kFullMask, rounds, offset));
      EntryAccum<T, C_STATIC> acc = begin_entry(se);
      if (!kStatic && flags.features && lane == 0)
        for (int k = 0; k < channels; ++k) feature_acc[warp * channels + k] = T(0);
      // Lane pixel k = round * GROUP + lane_in_group of the box, row-major:
      // (lx0 + k % box_w, ly0 + k / box_w), advanced by GROUP per round without dividing
      // (the first quotients by the staged magic number).
      const unsigned magic = se.div_magic;
      const int step_y = int((unsigned(GROUP) * magic) >> 9), step_x = GROUP - step_y * box_w;
      const int lane_row = int((unsigned(lane_in_group) * magic) >> 9);
      // The lane's column lx and tile pixel q = ly * kTileSize + lx, stepped at the end of
      // each round and wrapped at the start of the next (the first round's lx lies in the box).
      int lx = lx0 + lane_in_group - lane_row * box_w;
      int q = (ly0 + lane_row) * kTileSize + lx;
      const int step_q = step_y * kTileSize + step_x;
      const int q_limit = (ly0 + se.box_h) * kTileSize;  // past the box's last row
      // This warp's ray sums of pixel q (RAY_SUMS), stepped with q: an address carried from
      // round to round, which the compiler keeps in a register instead of rebuilding
      // warp_ray_grad + q from the thread index and the shared window per pair.
      T* ray_sums_at_q = warp_ray_grad + q;
      Vec3<T> unused_ray_acc{0, 0, 0};
      // The rounds in two copies for whole warps: where the box's width divides 32
      // (step_x = 0: whole tile rows, as large spheres mostly give), a lane keeps its
      // column and never wraps, and its rounds skip the wrap test. Not with lane groups:
      // their entries' widths differ within a warp, which would then run both copies.
      auto run_rounds = [&](auto columns_fixed) {
        constexpr bool kFixed = decltype(columns_fixed)::value;
        const int column_step = kFixed ? 0 : step_x;
        for (int round = 0; round < rounds; ++round, lx += column_step, q += step_q, ray_sums_at_q += step_q) {
          if (!kFixed && lx > lx1) {
            lx -= box_w;
            q += kTileSize - box_w;
            ray_sums_at_q += kTileSize - box_w;
          }
          // In the box: k < box_pixels, or for fixed columns (whole rows of the box's width
          // per round) q < q_limit, one test without forming k.
          const bool active = (kFixed ? q < q_limit : round * GROUP + lane_in_group < box_pixels) && e < stage.end[q];
          const int x = tile_x0 + lx, y = tile_y0 + q / kTileSize;
          const T* g_img = grad_image + (image_base + std::int64_t(y) * config.width + x) * channels;
          T weight = 0;
          bool hit = false;
          if (active)
            weight = add_pair(se, acc, StagedPixel<T, C_STATIC, ORTHO>{stage, q, cam, x, y, inv_ray_lengths}, x, y,
                              g_img, unused_ray_acc, ray_sums_at_q, std::true_type{}, hit);
          if (!kStatic && flags.features) {  // GROUP == 32 (static_assert above)
            for (int ch = 0; ch < channels; ++ch) {
              // Hits only: a miss's dL/dimage (inf or NaN where value checks are off) adds nothing.
              const T v = warp_sum(hit ? weight * g_img[ch] : T(0));
              if (lane == 0) feature_acc[warp * channels + ch] += v;
            }
          }
        }
      };
      if (GROUP == 32 && step_x == 0)
        run_rounds(std::true_type{});
      else
        run_rounds(std::false_type{});
      finish_entry(se, acc, has_entry);
    }
  }
  range_sums.finish(bp, cg.min_depth, cg.max_depth);
  // c = centre - eye: the eye's gradient is minus every position gradient (component
  // my_value of this lane's part).
  if (row_writer && my_value == 0) cg.eye.x = eye_part;
  if (row_writer && my_value == 1) cg.eye.y = eye_part;
  if (row_writer && my_value == 2) cg.eye.z = eye_part;

  // Block reductions in a fixed order: camera terms, then background terms.
  __syncthreads();
  if (RAY_SUMS && tile_camera && own_inside) {
    Vec3<T> grad_ray{0, 0, 0};  // warps in index order
    for (int w = 0; w < kWarps; ++w) {
      const T* sums = ray_grad + w * 3 * kThreads + threadIdx.x;
      grad_ray = grad_ray + make_vec3(sums[0], sums[kThreads], sums[2 * kThreads]);
    }
    cg.add_sensor_offset(normalize_backward(cam.sensor_offset(T(own_x), T(own_y)), grad_ray), T(own_x), T(own_y));
  }
  if (camera_out) {
    T values[kCameraGradValues];
    cg.to_array(values);
    block_sum(kCameraGradValues, [&](int k) { return values[k]; }, feature_acc, camera_out, !window.first);
  }
  const bool pixel_terms = own_inside && split == 0 && window.first;
  if (background_out)
    block_sum(
        channels, [&](int ch) { return pixel_terms ? grad_image[own_pix * channels + ch] * bg_share : T(0); },
        feature_acc, background_out, !window.first);
}

// The partial and row outputs of one launch.
template <typename T>
struct BackwardTargets {
  SlotWindow window;
  int* tile_ends;
  T* rows;
  T* tile_camera;
  T* tile_background;
};

// dynamic_smem: the kernel's dynamic shared memory without the ray sums; ray_sum_bytes:
// theirs (RAY_SUMS).
template <typename T, int C_STATIC, bool ORTHO, bool RAY_SUMS>
void launch_kernel(unsigned blocks, std::size_t dynamic_smem, std::size_t ray_sum_bytes, const RendererConfig& config,
                   const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args, GradFlags flags,
                   cudaStream_t stream, CudaScratch& s, const BackwardTargets<T>& to) {
  // Small boxes (at least half the instances' boxes within their tile of at most
  // kSmallBoxPixels pixels): groups of 8 lanes, or 16 when a row's values need them;
  // otherwise whole warps (on large boxes groups only multiply the rounds). The generic
  // channel path sums features per round over the whole warp and always takes 32.
  constexpr int kSmallGroup = C_STATIC == 0 ? 32 : (next_pow2(kGpuInstFeatures + C_STATIC) <= 8 ? 8 : 16);
  auto run = [&](auto group, auto grads, LaunchGate gate) {
    constexpr int kGroup = decltype(group)::value;
    constexpr bool kRaySums = RAY_SUMS && kGroup == 32;
    render_backward_kernel<T, C_STATIC, ORTHO, kRaySums, kGroup, decltype(grads)::value>
        <<<blocks * s.backward_splits, kThreads, dynamic_smem + (kRaySums ? ray_sum_bytes : 0), stream>>>(
            config, scene, options, args, flags, s.spheres.as<GpuSphere<T>>(), s.entry_sphere(), s.entry_slot(),
            s.tile_ranges.as<int2>(), to.tile_ends, s.backward_splits, to.window, to.rows, to.tile_camera,
            to.tile_background, gate);
  };
  // The fixed-gradient kernels only where the time is: float, perspective, a static
  // channel count.
  constexpr bool kSpecialise = std::is_same<T, float>::value && !ORTHO && C_STATIC > 0;
  const bool all_grads =
      kSpecialise && flags.features && flags.blend && flags.geometry && args.grad_depth_moments == nullptr;
  auto run_group = [&](auto group, LaunchGate gate) {
    if (all_grads && flags.opacity)
      run(group, std::integral_constant<int, kSpecialise ? kAllGrads : kGradsByFlags>{}, gate);
    else if (all_grads)
      run(group, std::integral_constant<int, kSpecialise ? kAllButOpacity : kGradsByFlags>{}, gate);
    else
      run(group, std::integral_constant<int, kGradsByFlags>{}, gate);
  };
  // With the counts on the device only (a binning sized by its capacity), both groupings
  // are launched, each gated by the same rule.
  if (kSmallGroup == 32)
    run_group(std::integral_constant<int, 32>{}, LaunchGate{});
  else if (s.device_counts != nullptr) {
    run_group(std::integral_constant<int, kSmallGroup>{}, LaunchGate::of(s, LaunchGate::kSmallBoxes));
    run_group(std::integral_constant<int, 32>{}, LaunchGate::of(s, LaunchGate::kLargeBoxes));
  } else if (!LaunchGate::large_boxes(s.n_instances, s.small_box_instances))
    run_group(std::integral_constant<int, kSmallGroup>{}, LaunchGate{});
  else
    run_group(std::integral_constant<int, 32>{}, LaunchGate{});
  PULSAR_CUDA_LAUNCH_CHECK("render_backward_kernel");
}

template <typename T, int C_STATIC>
void launch(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
            const BackwardArgs& args, GradFlags flags, cudaStream_t stream, CudaScratch& s,
            const BackwardTargets<T>& to) {
  const unsigned blocks = unsigned(Tiling::of(config.width, config.height).n_tiles() * scene.batch_size);
  const std::size_t fixed =
      sizeof(PixelStage<T, C_STATIC>) + sizeof(int) + sizeof(StagedEntry<T, C_STATIC>) * staged_batch<T, C_STATIC>();
  const std::size_t dynamic = kWarps * std::size_t(std::max(kCameraGradValues, config.n_channels)) * sizeof(T);
  const std::size_t ray_sums = kWarps * 3 * std::size_t(kThreads) * sizeof(T);
  if (fixed + dynamic > kSharedBytesWithoutOptIn)
    throw std::invalid_argument("n_channels: " + std::to_string(config.n_channels) +
                                " channels exceed the CUDA backward's shared memory");
  if (config.orthographic)
    launch_kernel<T, C_STATIC, true, false>(blocks, dynamic, 0, config, scene, options, args, flags, stream, s, to);
  else if (std::is_same<T, float>::value && fixed + dynamic + ray_sums <= kSharedBytesWithoutOptIn)
    launch_kernel<T, C_STATIC, false, std::is_same<T, float>::value>(blocks, dynamic, ray_sums, config, scene, options,
                                                                     args, flags, stream, s, to);
  else
    launch_kernel<T, C_STATIC, false, false>(blocks, dynamic, 0, config, scene, options, args, flags, stream, s, to);
}

}  // namespace

template <typename T>
void cuda_render_backward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                          const BackwardArgs& args, const GradientOutputs& grads, cudaStream_t stream,
                          CudaScratch& scratch) {
  const std::int64_t total_tiles = Tiling::of(config.width, config.height).n_tiles() * scene.batch_size;
  // Blocks per tile: enough for about four waves of four blocks per SM, at most 4, so
  // that an image of few tiles still fills the GPU.
  const std::int64_t wave = 4 * std::int64_t(scratch.sm_count);
  scratch.backward_splits =
      int(std::min<std::int64_t>(4, std::max<std::int64_t>(1, (4 * wave + total_tiles - 1) / total_tiles)));
  const std::int64_t partial_rows = total_tiles * scratch.backward_splits;
  const int stride = kGpuInstFeatures + config.n_channels;
  const std::int64_t row_bytes = std::int64_t(sizeof(T)) * stride;
  const std::int64_t n = scratch.list_room;  // the instances, or the capacity (then some rows go unused)
  // The window's rows behind the maps the forward left at the arena's start
  // (InstanceArena); growing the arena keeps the maps.
  const InstanceArena layout = InstanceArena::of(std::size_t(n), config, scene);
  // The windows split the slots as a binning sized by its count would whenever the host
  // knows the count (lists built in a larger room, the count read back after): the sphere
  // sums add the windows in order, so other windows would round differently. A capture's
  // count stays on the device: its windows split the room.
  const std::int64_t listed = scratch.listed_instances();
  const RowWindows windows =
      RowWindows::of(InstanceArena::of(std::size_t(listed), config, scene), row_bytes, scratch.backward_row_budget);
  const std::size_t row_space = std::size_t(std::max<std::int64_t>(windows.size, 1) * row_bytes);
  unsigned char* arena = scratch.instance_arena.reserve_keeping<unsigned char>(
      layout.rows() + row_space, layout.maps_bytes(), stream, "instance gradient rows");
  T* rows = reinterpret_cast<T*>(arena + layout.rows());
  BackwardTargets<T> to;
  to.rows = rows;
  to.tile_ends = windows.count > 1 ? scratch.tile_ends.reserve<int>(std::size_t(total_tiles), "tile ends") : nullptr;
  to.tile_camera = grads.cameras ? scratch.tile_camera_grads.reserve<T>(std::size_t(partial_rows) * kCameraGradValues,
                                                                        "camera gradients")
                                 : nullptr;
  to.tile_background = grads.background ? scratch.tile_background_grads.reserve<T>(
                                              std::size_t(partial_rows) * config.n_channels, "background gradients")
                                        : nullptr;
  GradFlags flags;
  flags.features = grads.features != nullptr;
  flags.geometry = grads.positions || grads.radii || grads.cameras;
  flags.opacity = grads.opacities != nullptr;
  flags.blend = flags.geometry || flags.opacity;
  const bool sphere_grads = grads.positions || grads.radii || grads.opacities || grads.features;
  for (std::int64_t w = 0; w < windows.count; ++w) {
    to.window.lo = w * windows.size;
    to.window.hi = std::min(listed, to.window.lo + windows.size);
    to.window.first = w == 0;
    to.window.whole = windows.count == 1;
    // Rows of entries no pixel reached are zeroed by the kernel (zero_unreached_rows).
    switch (config.n_channels) {
      case 1: launch<T, 1>(config, scene, options, args, flags, stream, scratch, to); break;
      case 3: launch<T, 3>(config, scene, options, args, flags, stream, scratch, to); break;
      case 4: launch<T, 4>(config, scene, options, args, flags, stream, scratch, to); break;
      default: launch<T, 0>(config, scene, options, args, flags, stream, scratch, to); break;
    }
    if (sphere_grads)
      cuda_reduce_sphere_rows<T>(config, scene, grads, stream, scratch, rows, to.window.lo, to.window.hi,
                                 to.window.first);
  }
}

template <typename T>
void cuda_gradients_nan_on_failure(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                                   const GradientOutputs& grads, cudaStream_t stream, const CudaScratch& scratch) {
  const std::int64_t spheres = scene.n_spheres * (scene.shared_spheres ? 1 : scene.batch_size);
  OverflowTargets targets;
  targets.add(grads.positions, 3 * spheres);
  targets.add(grads.features, spheres * config.n_channels);
  targets.add(grads.radii, spheres);
  targets.add(grads.opacities, spheres);
  targets.add(grads.background, config.n_channels);
  targets.add(grads.cameras, std::int64_t(scene.batch_size) * CAMERA_PARAMS);
  cuda_nan_on_failure<T>(scratch, options, targets, stream);
}

template void cuda_gradients_nan_on_failure<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                                   const GradientOutputs&, cudaStream_t, const CudaScratch&);
template void cuda_gradients_nan_on_failure<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                                    const GradientOutputs&, cudaStream_t, const CudaScratch&);

template void cuda_render_backward<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                          const BackwardArgs&, const GradientOutputs&, cudaStream_t, CudaScratch&);
template void cuda_render_backward<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                           const BackwardArgs&, const GradientOutputs&, cudaStream_t, CudaScratch&);

}  // namespace pulsar
