// Stage 2 on CUDA: one block of 16x16 threads per (camera, tile), one thread per pixel.
// The block walks its tile's depth-ordered list in batches that it loads cooperatively
// into shared memory; each thread stops at its own early-termination point, and the
// block stops when every thread has.
#include <limits>

#include "cuda_scratch.h"
#include "pulsar/blend.h"
#include "pulsar/forward_info.h"
#include "pulsar/pixel_ray.h"

namespace pulsar {

namespace {

constexpr int kThreads = kTileSize * kTileSize;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr unsigned kNoHit = 0xffffffffu;  // no shared-memory address

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

// Warp-wide maximum and bitwise or: the reductions of sm_80 and later, shuffle trees on
// sm_75.
__device__ inline unsigned warp_max(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
#endif
}
__device__ inline unsigned warp_or(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_or_sync(kFullMask, v);
#else
  for (int offset = 16; offset > 0; offset /= 2) v |= __shfl_xor_sync(kFullMask, v, offset);
  return v;
#endif
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
// features when the channel count is static (else read from global memory per hit) and
// its index, in one record so that a visit derives one shared address.
template <typename T, int C_STATIC>
struct BatchFields {
  GpuSphere<T> sphere;
  T features[C_STATIC > 0 ? C_STATIC : 1];
  std::int32_t id;
};

// A record padded to an odd number of 16-byte words (float, 3 channels: 80 bytes): lanes
// that walk their own entries (lane by lane) read them in 16-byte loads without bank
// conflicts, which an even stride (64 bytes) has between every other lane.
template <typename F, bool PAD>
struct OddWords {
  F fields;
  unsigned char pad[16];
};
template <typename F>
struct OddWords<F, false> {
  F fields;
};
template <typename T, int C_STATIC>
using BatchEntry = OddWords<BatchFields<T, C_STATIC>, (sizeof(BatchFields<T, C_STATIC>) / 16) % 2 == 0>;

// Feature accumulator: registers when the channel count is known at compile time
// (C_STATIC > 0), else the pixel's own slot of the output image. scale: the online
// softmax raised its maximum (rare); add: one hit's weighted features.
template <typename T, int C_STATIC>
struct FeatureAccum {
  T v[C_STATIC];
  __device__ void init(const T* bg, T*, int) {
#pragma unroll
    for (int c = 0; c < C_STATIC; ++c) v[c] = bg[c];
  }
  __device__ void scale(T rescale, T*, int) {
#pragma unroll
    for (int c = 0; c < C_STATIC; ++c) v[c] *= rescale;
  }
  __device__ void add(T w, const T* col, T*, int) {
#pragma unroll
    for (int c = 0; c < C_STATIC; ++c) v[c] += w * col[c];
  }
  __device__ void finish(T inv_d, T* out, int) {
#pragma unroll
    for (int c = 0; c < C_STATIC; ++c) out[c] = v[c] * inv_d;
  }
};

template <typename T>
struct FeatureAccum<T, 0> {
  __device__ void init(const T* bg, T* out, int channels) {
    for (int c = 0; c < channels; ++c) out[c] = bg[c];
  }
  __device__ void scale(T rescale, T* out, int channels) {
    for (int c = 0; c < channels; ++c) out[c] *= rescale;
  }
  __device__ void add(T w, const T* col, T* out, int channels) {
    for (int c = 0; c < channels; ++c) out[c] += w * col[c];
  }
  __device__ void finish(T inv_d, T* out, int channels) {
    for (int c = 0; c < channels; ++c) out[c] *= inv_d;
  }
};

// ORTHO: the camera model, a template parameter so that each kernel carries one.
// MOMENTS: the depth moments are accumulated and stored (asked for by render(); 5
// instructions per hit otherwise spent).
template <typename T, int C_STATIC, bool ORTHO, bool WITH_INFO, bool MOMENTS>
__global__ void __launch_bounds__(kThreads)
render_forward_kernel(RendererConfig config, SceneArgs scene, RenderOptions options, ForwardOutputs out,
                      const GpuSphere<T>* spheres, const std::int32_t* entry_sphere, const int2* tile_ranges) {
  __shared__ BatchEntry<T, C_STATIC> batch[kThreads];
  // coverage[w][e]: the lanes of warp w whose pixel entry e's box covers (written by the
  // entry's loader); then, once warp w has transposed its row chunk by chunk,
  // coverage[w][32 * chunk + lane]: the entries of the chunk (bit j: entry 32 * chunk + j)
  // whose box covers the lane's pixel.
  __shared__ unsigned coverage[kThreads / 32][kThreads];
  const int tiles_x = (config.width + kTileSize - 1) / kTileSize;
  const int tiles_y = (config.height + kTileSize - 1) / kTileSize;
  const std::int64_t item = blockIdx.x;
  const int b = int(item / (std::int64_t(tiles_x) * tiles_y));
  const int tile = int(item % (std::int64_t(tiles_x) * tiles_y));
  const int2 local = thread_pixel(int(threadIdx.x));
  const int tile_x0 = (tile % tiles_x) * kTileSize, tile_y0 = (tile / tiles_x) * kTileSize;
  const int x = tile_x0 + local.x, y = tile_y0 + local.y;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const bool inside = x < config.width && y < config.height;
  const int channels = config.n_channels;
  const CameraFrame<T> cam = camera_of<T>(scene, b, ORTHO);
  const SceneView<T> sv = SceneView<T>::of(scene, b, channels);
  const BlendParams<T> bp = blend_params_of(cam, config, options);
  const PixelRay<T> ray = pixel_ray(cam, x, y);
  const std::int64_t pix = std::int64_t(b) * config.width * config.height + std::int64_t(y) * config.width + x;
  T* img = static_cast<T*>(out.image) + pix * channels;
  T* moments = static_cast<T*>(out.depth_moments);
  // A pixel's hits never exceed its tile's list length (an int), so a cap is compared in 32 bits.
  const int cap = options.max_n_hits < 0 || options.max_n_hits > std::numeric_limits<int>::max()
                      ? std::numeric_limits<int>::max()
                      : int(options.max_n_hits);

  FeatureAccum<T, C_STATIC> accum;
  if (inside) accum.init(sv.background, img, channels);
  OnlineSoftmax<T> blend = OnlineSoftmax<T>::start(bp);
  TerminationTest<T> termination = TerminationTest<T>::start(bp);
  T max_closest = T(-1);
  T mom[3] = {0, 0, 0};
  int hits = 0;
  int end = 0;  // one past the last processed entry, relative to the tile's first
  T track_depth[WITH_INFO ? kMaxTrack : 1];
  std::int32_t track_id[WITH_INFO ? kMaxTrack : 1];
  TrackedHits<T> tracked{track_depth, track_id, config.n_track, 0};
  bool done = !inside;

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
  //   is faster (Nsight Compute, W1's forward: 2.41 ms in lockstep, 2.77 lane by lane;
  //   W4: 0.98 and 0.67).
  // The warp walks lane by lane when that takes at most 3/4 of lockstep's rounds.
  const int2 range = tile_ranges[item];
  for (int start = range.x; start < range.y; start += kThreads) {
    if (__syncthreads_and(done)) break;
    const int p = start + int(threadIdx.x);
    int lx0 = 0, lx1 = -1, ly0 = 0, ly1 = -1;  // the entry's box in the tile (empty past the list)
    if (p < range.y) {
      const std::int32_t id = entry_sphere[p];
      const GpuSphere<T> g = load_sphere(spheres + std::int64_t(b) * scene.n_spheres + id);
      BatchFields<T, C_STATIC>& e = batch[threadIdx.x].fields;
      e.sphere = g;
      e.id = id;
      lx0 = max(int(g.x0) - tile_x0, 0), lx1 = min(int(g.x1) - tile_x0, kTileSize - 1);
      ly0 = max(int(g.y0) - tile_y0, 0), ly1 = min(int(g.y1) - tile_y0, kTileSize - 1);
      for (int c = 0; c < C_STATIC; ++c) e.features[c] = sv.features[std::int64_t(id) * C_STATIC + c];
    }
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) coverage[w][threadIdx.x] = lanes_covered(lx0, lx1, ly0, ly1, w);
    __syncthreads();
    const int batch_size = min(kThreads, range.y - start);
    const int chunks = (batch_size + 31) / 32;
    if (!done && (hits >= cap || termination.stops(batch[0].fields.sphere.closest_depth, bp, blend))) done = true;
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

    // The lane's last hit in this batch (kNoHit: none yet): the traversal end follows from
    // it once per batch (from an index per hit, the lockstep walk rebuilt the index from
    // the bit it had consumed: 5 instructions, then 2).
    unsigned last_hit = kNoHit;  // shared-memory address (__cvta_generic_to_shared)
    // Visits a batch entry that covers this lane's pixel: the stop test, then the pair.
    // Returns whether the lane goes on (false: it is done; the caller records that).
    auto visit = [&](const BatchEntry<T, C_STATIC>& entry) -> bool {
      const BatchFields<T, C_STATIC>& e = entry.fields;
      const GpuSphere<T>& g = e.sphere;
      // The cap lowers the cheap bound (below), so that one test per entry covers both.
      if (termination.beyond_bound(g.closest_depth) &&
          (hits >= cap || termination.stops_beyond_bound(g.closest_depth, bp, blend)))
        return false;
      const PairHit<T> h = evaluate_pair(cam, make_vec3(g.cx, g.cy, g.cz), g.dist, g.radius, g.terms, ray);
      if (!h.hit) return true;
      const T n_depth = normalized_depth(bp, h.depth);
      const T s = blend_exponent(bp, g.opacity, n_depth);
      // A new largest exponent shrinks what was accumulated, in a branch of its own: most
      // hits lie below the maximum, and with the rescale folded into every hit (its factor
      // 1 there) the common path carried two exponentials and a product per value.
      if (blend.raises(s)) {
        const T rescale = blend.raise(s);
        accum.scale(rescale, img, channels);
        if (MOMENTS)
          for (int k = 0; k < 3; ++k) mom[k] *= rescale;
      }
      const T w = blend.add_at_most_max(s, h.kappa * g.opacity);
      const T* col = C_STATIC > 0 ? e.features : sv.features + std::int64_t(e.id) * channels;
      accum.add(w, col, img, channels);
      if (MOMENTS) {
        mom[0] += w;
        mom[1] += w * n_depth;
        mom[2] += w * n_depth * n_depth;
      }
      ++hits;
      last_hit = unsigned(__cvta_generic_to_shared(&entry));
      if (bp.early_stop) termination.after_hit(blend);
      if (hits >= cap) termination.low = -std::numeric_limits<T>::infinity();
      if (WITH_INFO) {
        max_closest = g.closest_depth;
        tracked.insert(h.depth, e.id);
      }
      return true;
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
      // register (from batch + j it rebuilt the shared window's address per visit, 4
      // instructions where this takes one). The chunk's sets are bit-reversed (entry j at
      // bit 31 - j), so that the next entry in depth order is the highest set bit, one
      // instruction where the lowest took two; `live` is the lane's set (none once done).
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
        // stop, the compiler set and restored a flag byte around every visit).
        if (any != 0u) done = true;
      }
    }
    if (last_hit != kNoHit)
      end = start - range.x + 1 + int((last_hit - unsigned(__cvta_generic_to_shared(batch))) / sizeof(batch[0]));
  }
  if (!inside) return;
  accum.finish(T(1) / blend.D, img, channels);
  T* state = static_cast<T*>(out.blend_state) + 2 * pix;
  state[0] = blend.m;
  state[1] = blend.D;
  out.hit_count[pix] = std::int32_t(hits);
  out.traversal_end[pix] = end;
  if (MOMENTS && moments)
    for (int k = 0; k < 3; ++k) moments[3 * pix + k] = mom[k] / blend.D;
  if (WITH_INFO)
    write_forward_info(static_cast<T*>(out.forward_info) + pix * (3 + 2 * config.n_track), blend.m,
                       blend.D, max_closest, tracked);
}

template <typename T, int C_STATIC, bool ORTHO>
void launch(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
            const ForwardOutputs& out, cudaStream_t stream, CudaScratch& s, unsigned blocks) {
  const auto* spheres = s.spheres.as<GpuSphere<T>>();
  const std::int32_t* entries = s.entry_sphere();
  const auto* ranges = s.tile_ranges.as<int2>();
  // render() (which asks for the depth moments) must give forward()'s image bit for bit:
  // the image's arithmetic is the same in both kernels (blend_exponent rounds 1 - n on its
  // own, where n's one use in the kernel without moments let the compiler fuse it). The
  // forward_info kernel (rare) accumulates the moments too.
  if (out.forward_info)
    render_forward_kernel<T, C_STATIC, ORTHO, true, true><<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges);
  else if (out.depth_moments)
    render_forward_kernel<T, C_STATIC, ORTHO, false, true><<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges);
  else
    render_forward_kernel<T, C_STATIC, ORTHO, false, false><<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges);
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
void cuda_render_forward(const RendererConfig& config, const SceneArgs& scene,
                         const RenderOptions& options, const ForwardOutputs& out, cudaStream_t stream,
                         CudaScratch& scratch) {
  const unsigned blocks = unsigned(Tiling::of(config.width, config.height).n_tiles() * scene.batch_size);
  switch (config.n_channels) {
    case 1: launch<T, 1>(config, scene, options, out, stream, scratch, blocks); break;
    case 3: launch<T, 3>(config, scene, options, out, stream, scratch, blocks); break;
    case 4: launch<T, 4>(config, scene, options, out, stream, scratch, blocks); break;
    default: launch<T, 0>(config, scene, options, out, stream, scratch, blocks); break;
  }
}

template void cuda_render_forward<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                         const ForwardOutputs&, cudaStream_t, CudaScratch&);
template void cuda_render_forward<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                          const ForwardOutputs&, cudaStream_t, CudaScratch&);

}  // namespace pulsar
