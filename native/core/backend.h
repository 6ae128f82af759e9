// The seam between the stage sequence (renderer.cpp, written once) and the devices.
// A backend is chosen once, when the Renderer is constructed for a device, and owns
// that device's scratch. Stages, in order:
//   1. begin_binning, finish_binning: per-sphere culling, closest depth and screen
//      bounds; binning of the visible spheres into per-tile lists ordered by (closest
//      depth, index). In two calls so that the caller's host work (allocating the
//      outputs) overlaps the device's: begin_binning enqueues all it can without waiting
//      (CUDA: up to the read-back of the instance count), finish_binning completes the
//      lists, sized by that count (for which it waits) or by room learnt from earlier
//      counts (then settle_binning, before the stages that read the lists, says whether
//      the count outgrew it). The CPU bins whole in begin_binning.
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
  if (dtype == DType::Float64)
    fn(double{});
  else
    fn(float{});
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void begin_binning(const SceneArgs& scene, const RenderOptions& options) = 0;
  // Completes the binning begin_binning started, for the same scene and options.
  virtual void finish_binning(const SceneArgs& scene, const RenderOptions& options) = 0;
  // After finish_binning, before the stages that read the lists: true when they lacked
  // room for the binning's instances, so that the caller bins again (that binning is
  // sized by the count). May wait for the device.
  virtual bool settle_binning(const RenderOptions& options) {
    (void)options;
    return false;
  }
  virtual void render_forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) = 0;
  // After render_forward of a partial render (with zero background features): image
  // C -> C D, blend_state D -> partial_normalizer (blend.h).
  virtual void partial_state(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) = 0;
  virtual void render_backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                               const GradientOutputs& grads) = 0;
  virtual void reduce_gradients(const SceneArgs& scene, const RenderOptions& options, const GradientOutputs& grads) = 0;
  // Room for `bytes` of packed cameras [B, 15] that the Renderer converts from camera
  // vectors itself (Renderer::with_packed_cameras), in the backend's memory; kept across
  // calls and rewritten by the next conversion.
  virtual void* packed_cameras(std::size_t bytes) = 0;
  // `bytes` of zeros in the backend's memory (ready in stream order): a partial render's
  // background features.
  virtual const void* zero_features(std::size_t bytes, const RenderOptions& options) = 0;
  virtual std::size_t scratch_bytes() const = 0;
  virtual std::int64_t binned_instances() const = 0;
  // The instance capacity that sizes binnings without a host synchronisation (CUDA;
  // docs/design.md, "Capture"): set > 0 fixes it, 0 lets it be learnt. The CPU backend
  // never synchronises with anything and keeps none.
  virtual void set_instance_capacity(std::int64_t capacity) { (void)capacity; }
  virtual std::int64_t instance_capacity() const { return 0; }
  // The largest instance count a binning could not store in its capacity since the last
  // read, 0 for none; waits for `stream` (a cudaStream_t) and resets the record.
  virtual std::int64_t take_overflow(void* stream) {
    (void)stream;
    return 0;
  }
};

std::unique_ptr<Backend> make_cpu_backend(const RendererConfig& config);
#ifdef PULSAR_WITH_CUDA
std::unique_ptr<Backend> make_cuda_backend(const RendererConfig& config);
#endif

}  // namespace pulsar
