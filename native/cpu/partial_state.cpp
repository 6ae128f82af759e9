// The end of a partial render on the CPU (backend.h): each pixel's image C and normaliser D
// become the share's state, A = C D and D_share (blend.h, partial_normalizer).
#include "cpu_scratch.h"
#include "parallel_for.h"
#include "pulsar/blend.h"

namespace pulsar {

template <typename T>
void cpu_partial_state(const RendererConfig& config, const RenderOptions& options, int batch_size,
                       const ForwardOutputs& out, CpuScratch& scratch) {
  const int channels = config.n_channels;
  const T bg_exponent = T(config.background_normalized_depth / call_gamma(options));  // as blend_params_of
  auto* image = static_cast<T*>(out.image);
  auto* state = static_cast<T*>(out.blend_state);
  // One work item per image row.
  parallel_for(scratch.workers(), std::int64_t(batch_size) * config.height, [&](std::int64_t row, int) {
    for (std::int64_t pix = row * config.width; pix < (row + 1) * config.width; ++pix)
      to_partial_state(image + pix * channels, channels, state + 2 * pix, bg_exponent);
  });
}

template void cpu_partial_state<float>(const RendererConfig&, const RenderOptions&, int, const ForwardOutputs&,
                                       CpuScratch&);
template void cpu_partial_state<double>(const RendererConfig&, const RenderOptions&, int, const ForwardOutputs&,
                                        CpuScratch&);

}  // namespace pulsar
