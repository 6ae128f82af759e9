// The end of a partial render on the GPU (backend.h): each pixel's image C and normaliser D
// become the share's state, A = C D and D_share (blend.h, partial_normalizer). One thread
// per pixel, enqueued on the call's stream after the forward.
#include "cuda_check.h"
#include "cuda_scratch.h"
#include "pulsar/blend.h"

namespace pulsar {

namespace {

template <typename T>
__global__ void partial_state_kernel(T* image, T* state, std::int64_t pixels, int channels, double beta,
                                     RenderOptions options) {
  const std::int64_t pix = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // As blend_params_of; on the device, where a call's values are.
  const T bg_exponent = T(beta / call_gamma(options));
  if (pix < pixels) to_partial_state(image + pix * channels, channels, state + 2 * pix, bg_exponent);
}

}  // namespace

template <typename T>
void cuda_partial_state(const RendererConfig& config, const RenderOptions& options, int batch_size,
                        const ForwardOutputs& out, cudaStream_t stream) {
  const std::int64_t pixels = std::int64_t(batch_size) * config.width * config.height;
  constexpr int kThreads = 256;
  partial_state_kernel<T><<<blocks_for(pixels, kThreads), kThreads, 0, stream>>>(
      static_cast<T*>(out.image), static_cast<T*>(out.blend_state), pixels, config.n_channels,
      config.background_normalized_depth, options);
  PULSAR_CUDA_CHECK(cudaGetLastError());
}

template void cuda_partial_state<float>(const RendererConfig&, const RenderOptions&, int, const ForwardOutputs&,
                                        cudaStream_t);
template void cuda_partial_state<double>(const RendererConfig&, const RenderOptions&, int, const ForwardOutputs&,
                                         cudaStream_t);

}  // namespace pulsar
