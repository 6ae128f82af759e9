// The seam between the stage sequence (renderer.cpp, written once) and the devices.
// A backend is chosen once, when the Renderer is constructed for a device. Stages, in
// order:
//   1. bin: per-sphere culling, closest depth and screen bounds; binning of the visible
//      spheres into per-tile lists ordered by (closest depth, index), into the call's
//      binning memory (CUDA) or the backend's own (CPU, named by a token in the binning
//      memory). CUDA enqueues it whole: its instance count stays on the device.
//   2. render_forward: per-pixel traversal of its tile's list and blending.
//   3. render_backward: per-pixel re-traversal of the processed hits; gradient partials
//      per (tile, sphere) instance and per tile for the camera.
//   4. reduce_gradients: partials -> caller's gradient arrays.
// A partial render (RenderOptions::partial) blends with zero_features as its background
// and ends with partial_state, which turns the outputs of stage 2 into the share's state.
#pragma once

#include <cstddef>
#include <memory>

#include "pulsar/renderer.h"

namespace pulsar {

// Calls fn(float{}) or fn(double{}) for the call's dtype: the stages are templates.
template <typename Fn>
void dispatch_dtype(DType dtype, Fn&& fn) {
  if (dtype == DType::Float64) fn(double{}); else fn(float{});
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual MemoryNeeds memory_needs(DType dtype, int batch_size, std::int64_t n_spheres,
                                   std::int64_t capacity) const = 0;
  // Stage 1 into `memory`. count_only: only as far as the instance count. report: the
  // count is to be read by take_report (CUDA: the device writes it where the host reads).
  virtual void bin(const SceneArgs& scene, const RenderOptions& options, const CallMemory& memory, bool count_only,
                   bool report) = 0;
  // The report of the last bin that asked for one (CUDA: waits for that binning, not for
  // the work enqueued after it).
  virtual BinningReport take_report(const RenderOptions& options) = 0;
  // Whether `memory`'s binning is usable by a backward (the CPU's token names the binning
  // it holds; CUDA's binning is the memory itself).
  virtual bool holds_binning(const CallMemory& memory) const = 0;
  virtual void render_forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs,
                              const CallMemory& memory) = 0;
  // After render_forward of a partial render (with zero background features): image
  // C -> C D, blend_state D -> partial_normalizer (blend.h).
  virtual void partial_state(const SceneArgs& scene, const RenderOptions& options,
                             const ForwardOutputs& outputs) = 0;
  virtual void render_backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                               const GradientOutputs& grads, const CallMemory& memory) = 0;
  virtual void reduce_gradients(const SceneArgs& scene, const RenderOptions& options, const GradientOutputs& grads,
                                const CallMemory& memory) = 0;
  // Room for `bytes` of packed cameras (and, in a backward, their gradient) that the
  // Renderer converts from camera vectors itself: the start of the call's workspace
  // (CUDA), or the backend's own memory.
  virtual void* packed_cameras(const CallMemory& memory, std::size_t bytes) = 0;
  // `bytes` of zeros in the device's memory (ready in stream order): a partial render's
  // background features.
  virtual const void* zero_features(const SceneArgs& scene, const CallMemory& memory, std::size_t bytes,
                                    const RenderOptions& options) = 0;
  virtual RendererStatus take_status(void* stream, bool wait) = 0;
  virtual std::size_t scratch_bytes() const = 0;
  // Instances of the last binning whose count the host learnt.
  virtual std::int64_t binned_instances() const = 0;
};

std::unique_ptr<Backend> make_cpu_backend(const RendererConfig& config);
#ifdef PULSAR_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(const RendererConfig& config);
// The CUDA binning's bytes (binning_bytes, renderer.h).
std::size_t cuda_binning_bytes(int width, int height, DType dtype, int batch_size, std::int64_t n_spheres);
#endif

// The CPU binning's bytes: a token naming the binning the CPU backend holds.
constexpr std::size_t kCpuBinningTokenBytes = 16;

}  // namespace pulsar
