// One pixel's blend in the CUDA forward (render_forward.cu): its accumulators, its
// termination test and the record of its traversal, and the visit of one entry. A
// thread holds one pixel's (render_forward_kernel) or two (render_forward_two_kernel).
#pragma once

#include <cstdint>
#include <limits>

#include "cuda_scratch.h"
#include "pulsar/blend.h"
#include "pulsar/forward_info.h"
#include "pulsar/pixel_ray.h"

namespace pulsar {

constexpr unsigned kNoHit = 0xffffffffu;  // no shared-memory address

// Called first in a rarely taken block, keeps it a branch: ptxas predicates a short block,
// whose instructions every lane then issues, taken or not; it keeps a sleep (of 0 ns here)
// behind a branch.
__device__ inline void keep_as_branch() { __nanosleep(0); }

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

// The hit cap of a call as the kernels compare it: max_n_hits, or int max for none. A
// pixel's hits never exceed its tile's list length (an int), so 32 bits hold it.
__host__ __device__ inline int hit_cap_of(const RenderOptions& options) {
  return options.max_n_hits < 0 || options.max_n_hits > std::numeric_limits<int>::max()
             ? std::numeric_limits<int>::max()
             : int(options.max_n_hits);
}

// What every pixel's blend reads: the camera, the blend's constants, the features in
// global memory (the generic channel path), the background and the hit cap.
template <typename T>
struct VisitContext {
  CameraFrame<T> cam;
  BlendParams<T> bp;
  T stop_key_offset;    // TerminationTest::key_offset
  const T* features;    // [N, C] of the block's camera
  const T* background;  // [C]
  int channels;
  int cap;  // hits per pixel at most (hit_cap_of)
};

// The blend of one pixel over its tile's list: its accumulators, its termination test and
// the record of its traversal. A thread holds one (render_forward_kernel) or two
// (render_forward_two_kernel). HIT_CAP false: the call has no hit cap (the launch checks
// it), and a hit skips the cap's test (2 instructions).
template <typename T, int C_STATIC, bool WITH_INFO, bool MOMENTS, bool HIT_CAP = true>
struct PixelBlend {
  PixelRay<T> ray;
  std::int64_t pix;  // index of the pixel in the batch of images
  T* img;            // its output features (the generic channel path accumulates there)
  FeatureAccum<T, C_STATIC> accum;
  OnlineSoftmax<T> blend;
  TerminationTest<T> termination;
  T max_closest;
  DepthStats<T> stats;  // the depth outputs' sums (MOMENTS)
  int hits;
  int end;             // one past the last processed entry, relative to the tile's first
  unsigned last_hit;   // this batch's last hit (shared-memory address), kNoHit: none yet
  // Forward info: the closest hits (TrackedHits over these, made where used: a pointer
  // into the struct kept in it would put every pixel's state in local memory).
  T track_depth[WITH_INFO ? kMaxTrack : 1];
  std::int32_t track_id[WITH_INFO ? kMaxTrack : 1];
  int n_track, tracked;  // K, and how many are held

  // Returns whether the pixel lies in the image (the kernels keep that, and whether the
  // pixel is done, as their own flags: kept in the struct, they would be packed into
  // bytes and moved around every visit).
  __device__ bool start(const VisitContext<T>& ctx, const RendererConfig& config, int b, int x, int y, T* image) {
    ray = pixel_ray(ctx.cam, x, y);
    pix = std::int64_t(b) * config.width * config.height + std::int64_t(y) * config.width + x;
    img = image + pix * ctx.channels;
    const bool inside = x < config.width && y < config.height;
    if (inside) accum.init(ctx.background, img, ctx.channels);
    blend = OnlineSoftmax<T>::start(ctx.bp);
    termination = TerminationTest<T>::start();
    max_closest = T(-1);
    stats = DepthStats<T>{};
    hits = 0;
    end = 0;
    last_hit = kNoHit;
    n_track = config.n_track;
    tracked = 0;
    return inside;
  }

  // Whether the pixel stops before the first entry of a batch, whose closest depth is zc
  // and stop key key (TerminationTest::key).
  __device__ bool stops_before(T zc, T key, const VisitContext<T>& ctx) {
    return hits >= ctx.cap || termination.stops(zc, key, ctx.bp, blend, hits);
  }

  // Visits an entry whose box covers the pixel: the stop test, then the pair. g: its
  // sphere record, slope its blend_exponent_slope, key its TerminationTest::key, col its
  // features, id its sphere index, address its shared-memory address (the batch's
  // traversal end follows from the last hit's). Returns whether the pixel goes on (false:
  // it stops here; the caller records that).
  __device__ bool visit(const GpuSphere<T>& g, T slope, T key, const T* col, std::int32_t id, unsigned address,
                        const VisitContext<T>& ctx) {
    // The cap moves the cheap bound (below), so that one test per entry covers both.
    if (termination.beyond_bound(key) &&
        ((HIT_CAP && hits >= ctx.cap) || termination.stops_beyond_bound(g.closest_depth, ctx.bp, blend, hits)))
      return false;
    const PairHit<T> h = evaluate_pair(ctx.cam, make_vec3(g.cx, g.cy, g.cz), g.dist, g.radius, g.terms, ray);
    if (!h.hit) return true;
    const T s = blend_exponent(ctx.bp, slope, h.depth);
    // A new largest exponent shrinks the sums accumulated so far, in a branch of its own
    // (keep_as_branch): most hits lie below the maximum, and folding the rescale into
    // every hit (its factor 1 there) would put two exponentials and a product per value on
    // the common path; predicated, the block's instructions would issue for every hit.
    if (blend.raises(s)) {
      keep_as_branch();
      const T rescale = blend.raise(s);
      accum.scale(rescale, img, ctx.channels);
      if (MOMENTS) stats.scale(rescale);
    }
    const T w = blend.add_at_most_max(s, h.kappa * g.opacity);
    accum.add(w, col, img, ctx.channels);
    if (MOMENTS) stats.add(w, normalized_depth(ctx.bp, h.depth));
    ++hits;
    last_hit = address;
    if (ctx.bp.early_stop) termination.after_hit(blend);
    if (HIT_CAP && hits >= ctx.cap) termination.cap_reached();
    if (WITH_INFO) {
      max_closest = g.closest_depth;
      TrackedHits<T> closest{track_depth, track_id, n_track, tracked};
      closest.insert(h.depth, id);
      tracked = closest.size;
    }
    return true;
  }

  // The traversal end after a batch whose entries start at list position first (relative
  // to the tile's) and at shared address batch_address; resets the batch's last hit.
  template <typename Entry>
  __device__ void end_batch(int first, unsigned batch_address) {
    if (last_hit != kNoHit) end = first + 1 + int((last_hit - batch_address) / sizeof(Entry));
    last_hit = kNoHit;
  }

  // Writes the pixel's outputs (one inside the image).
  __device__ void finish(const ForwardOutputs& out, const RendererConfig& config, int channels) {
    accum.finish(T(1) / blend.D, img, channels);
    T* state = static_cast<T*>(out.blend_state) + 2 * pix;
    state[0] = blend.m;
    state[1] = blend.D;
    out.hit_count[pix] = std::int32_t(hits);
    out.traversal_end[pix] = end;
    T* moments = static_cast<T*>(out.depth_moments);
    if (MOMENTS && moments) stats.store(moments + kDepthStats * pix, blend.D);
    if (WITH_INFO)
      write_forward_info(static_cast<T*>(out.forward_info) + pix * (3 + 2 * config.n_track), blend.m, blend.D,
                         max_closest, TrackedHits<T>{track_depth, track_id, n_track, tracked});
  }
};

template <typename T>
__device__ VisitContext<T> visit_context(const RendererConfig& config, const SceneArgs& scene,
                                         const RenderOptions& options, int b, bool ortho) {
  VisitContext<T> ctx;
  ctx.cam = camera_of<T>(scene, b, ortho);
  ctx.channels = config.n_channels;
  const SceneView<T> sv = SceneView<T>::of(scene, b, ctx.channels);
  ctx.features = sv.features;
  ctx.background = sv.background;
  ctx.bp = blend_params_of(ctx.cam, config, options);
  ctx.stop_key_offset = TerminationTest<T>::key_offset(ctx.bp);
  ctx.cap = hit_cap_of(options);
  return ctx;
}

}  // namespace pulsar
