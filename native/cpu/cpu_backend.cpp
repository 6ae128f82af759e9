// The CPU backend: owns the host scratch and runs the CPU stages with every core. Each
// stage takes the call's interrupt check (RenderOptions::interrupt_requested) with it.
// Its binning stays in its own scratch; the call's binning memory holds a token naming
// it (BinningToken), so that a backward knows whether the binning it is given is the one
// held, and bins again (the same lists) when not.
#include "../core/backend.h"
#include "cpu_scratch.h"
#include "parallel_for.h"

#include <cstring>

namespace pulsar {

namespace {

// What the CPU writes into a call's binning memory: the binning it made, by number, and
// the backend that holds it.
struct BinningToken {
  std::uint64_t generation;
  const void* backend;
};
static_assert(sizeof(BinningToken) <= kCpuBinningTokenBytes, "the CPU binning token fits its memory");

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const RendererConfig& config) : config_(config) {
    scratch_.threads = resolve_thread_count(config.num_threads);
  }

  MemoryNeeds memory_needs(DType, int, std::int64_t, std::int64_t) const override {
    MemoryNeeds needs;
    needs.binning_bytes = kCpuBinningTokenBytes;
    return needs;
  }

  void bin(const SceneArgs& scene, const RenderOptions& options, const CallMemory& memory, bool,
           bool) override {
    scratch_.interrupt = options.interrupt_requested;
    held_ = 0;  // a failure part-way leaves no binning to name
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cpu_setup_and_bin<decltype(tag)>(config_, scene, scratch_);
    });
    held_ = ++generation_;
    const BinningToken token{held_, this};
    std::memcpy(memory.binning, &token, sizeof(token));
    status_.max_instances = std::max(status_.max_instances, scratch_.n_instances);
  }
  BinningReport take_report(const RenderOptions&) override {
    BinningReport report;
    report.verified = true;
    report.instances = scratch_.n_instances;
    report.max_instances = status_.max_instances;
    return report;
  }
  bool holds_binning(const CallMemory& memory) const override {
    BinningToken token;
    std::memcpy(&token, memory.binning, sizeof(token));
    return held_ != 0 && token.generation == held_ && token.backend == this;
  }

  void render_forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs,
                      const CallMemory&) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cpu_render_forward<decltype(tag)>(config_, scene, options, outputs, scratch_);
    });
  }

  void partial_state(const SceneArgs& scene, const RenderOptions& options,
                     const ForwardOutputs& outputs) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cpu_partial_state<decltype(tag)>(config_, options, scene.batch_size, outputs, scratch_);
    });
  }

  void render_backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                       const GradientOutputs& grads, const CallMemory&) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cpu_render_backward<decltype(tag)>(config_, scene, options, args, grads, scratch_);
    });
  }

  void reduce_gradients(const SceneArgs& scene, const RenderOptions& options, const GradientOutputs& grads,
                        const CallMemory&) override {
    scratch_.interrupt = options.interrupt_requested;
    dispatch_dtype(scene.dtype, [&](auto tag) {
      cpu_reduce_gradients<decltype(tag)>(config_, scene, grads, scratch_);
    });
  }

  void* packed_cameras(const CallMemory&, std::size_t bytes) override {
    return scratch_.packed_cameras.reserve<unsigned char>(bytes, "packed cameras");
  }
  const void* zero_features(const SceneArgs&, const CallMemory&, std::size_t bytes, const RenderOptions&) override {
    auto* zeros = scratch_.zero_features.reserve<unsigned char>(bytes, "zero features");
    std::memset(zeros, 0, bytes);
    return zeros;
  }
  RendererStatus take_status(void*, bool) override { return status_; }
  std::size_t scratch_bytes() const override { return scratch_.bytes(); }
  std::int64_t binned_instances() const override { return scratch_.n_instances; }

 private:
  RendererConfig config_;
  CpuScratch scratch_;
  std::uint64_t generation_ = 0;  // binnings made so far
  std::uint64_t held_ = 0;        // the generation scratch_ holds (0: none)
  RendererStatus status_;         // the CPU checks values before any work and never overflows
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const RendererConfig& config) {
  return std::make_unique<CpuBackend>(config);
}

}  // namespace pulsar
