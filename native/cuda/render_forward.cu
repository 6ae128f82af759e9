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

// Pixel of a thread within its tile: each warp covers an 8x4 block (not a 16x2 strip), so
// a small sphere touches fewer warps and more of each touched warp's lanes.
__device__ inline int2 thread_pixel(int thread) {
  const int warp = thread / 32, lane = thread % 32;
  return make_int2((warp % 2) * 8 + lane % 8, (warp / 2) * 4 + lane / 8);
}

// The warps (bit w: warp w's 8x4 block, as thread_pixel lays them out) whose pixels the
// sphere's bounds touch within the tile at (tile_x0, tile_y0).
template <typename T>
__device__ unsigned warps_touched(const GpuSphere<T>& g, int tile_x0, int tile_y0) {
  const int lx0 = max(int(g.x0) - tile_x0, 0), lx1 = min(int(g.x1) - tile_x0, kTileSize - 1);
  const int ly0 = max(int(g.y0) - tile_y0, 0), ly1 = min(int(g.y1) - tile_y0, kTileSize - 1);
  if (lx0 > lx1 || ly0 > ly1) return 0u;
  const unsigned halves = (lx0 < 8 ? 1u : 0u) | (lx1 >= 8 ? 2u : 0u);  // left, right 8 columns
  unsigned mask = 0;
  for (int row = ly0 / 4; row <= ly1 / 4; ++row) mask |= halves << (2 * row);
  return mask;
}

// Feature accumulator: registers when the channel count is known at compile time
// (C_STATIC > 0), else the pixel's own slot of the output image.
template <typename T, int C_STATIC>
struct FeatureAccum {
  T v[C_STATIC];
  __device__ void init(const T* bg, T*, int) {
#pragma unroll
    for (int c = 0; c < C_STATIC; ++c) v[c] = bg[c];
  }
  __device__ void add(T rescale, T w, const T* col, T*, int) {
#pragma unroll
    for (int c = 0; c < C_STATIC; ++c) v[c] = v[c] * rescale + w * col[c];
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
  __device__ void add(T rescale, T w, const T* col, T* out, int channels) {
    for (int c = 0; c < channels; ++c) out[c] = out[c] * rescale + w * col[c];
  }
  __device__ void finish(T inv_d, T* out, int channels) {
    for (int c = 0; c < channels; ++c) out[c] *= inv_d;
  }
};

// ORTHO: the camera model, a template parameter so that each kernel carries one.
template <typename T, int C_STATIC, bool ORTHO, bool WITH_INFO>
__global__ void __launch_bounds__(kThreads)
render_forward_kernel(RendererConfig config, SceneArgs scene, RenderOptions options, ForwardOutputs out,
                      const GpuSphere<T>* spheres, const std::int32_t* entry_sphere, const int2* tile_ranges) {
  __shared__ GpuSphere<T> batch[kThreads];
  __shared__ std::int32_t batch_id[kThreads];
  // The batch's features when the channel count is static (else read from global per hit).
  __shared__ T batch_features[C_STATIC > 0 ? kThreads * C_STATIC : 1];
  __shared__ unsigned char batch_warps[kThreads];  // warps_touched of each entry
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
  const std::int64_t cap = options.max_n_hits < 0 ? std::numeric_limits<std::int64_t>::max() : options.max_n_hits;

  FeatureAccum<T, C_STATIC> accum;
  if (inside) accum.init(sv.background, img, channels);
  OnlineSoftmax<T> blend = OnlineSoftmax<T>::start(bp);
  TerminationTest<T> termination = TerminationTest<T>::start();
  T max_closest = T(-1);
  T mom[3] = {0, 0, 0};
  std::int64_t hits = 0;
  int end = 0;  // one past the last processed entry, relative to the tile's first
  T track_depth[WITH_INFO ? kMaxTrack : 1];
  std::int32_t track_id[WITH_INFO ? kMaxTrack : 1];
  TrackedHits<T> tracked{track_depth, track_id, config.n_track, 0};
  bool done = !inside;

  // Each warp visits only the entries whose bounds touch its pixels. Skipping the others
  // changes nothing: an entry a pixel's bounds test rejects adds no hit, and the stop
  // test (zc against the termination depth, which only hits move) that it would have
  // made is made at the next entry the warp visits, or at the next batch's first entry,
  // with a zc at least as large.
  const int2 range = tile_ranges[item];
  for (int start = range.x; start < range.y; start += kThreads) {
    if (__syncthreads_and(done)) break;
    const int p = start + int(threadIdx.x);
    if (p < range.y) {
      const std::int32_t id = entry_sphere[p];
      const GpuSphere<T> g = spheres[std::int64_t(b) * scene.n_spheres + id];
      batch_id[threadIdx.x] = id;
      batch[threadIdx.x] = g;
      batch_warps[threadIdx.x] = static_cast<unsigned char>(warps_touched(g, tile_x0, tile_y0));
      for (int c = 0; c < C_STATIC; ++c)
        batch_features[threadIdx.x * C_STATIC + c] = sv.features[std::int64_t(id) * C_STATIC + c];
    }
    __syncthreads();
    const int batch_size = min(kThreads, range.y - start);
    if (!done && (hits >= cap || termination.stops(batch[0].closest_depth, bp, blend))) done = true;
    for (int j0 = 0; j0 < batch_size; j0 += 32) {
      if (__all_sync(kFullMask, done)) break;
      unsigned touching = __ballot_sync(kFullMask, j0 + lane < batch_size && ((batch_warps[j0 + lane] >> warp) & 1u));
      for (; touching != 0u; touching &= touching - 1u) {
        const int j = j0 + __ffs(int(touching)) - 1;
        if (done) continue;
        const GpuSphere<T>& g = batch[j];
        if (hits >= cap || termination.stops(g.closest_depth, bp, blend)) {
          done = true;
          continue;
        }
        if (x < g.x0 || x > g.x1 || y < g.y0 || y > g.y1) continue;
        const PairHit<T> h = evaluate_pair(cam, make_vec3(g.cx, g.cy, g.cz), g.dist, g.radius, g.terms, ray);
        if (!h.hit) continue;
        const T n_depth = normalized_depth(bp, h.depth);
        const T s = blend_exponent(bp, g.opacity, n_depth);
        T rescale;
        const T w = blend.add(s, h.kappa * g.opacity, rescale);
        const T* col = C_STATIC > 0 ? batch_features + j * C_STATIC : sv.features + std::int64_t(batch_id[j]) * channels;
        accum.add(rescale, w, col, img, channels);
        if (moments) {
          mom[0] = mom[0] * rescale + w;
          mom[1] = mom[1] * rescale + w * n_depth;
          mom[2] = mom[2] * rescale + w * n_depth * n_depth;
        }
        ++hits;
        end = start + j - range.x + 1;
        if (bp.early_stop) termination.after_hit(bp, blend);
        max_closest = g.closest_depth;
        if (WITH_INFO) tracked.insert(h.depth, batch_id[j]);
      }
    }
  }
  if (!inside) return;
  accum.finish(T(1) / blend.D, img, channels);
  T* state = static_cast<T*>(out.blend_state) + 2 * pix;
  state[0] = blend.m;
  state[1] = blend.D;
  out.hit_count[pix] = std::int32_t(hits);
  out.traversal_end[pix] = end;
  if (moments)
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
  if (out.forward_info)
    render_forward_kernel<T, C_STATIC, ORTHO, true><<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges);
  else
    render_forward_kernel<T, C_STATIC, ORTHO, false><<<blocks, kThreads, 0, stream>>>(config, scene, options, out, spheres, entries, ranges);
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
