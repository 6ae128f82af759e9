// Stage 2 on the CPU: per pixel, traverse its tile's depth-ordered list and blend
// (docs/model.md sections 4-7). One work item is one (camera, tile); every pixel is written
// by exactly one thread, so the result does not depend on scheduling.
#include <algorithm>
#include <limits>

#include "cpu_scratch.h"
#include "parallel_for.h"
#include "pulsar/blend.h"
#include "pulsar/forward_info.h"
#include "pulsar/pixel_ray.h"
#include "tile_pairs.h"

namespace pulsar {

namespace {

// Entries per batch of pairs: a small multiple of the pairs whose latencies overlap, so
// that few are evaluated past a pixel's termination.
constexpr int kPairBatch = 16;

}  // namespace

template <typename T>
void cpu_render_forward(const RendererConfig& config, const SceneArgs& scene, const RenderOptions& options,
                        const ForwardOutputs& out, CpuScratch& scratch) {
  const int channels = config.n_channels, k_track = config.n_track;
  const Tiling tiling = Tiling::of(config.width, config.height);
  const std::int64_t n_tiles = tiling.n_tiles();
  const std::int64_t pixels = std::int64_t(config.width) * config.height;
  const std::int64_t cap = options.max_n_hits < 0 ? std::numeric_limits<std::int64_t>::max() : options.max_n_hits;
  const auto* entries = scratch.entries.as<std::int32_t>();
  const auto worker_mem = WorkerRows<T>::reserve(scratch.pixel_scratch, std::size_t(channels + 2 * k_track),
                                                 scratch.threads, "pixel scratch");
  auto* image = static_cast<T*>(out.image);
  auto* state = static_cast<T*>(out.blend_state);
  auto* info = static_cast<T*>(out.forward_info);
  auto* moments = static_cast<T*>(out.depth_moments);
  const int info_len = 3 + 2 * k_track;
  const bool three = channels == 3;
  const std::int64_t longest = longest_tile_list(scratch, scene.batch_size * n_tiles);
  const auto tile_mem = WorkerRows<unsigned char>::reserve(
      scratch.tile_entries, TileEntryArrays<T>::bytes(std::size_t(longest), channels), scratch.threads, "tile entries");

  parallel_for(scratch.workers(), scene.batch_size * n_tiles, [&](std::int64_t item, int worker) {
    const TileWork<T> w = TileWork<T>::of(item, config, scene, options, scratch);
    const int b = w.b;
    const CameraFrame<T>& cam = w.cam;
    const SceneView<T>& sv = w.scene;
    const BlendParams<T>& bp = w.blend;
    const SphereRecord<T>* rec = w.records;
    const std::int64_t first = w.first, last = w.last;
    const T key_offset = TerminationTest<T>::key_offset(bp);
    T* accum = worker_mem.row(worker);
    T* track_depth = accum + channels;
    auto* track_id = reinterpret_cast<std::int32_t*>(track_depth + k_track);
    const TileEntryArrays<T> tile = TileEntryArrays<T>::in(tile_mem.row(worker), std::size_t(longest), channels);
    tile.gather(entries + first, last - first, rec, sv, channels, bp);
    tile.fill_keys(last - first, bp, key_offset);
    // A batch's pairs (below), and its entries to walk: position in the batch, whether it
    // hit, its pair.
    PairBatch<T, kPairBatch> pairs;
    int walk_at[kPairBatch];
    bool walk_hit[kPairBatch];
    T walk_kappa[kPairBatch], walk_depth[kPairBatch];
    for (int y = w.y_begin; y < w.y_end; ++y) {
      for (int x = w.x_begin; x < w.x_end; ++x) {
        const PixelRay<T> ray = pixel_ray(cam, x, y);
        OnlineSoftmax<T> blend = OnlineSoftmax<T>::start(bp);
        for (int ch = 0; ch < channels; ++ch) accum[ch] = sv.background[ch];
        // Three channels (the common case) accumulate in locals, which the compiler keeps
        // in registers: the same operations as the loop over accum.
        T acc0 = three ? sv.background[0] : T(0), acc1 = three ? sv.background[1] : T(0),
          acc2 = three ? sv.background[2] : T(0);
        TrackedHits<T> tracked{track_depth, track_id, k_track, 0};
        TerminationTest<T> termination = TerminationTest<T>::start();
        T max_closest = T(-1);
        DepthStats<T> stats;  // the depth outputs' sums (moments)
        std::int64_t hits = 0;
        std::int64_t end = 0;  // one past the last processed entry, relative to `first`
        // The entries go in batches, in two passes each: the pairs of the entries whose
        // box holds the pixel first, which depend on nothing of the blend, so that the
        // latencies of their square roots overlap; then the walk in list order over the
        // batch's hits, stopping at the first entry beyond the termination depth or the
        // hit cap (model.md section 6).
        //
        // The walk tests only the hits and each batch's first entry, not the entries
        // between: those change nothing of the pixel, and whether the walk stops at one
        // of them shows at the next tested entry. The list ascends in zc, each entry's key
        // descends with it (a positive slope times max_depth - zc, rounded monotonically),
        // and between two hits the blend state, the test's bound and the hit count stay
        // as they are, so if an entry stops the walk, every later one up to the next hit
        // does too. Where the slope is negative (a depth range that value checks would
        // reject), every entry is tested, as the test is then not monotonic. The outputs
        // are those of the walk that tests every entry; only pairs past the stopping point
        // within its batch are evaluated and dropped.
        const bool test_every_entry = bp.inv_gamma_range < T(0);
        auto stops_at = [&](std::int64_t e) {
          return hits >= cap ||
                 termination.stops(tile.closest_depth[e - first], tile.key[e - first], bp, blend, int(hits));
        };
        for (std::int64_t batch_first = first; batch_first < last; batch_first += kPairBatch) {
          if (stops_at(batch_first)) break;
          const int n_batch = int(std::min<std::int64_t>(kPairBatch, last - batch_first));
          pairs.evaluate(cam, ray, x, y, tile, batch_first - first, n_batch);
          int n_walk = 0;  // the batch's entries to walk: its hits (or every entry), in order
          for (int k = 0; k < n_batch; ++k) {
            walk_at[n_walk] = k;
            walk_hit[n_walk] = pairs.hits(k);
            walk_kappa[n_walk] = pairs.kappa[k];
            walk_depth[n_walk] = pairs.depth[k];
            n_walk += (pairs.hits(k) || test_every_entry) ? 1 : 0;
          }
          bool stopped = false;
          for (int j = 0; j < n_walk; ++j) {
            const std::int64_t e = batch_first + walk_at[j];
            if (stops_at(e)) {
              stopped = true;
              break;
            }
            if (!walk_hit[j]) continue;
            const std::int64_t k = e - first;  // the entry in the tile's arrays
            const T depth = walk_depth[j];
            const T s = blend_exponent(bp, tile.slope[k], depth);
            T rescale;
            const T w = blend.add(s, walk_kappa[j] * tile.opacity[k], rescale);
            const T* col = tile.features + k * channels;
            if (three) {
              acc0 = acc0 * rescale + w * col[0];
              acc1 = acc1 * rescale + w * col[1];
              acc2 = acc2 * rescale + w * col[2];
            } else {
              for (int ch = 0; ch < channels; ++ch) accum[ch] = accum[ch] * rescale + w * col[ch];
            }
            if (moments) {
              stats.scale(rescale);
              stats.add(w, normalized_depth(bp, depth));
            }
            ++hits;
            end = k + 1;
            if (bp.early_stop) termination.after_hit(blend);
            max_closest = tile.closest_depth[k];
            if (info) tracked.insert(depth, entries[e]);
          }
          if (stopped) break;
        }
        const std::int64_t pix = std::int64_t(b) * pixels + std::int64_t(y) * config.width + x;
        T* img = image + pix * channels;
        if (three) {
          img[0] = acc0 / blend.D;
          img[1] = acc1 / blend.D;
          img[2] = acc2 / blend.D;
        } else {
          for (int ch = 0; ch < channels; ++ch) img[ch] = accum[ch] / blend.D;
        }
        state[2 * pix] = blend.m;
        state[2 * pix + 1] = blend.D;
        out.hit_count[pix] = std::int32_t(hits);
        out.traversal_end[pix] = std::int32_t(end);
        if (moments) stats.store(moments + kDepthStats * pix, blend.D);
        if (info) write_forward_info(info + pix * info_len, blend.m, blend.D, max_closest, tracked);
      }
    }
  });
}

template void cpu_render_forward<float>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                        const ForwardOutputs&, CpuScratch&);
template void cpu_render_forward<double>(const RendererConfig&, const SceneArgs&, const RenderOptions&,
                                         const ForwardOutputs&, CpuScratch&);

}  // namespace pulsar
