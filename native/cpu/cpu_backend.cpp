// The CPU backend: owns the host scratch and runs the CPU stages with every core. Each
// stage takes the call's interrupt check (RenderOptions::interrupt_requested) with it.
#include "../core/backend.h"
#include "cpu_scratch.h"
#include "parallel_for.h"

#include <cstring>

namespace pulsar {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const RendererConfig& config) : config_(config) {
    scratch_.threads = resolve_thread_count(config.num_threads);
  }

  void begin_binning(const SceneArgs& scene, const RenderOptions& options) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype, [&](auto tag) { cpu_setup_and_bin<decltype(tag)>(config_, scene, scratch_); });
  }
  void finish_binning(const SceneArgs&, const RenderOptions&) override {}  // all done in begin_binning

  void render_forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype,
                   [&](auto tag) { cpu_render_forward<decltype(tag)>(config_, scene, options, outputs, scratch_); });
  }

  void partial_state(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cpu_partial_state<decltype(tag)>(config_, options, scene.batch_size, outputs, scratch_);
    });
  }

  void render_backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                       const GradientOutputs& grads) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cpu_render_backward<decltype(tag)>(config_, scene, options, args, grads, scratch_);
    });
  }

  void reduce_gradients(const SceneArgs& scene, const RenderOptions& options, const GradientOutputs& grads) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype,
                   [&](auto tag) { cpu_reduce_gradients<decltype(tag)>(config_, scene, grads, scratch_); });
  }

  void* packed_cameras(std::size_t bytes) override {
    return scratch_.packed_cameras.reserve<unsigned char>(bytes, "packed cameras");
  }
  const void* zero_features(std::size_t bytes, const RenderOptions&) override {
    auto* zeros = scratch_.zero_features.reserve<unsigned char>(bytes, "zero features");
    std::memset(zeros, 0, bytes);
    return zeros;
  }
  std::size_t scratch_bytes() const override { return scratch_.bytes(); }
  std::int64_t binned_instances() const override { return scratch_.n_instances; }

 private:
  RendererConfig config_;
  CpuScratch scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const RendererConfig& config) { return std::make_unique<CpuBackend>(config); }

}  // namespace pulsar
