// Stage 2 on CUDA: one block per (camera, tile), one thread per pixel (16x16 threads) or,
// where most boxes are large, two (8x16 threads: render_forward_two_kernel). The block
// walks its tile's depth-ordered list in batches that it loads cooperatively into shared
// memory; each pixel stops at its own early-termination point (PixelBlend,
// pixel_blend.cuh), and the block stops when every pixel has.
#include <limits>

#include "cuda_scratch.h"
#include "pixel_blend.cuh"
#include "sphere_cone.cuh"
#include "warp_reduce.cuh"
#include "pulsar/pixel_ray.h"

namespace pulsar {

namespace {

constexpr int kThreads = kTileSize * kTileSize;

constexpr unsigned kFullMask = 0xffffffffu;

// Pixel of a thread within its tile: each warp covers an 8x4 block (not a 16x2 strip), so
// a small sphere touches fewer warps and more of each touched warp's lanes.
__device__ inline int2 thread_pixel(int thread) {
  const int warp = thread / 32, lane = thread % 32;
  return make_int2((warp % 2) * 8 + lane % 8, (warp / 2) * 4 + lane / 8);
}

// The lanes of warp w (bit: lane, lane = column + 8 * row of the warp's 8x4 block, as
// thread_pixel lays them out) whose pixels the tile-local box [lx0, lx1] x [ly0, ly1]
// covers (an empty box covers none).
__device__ unsigned lanes_covered(int lx0, int lx1, int ly0, int ly1, int w) {
  const int cx0 = max(lx0 - (w % 2) * 8, 0), cx1 = min(lx1 - (w % 2) * 8, 7);
  const int ry0 = max(ly0 - (w / 2) * 4, 0), ry1 = min(ly1 - (w / 2) * 4, 3);
  if (cx0 > cx1 || ry0 > ry1) return 0u;
  const unsigned columns = (0xffu >> (7 - cx1)) & (0xffu << cx0);
  const unsigned rows = (0xffffffffu >> (8 * (3 - ry1))) & (0xffffffffu << (8 * ry0));
  return (columns * 0x01010101u) & rows;
}

// Transpose of the 32x32 bit matrix whose row i is lane i's word: lane L gets the word
// whose bit i is bit L of lane i's word. Five butterfly steps, each swapping the
// off-diagonal blocks of half the previous size. All 32 lanes must call it.
__device__ unsigned transpose_bits(unsigned x, int lane) {
  const unsigned kLow[5] = {0x0000ffffu, 0x00ff00ffu, 0x0f0f0f0fu, 0x33333333u, 0x55555555u};
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    const int s = 16 >> k;
    const unsigned y = __shfl_xor_sync(kFullMask, x, s);
    x = (lane & s) ? ((x & ~kLow[k]) | ((y >> s) & kLow[k])) : ((x & kLow[k]) | ((y << s) & ~kLow[k]));
  }
  return x;
}

// One entry of a batch as the block stages it in shared memory: the sphere record, its
// features when the channel count is static (else read from global memory per hit), its
// index, its exponent's slope (blend_exponent_slope: a product per hit otherwise) and its
// stop key (TerminationTest::key, which the termination test compares per visit), in one
// record so that a visit derives one shared address.
template <typename T, int C_STATIC>
struct BatchFields {
  GpuSphere<T> sphere;
  T features[C_STATIC > 0 ? C_STATIC : 1];
  std::int32_t id;
  T exponent_slope;
  T stop_key;
};

// A record padded to an odd number of 16-byte words (float, 1 to 4 channels: 80 bytes): lanes
// that walk their own entries (lane by lane) read them in 16-byte loads without bank
// conflicts, which an even stride (64 bytes) has between every other lane. Padded where a
// batch of them and its coverage words fit the 48 KiB of static shared memory (double
// with 4 channels: 160 bytes unpadded).
template <typename F, bool PAD>
struct OddWords {
  F fields;
  unsigned char pad[16];
};
template <typename F>
struct OddWords<F, false> {
  F fields;
};
// Shared memory of a block's coverage words (`coverage[kThreads / 32][kThreads]` in both
// kernels), which share the static 48 KiB with the batch.
constexpr std::size_t kCoverageBytes = sizeof(unsigned) * (kThreads / 32) * kThreads;
template <typename T, int C_STATIC>
constexpr bool pads_batch_entry() {
  constexpr std::size_t words = sizeof(BatchFields<T, C_STATIC>) / 16;
  return words % 2 == 0 && (words + 1) * 16 * kThreads + kCoverageBytes <= kSharedBytesWithoutOptIn;
}
template <typename T, int C_STATIC>
using BatchEntry = OddWords<BatchFields<T, C_STATIC>, pads_batch_entry<T, C_STATIC>()>;
static_assert(sizeof(BatchEntry<float, 1>) == 80 && sizeof(BatchEntry<float, 3>) == 80 &&
                  sizeof(BatchEntry<float, 4>) == 80,
              "a float batch record is five 16-byte words");

// The lanes of each warp block (words[w], as lanes_covered) whose pixel lies in both the
// tile-local box `local` (pixels of the tile at (tile_x0, tile_y0)) and its row's columns
// of sphere g's cone (ConeRows, include/pulsar/cone_rows.h). False where the cone gives
// nothing tighter than the box: not an ellipse, too wide, or holding all four corners of
// the box (an ellipse is convex, so then it holds the whole box).
template <typename T>
__device__ bool cone_coverage(const T* packed_camera, const GpuSphere<T>& g, int tile_x0, int tile_y0,
                              PixelBounds local, unsigned (&words)[kThreads / 32]) {
  const ConeRows<T> cone = cone_rows_of(packed_camera, g);
  if (!cone.active) return false;
  const int x0 = tile_x0 + local.x0, x1 = tile_x0 + local.x1, y0 = tile_y0 + local.y0, y1 = tile_y0 + local.y1;
  if (cone.inside(x0, y0) && cone.inside(x1, y0) && cone.inside(x0, y1) && cone.inside(x1, y1)) return false;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) words[w] = 0u;
#pragma unroll
  for (int y = 0; y < kTileSize; ++y) {
    if (y < local.y0 || y > local.y1) continue;
    int lo, hi;
    cone.columns(tile_y0 + y, lo, hi);
    lo = max(lo - tile_x0, local.x0);
    hi = min(hi - tile_x0, local.x1);
    if (lo > hi) continue;
    // Row y of the tile is row y % 4 of warp blocks 2 (y / 4) (columns 0-7) and 2 (y / 4) + 1.
    const unsigned row = (0xffffu >> (kTileSize - 1 - hi)) & (0xffffu << lo);
    words[2 * (y / 4)] |= (row & 0xffu) << (8 * (y % 4));
    words[2 * (y / 4) + 1] |= (row >> 8) << (8 * (y % 4));
  }
  return true;
}

// Stages list positions [start, start + kThreads) of the tile (those before list_end) in
// batch, and each entry's coverage of the 8 warp blocks (8x4 pixels each; coverage[w][e]:
// the lanes of block w whose pixel entry e's box covers), the block's `threads` threads
// taking kThreads / threads entries each. Ends with the block synchronised.
// CONE_ROWS (perspective only; packed_camera, the call's packed camera, is read only
// then): an entry whose box covers at least kConeMinBoxPixels of the tile takes its
// coverage row by row from the sphere's cone (cone_coverage) instead. The two-pixel
// kernel stages so (large spheres: a box's corners hold many pixels, and lockstep skips
// a warp whose pixels all miss); the one-pixel kernel's small spheres save too few visits
// for the cone's setup, and keep the box.
template <typename T, int C_STATIC, bool CONE_ROWS>
__device__ void stage_batch(int start, int list_end, int threads, const GpuSphere<T>* spheres,
                            const std::int32_t* entry_sphere, const VisitContext<T>& ctx, const T* packed_camera,
                            int tile_x0, int tile_y0, BatchEntry<T, C_STATIC>* batch, unsigned (*coverage)[kThreads]) {
  for (int k = int(threadIdx.x); k < kThreads; k += threads) {
    const int p = start + k;
    int lx0 = 0, lx1 = -1, ly0 = 0, ly1 = -1;  // the entry's box in the tile (empty past the list)
    if (p < list_end) {
      const std::int32_t id = entry_sphere[p];
      const GpuSphere<T> g = load_sphere(spheres + id);
      BatchFields<T, C_STATIC>& e = batch[k].fields;
      e.sphere = g;
      e.id = id;
      e.exponent_slope = blend_exponent_slope(ctx.bp, g.opacity);
      e.stop_key = TerminationTest<T>::key(ctx.bp, ctx.stop_key_offset, g.closest_depth);
      lx0 = max(int(g.x0) - tile_x0, 0), lx1 = min(int(g.x1) - tile_x0, kTileSize - 1);
      ly0 = max(int(g.y0) - tile_y0, 0), ly1 = min(int(g.y1) - tile_y0, kTileSize - 1);
      for (int c = 0; c < C_STATIC; ++c) e.features[c] = ctx.features[std::int64_t(id) * C_STATIC + c];
      unsigned words[kThreads / 32];
      const PixelBounds local{lx0, ly0, lx1, ly1};
      if (CONE_ROWS && takes_cone(local) && cone_coverage(packed_camera, g, tile_x0, tile_y0, local, words)) {
#pragma unroll
        for (int w = 0; w < kThreads / 32; ++w) coverage[w][k] = words[w];
        continue;
      }
    }
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) coverage[w][k] = lanes_covered(lx0, lx1, ly0, ly1, w);
  }
  __syncthreads();
}

// ORTHO: the camera model, a template parameter so that each kernel carries one.
// MOMENTS: the depth moments are accumulated and stored (asked for by render(); a kernel
// without them spends nothing on them per hit).
template <typename T, int C_STATIC, bool ORTHO, bool WITH_INFO, bool MOMENTS>
__global__ void __launch_bounds__(kThreads)
    render_forward_kernel(RendererConfig config, SceneArgs scene, RenderOptions options, ForwardOutputs out,
                          const GpuSphere<T>* spheres, const std::int32_t* entry_sphere, const int2* tile_ranges,
                          LaunchGate gate) {
  if (!gate.open()) return;  // the other kernel of the pair renders (LaunchGate)
  __shared__ BatchEntry<T, C_STATIC> batch[kThreads];
  // coverage[w][e]: the lanes of warp w whose pixel entry e's box covers (written by the
  // entry's loader); then, once warp w has transposed its row chunk by chunk,
  // coverage[w][32 * chunk + lane]: the entries of the chunk (bit j: entry 32 * chunk + j)
  // whose box covers the lane's pixel.
  __shared__ unsigned coverage[kThreads / 32][kThreads];
  const std::int64_t item = blockIdx.x;  // (camera, tile)
  const Tiling::Item at = Tiling::of(config.width, config.height).locate(item);
  const int b = at.camera, tile_x0 = at.x0, tile_y0 = at.y0;
  const int2 local = thread_pixel(int(threadIdx.x));
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const VisitContext<T> ctx = visit_context<T>(config, scene, options, b, ORTHO);
  PixelBlend<T, C_STATIC, WITH_INFO, MOMENTS> px;
  const bool inside = px.start(ctx, config, b, tile_x0 + local.x, tile_y0 + local.y, static_cast<T*>(out.image));
  bool done = !inside;
  const GpuSphere<T>* camera_spheres = spheres + std::int64_t(b) * scene.n_spheres;

  // A lane visits only the entries whose box covers its pixel. Skipping the others
  // changes nothing: an entry a pixel's box test rejects adds no hit, and the stop test
  // (zc against the termination depth, which only hits move) that it would have made is
  // made at the lane's next entry, or at the next batch's first entry, with a zc at least
  // as large. Each warp walks a batch in one of two ways:
  // * in lockstep: every lane takes the same entry, one after the other over the entries
  //   that cover any of the warp's pixels;
  // * lane by lane: each lane takes its own next entry, so that a round covers as many
  //   pixels as have entries left. With small spheres (one covers a few of a warp's 32
  //   pixels) the rounds are the most entries any one lane has, not the entries of all.
  //   Lanes out of step mix hits with misses in a round, so with large spheres lockstep
  //   is faster, with small ones lane by lane.
  // The warp walks lane by lane when that takes at most 3/4 of lockstep's rounds.
  const int2 range = tile_ranges[item];
  const unsigned batch_address = unsigned(__cvta_generic_to_shared(batch));
  for (int start = range.x; start < range.y; start += kThreads) {
    if (__syncthreads_and(done)) break;
    stage_batch<T, C_STATIC, false>(start, range.y, kThreads, camera_spheres, entry_sphere, ctx, nullptr, tile_x0,
                                    tile_y0, batch, coverage);
    const int batch_size = min(kThreads, range.y - start);
    const int chunks = (batch_size + 31) / 32;
    if (!done && px.stops_before(batch[0].fields.sphere.closest_depth, batch[0].fields.stop_key, ctx)) done = true;
    if (__all_sync(kFullMask, done)) continue;

    // The warp's entry sets, and the rounds of either walk.
    unsigned* own_sets = coverage[warp];
    int lockstep_rounds = 0, own_entries = 0;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const unsigned lanes = own_sets[chunk * 32 + lane];
      lockstep_rounds += __popc(__ballot_sync(kFullMask, lanes != 0u));
      const unsigned entries = transpose_bits(lanes, lane);
      own_sets[chunk * 32 + lane] = entries;
      own_entries += done ? 0 : __popc(entries);
    }
    const bool by_lane = 4 * warp_max(unsigned(own_entries)) <= 3 * unsigned(lockstep_rounds);

    // Visits a batch entry that covers this lane's pixel, read where the visit uses its
    // fields. (The lane's last hit in this batch is kept as the entry's shared-memory
    // address, which the visit has at hand, not as an index that the lockstep walk would
    // rebuild from the bit it consumed.)
    auto visit = [&](const BatchEntry<T, C_STATIC>& entry) -> bool {
      const BatchFields<T, C_STATIC>& e = entry.fields;
      const T* col = C_STATIC > 0 ? e.features : ctx.features + std::int64_t(e.id) * ctx.channels;
      return px.visit(e.sphere, e.exponent_slope, e.stop_key, col, e.id, unsigned(__cvta_generic_to_shared(&entry)),
                      ctx);
    };

    if (by_lane) {
      int chunk = done ? chunks : 0;
      const BatchEntry<T, C_STATIC>* chunk_entries = batch;  // batch + 32 chunk, carried (below)
      unsigned pending = done ? 0u : own_sets[lane];  // this chunk's entries still to visit
      for (;;) {
        while (pending == 0u && ++chunk < chunks) {
          chunk_entries += 32;
          pending = own_sets[chunk * 32 + lane];
        }
        if (!__any_sync(kFullMask, pending != 0u)) break;
        if (pending == 0u) continue;
        const int bit = __ffs(int(pending)) - 1;
        pending &= pending - 1u;
        if (!visit(chunk_entries[bit])) {
          done = true;
          pending = 0u;
          chunk = chunks;
        }
      }
    } else {
      // The chunk's last entry, carried from chunk to chunk: the compiler keeps it in a
      // register instead of rebuilding the shared window's address from batch + j per
      // visit. The chunk's sets are bit-reversed (entry j at bit 31 - j), so that the next
      // entry in depth order is the highest set bit, one instruction (the lowest takes
      // two); `live` is the lane's set (none once done).
      const BatchEntry<T, C_STATIC>* chunk_last = batch + 31;
      for (int chunk = 0; chunk < chunks; ++chunk, chunk_last += 32) {
        if (__all_sync(kFullMask, done)) break;
        const unsigned live = done ? 0u : __brev(own_sets[chunk * 32 + lane]);
        unsigned any = warp_or(live);
        while (any != 0u) {
          const int top = 31 - __clz(int(any));
          const unsigned bit = 1u << top;
          if ((live & bit) && !visit(chunk_last[-top])) break;  // this lane alone; the others go on
          any ^= bit;
        }
        // A lane that stopped left with its entry's bit still set (setting `done` at the
        // stop would make the compiler save and restore a flag byte around every visit).
        if (any != 0u) done = true;
      }
    }
    px.template end_batch<BatchEntry<T, C_STATIC>>(start - range.x, batch_address);
  }
  if (inside) px.finish(out, config, ctx.channels);
}

// Blocks of render_forward_two_kernel that an sm_90 multiprocessor's shared memory holds
// (228 KiB, of which 1 KiB is reserved per block; the staged batch and its coverage words
// per block), at most eight. The register bound asks for no more blocks than that: a
// tighter one only caps the registers (at eight blocks, 64) and spills, for no more
// blocks. Other architectures hold fewer blocks, for which the bound's registers suffice.
template <typename T, int C_STATIC>
constexpr int two_pixel_blocks_per_sm() {
  constexpr std::size_t kSmBytes = 228 * 1024, kReservedPerBlock = 1024;
  constexpr std::size_t block_bytes = sizeof(BatchEntry<T, C_STATIC>) * kThreads + kCoverageBytes + kReservedPerBlock;
  return int(std::min<std::size_t>(8, kSmBytes / block_bytes));
}
static_assert(two_pixel_blocks_per_sm<float, 3>() == 7, "seven float blocks per sm_90 multiprocessor");

// The common call's forward where a tile's spheres are mostly large (most boxes cover a
// warp's pixels whole): two pixels per thread, (x, y) and (x, y + 4) of the same 8x8
// block per warp, in lockstep only, so that a visited entry's walk and its record's loads
// serve both pixels. Without forward info, depth moments or a hit cap
// (render_forward_kernel has those); each pixel's arithmetic is PixelBlend's, as there,
// so the image is the same bit for bit. As many blocks per SM as its shared memory holds,
// at most eight (two_pixel_blocks_per_sm: float seven, at up to 72 registers).
template <typename T, int C_STATIC, bool ORTHO>
__global__ void __launch_bounds__(kThreads / 2, (two_pixel_blocks_per_sm<T, C_STATIC>()))
    render_forward_two_kernel(RendererConfig config, SceneArgs scene, RenderOptions options, ForwardOutputs out,
                              const GpuSphere<T>* spheres, const std::int32_t* entry_sphere, const int2* tile_ranges,
                              LaunchGate gate) {
  if (!gate.open()) return;  // the other kernel of the pair renders (LaunchGate)
  constexpr int kBlock = kThreads / 2;
  __shared__ BatchEntry<T, C_STATIC> batch[kThreads];
  __shared__ unsigned coverage[kThreads / 32][kThreads];  // as render_forward_kernel's, per 8x4 block
  const std::int64_t item = blockIdx.x;  // (camera, tile)
  const Tiling::Item at = Tiling::of(config.width, config.height).locate(item);
  const int b = at.camera, tile_x0 = at.x0, tile_y0 = at.y0;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const VisitContext<T> ctx = visit_context<T>(config, scene, options, b, ORTHO);
  // Pixel i of the lane: that of 8x4 block (`virtual warp`) blocks[i] of the one-pixel layout.
  int blocks[2];
  PixelBlend<T, C_STATIC, false, false, false> px[2];  // no hit cap (launch)
  bool inside[2], done[2];
  for (int i = 0; i < 2; ++i) {
    blocks[i] = warp % 2 + 2 * (2 * (warp / 2) + i);
    const int2 local = thread_pixel(blocks[i] * 32 + lane);
    inside[i] = px[i].start(ctx, config, b, tile_x0 + local.x, tile_y0 + local.y, static_cast<T*>(out.image));
    done[i] = !inside[i];
  }
  const GpuSphere<T>* camera_spheres = spheres + std::int64_t(b) * scene.n_spheres;
  // Coverage from the spheres' cones (stage_batch) in float: in double the cone's
  // arithmetic costs twice as much and spills around the visits' state.
  constexpr bool kConeRows = !ORTHO && sizeof(T) == 4;
  const T* packed_camera = packed_camera_of<T>(scene, b);
  const int2 range = tile_ranges[item];
  const unsigned batch_address = unsigned(__cvta_generic_to_shared(batch));
  for (int start = range.x; start < range.y; start += kThreads) {
    if (__syncthreads_and(done[0] && done[1])) break;
    stage_batch<T, C_STATIC, kConeRows>(start, range.y, kBlock, camera_spheres, entry_sphere, ctx, packed_camera,
                                        tile_x0, tile_y0, batch, coverage);
    const int chunks = (min(kThreads, range.y - start) + 31) / 32;
    for (int i = 0; i < 2; ++i)
      if (!done[i] && px[i].stops_before(batch[0].fields.sphere.closest_depth, batch[0].fields.stop_key, ctx))
        done[i] = true;
    if (__all_sync(kFullMask, done[0] && done[1])) continue;
    for (int i = 0; i < 2; ++i)
      for (int chunk = 0; chunk < chunks; ++chunk) {
        unsigned* set = &coverage[blocks[i]][chunk * 32 + lane];
        *set = transpose_bits(*set, lane);
      }
    // Lockstep as render_forward_kernel's: bit-reversed sets, the next entry the highest
    // set bit of either pixel's; the entry's record is read once for both pixels.
    const BatchEntry<T, C_STATIC>* chunk_last = batch + 31;
    for (int chunk = 0; chunk < chunks; ++chunk, chunk_last += 32) {
      if (__all_sync(kFullMask, done[0] && done[1])) break;
      unsigned live[2];
      for (int i = 0; i < 2; ++i) live[i] = done[i] ? 0u : __brev(coverage[blocks[i]][chunk * 32 + lane]);
      unsigned any = warp_or(live[0] | live[1]);
      unsigned stopped = 0u;
      while (any != 0u) {
        const int top = 31 - __clz(int(any));
        const unsigned bit = 1u << top;
        if ((live[0] | live[1]) & bit) {
          const BatchEntry<T, C_STATIC>& entry = chunk_last[-top];
          const GpuSphere<T> g = entry.fields.sphere;
          const T slope = entry.fields.exponent_slope, key = entry.fields.stop_key;
          T col[C_STATIC > 0 ? C_STATIC : 1];
          for (int c = 0; c < C_STATIC; ++c) col[c] = entry.fields.features[c];
          const unsigned address = unsigned(__cvta_generic_to_shared(&entry));
          for (int i = 0; i < 2; ++i)
            if ((live[i] & bit) && !px[i].visit(g, slope, key, col, entry.fields.id, address, ctx)) {
              live[i] = 0u;  // it stops: no more visits
              stopped |= 1u << i;
            }
        }
        any ^= bit;
      }
      // The stops as bits of one word, applied after the chunk (set at the stop, the flags
      // would be kept as bytes and moved around every visit).
      for (int i = 0; i < 2; ++i) done[i] = done[i] || ((stopped >> i) & 1u);
    }
    for (int i = 0; i < 2; ++i) px[i].template end_batch<BatchEntry<T, C_STATIC>>(start - range.x, batch_address);
  }
  for (int i = 0; i < 2; ++i)
    if (inside[i]) px[i].finish(out, config, ctx.channels);
}

template <typename T, int C_STATIC, bool ORTHO>
void launch(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
            const ForwardOutputs& out, cudaStream_t stream, CudaScratch& s, unsigned blocks) {
  const auto* spheres = s.spheres.as<GpuSphere<T>>();
  const std::int32_t* entries = s.entry_sphere();
  const auto* ranges = s.tile_ranges.as<int2>();
  // render() (which asks for the depth moments) must give forward()'s image bit for bit:
  // the image's arithmetic is the same in both kernels (the exponent is formed from the
  // depth, not from n, which only the moments use). The forward_info kernel (rare)
  // accumulates the moments too.
  // Two pixels per thread where most instances' boxes within their tile are large (the
  // measure the backward picks its lane groups by): lockstep is then the walk, and its
  // visits serve both pixels. Not with a hit cap (rare), which that kernel leaves out.
  // With the counts on the device only (a binning sized by its capacity), both kernels
  // are launched, each gated by the same rule.
  const LaunchGate always{};
  const bool on_device = s.device_counts != nullptr;
  const bool large_boxes = LaunchGate::large_boxes(s.n_instances, s.small_box_instances);
  const bool hit_cap = hit_cap_of(options) < std::numeric_limits<int>::max();
  const bool two_pixel_kernel = C_STATIC > 0 && !hit_cap && (on_device || large_boxes);
  const bool one_pixel_kernel = !two_pixel_kernel || on_device;
  if (out.forward_info) {
    render_forward_kernel<T, C_STATIC, ORTHO, true, true>
        <<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges, always);
  } else if (out.depth_moments) {
    render_forward_kernel<T, C_STATIC, ORTHO, false, true>
        <<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges, always);
  } else {
    const bool both = two_pixel_kernel && one_pixel_kernel;
    if (two_pixel_kernel)
      render_forward_two_kernel<T, (C_STATIC > 0 ? C_STATIC : 1), ORTHO>
          <<<blocks, kThreads / 2, 0, stream>>>(config, scene, options, out, spheres, entries, ranges,
                                                both ? LaunchGate::of(s, LaunchGate::kLargeBoxes) : always);
    if (one_pixel_kernel)
      render_forward_kernel<T, C_STATIC, ORTHO, false, false>
          <<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges,
                                            both ? LaunchGate::of(s, LaunchGate::kSmallBoxes) : always);
  }
  PULSAR_CUDA_LAUNCH_CHECK("render_forward_kernel");
}

template <typename T, int C_STATIC>
void launch(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
            const ForwardOutputs& out, cudaStream_t stream, CudaScratch& s, unsigned blocks) {
  if (config.orthographic)
    launch<T, C_STATIC, true>(config, scene, options, out, stream, s, blocks);
  else
    launch<T, C_STATIC, false>(config, scene, options, out, stream, s, blocks);
}

}  // namespace

template <typename T>
void cuda_render_forward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                         const ForwardOutputs& out, cudaStream_t stream, CudaScratch& scratch) {
  const unsigned blocks = unsigned(Tiling::of(config.width, config.height).n_tiles() * scene.batch_size);
  switch (config.n_channels) {
    case 1: launch<T, 1>(config, scene, options, out, stream, scratch, blocks); break;
    case 3: launch<T, 3>(config, scene, options, out, stream, scratch, blocks); break;
    case 4: launch<T, 4>(config, scene, options, out, stream, scratch, blocks); break;
    default: launch<T, 0>(config, scene, options, out, stream, scratch, blocks); break;
  }
  // A binning sized by its capacity that overflowed it, or values out of range: NaN, never
  // a silently wrong image.
  const std::int64_t pixels = std::int64_t(config.width) * config.height * scene.batch_size;
  OverflowTargets targets;
  targets.add(out.image, pixels * config.n_channels);
  targets.add(out.blend_state, pixels * 2);
  targets.add(out.forward_info, out.forward_info ? pixels * (3 + 2 * config.n_track) : 0);
  targets.add(out.depth_moments, out.depth_moments ? pixels * kDepthStats : 0);
  cuda_nan_on_failure<T>(scratch, options, targets, stream);
}

template void cuda_render_forward<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                         const ForwardOutputs&, cudaStream_t, CudaScratch&);
template void cuda_render_forward<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                          const ForwardOutputs&, cudaStream_t, CudaScratch&);

}  // namespace pulsar
