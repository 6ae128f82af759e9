// The public C++ API of the native core: a Renderer constructed once for an image size
// and a device, called per frame with plain pointers (the caller owns inputs and
// outputs; the Renderer owns its scratch). No framework types appear here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace pulsar {

enum class DType : int { Float32 = 0, Float64 = 1 };
enum class DeviceKind : int { CPU = 0, CUDA = 1 };

// Fixed at construction.
struct RendererConfig {
  int width = 0;                  // image width in pixels (columns)
  int height = 0;                 // image height in pixels (rows)
  int n_channels = 3;             // C, feature channels per sphere
  int n_track = 5;                // K, closest hits reported in forward info (1..128)
  bool orthographic = false;      // projection
  double background_normalized_depth = 1e-6;  // beta in (0, 1)
  DeviceKind device = DeviceKind::CPU;
  int device_index = 0;           // CUDA device ordinal
  int num_threads = 0;            // CPU threads; 0: every core
  // CUDA backward: bytes of per-instance gradient rows held at once (one window of sorted
  // positions, docs/design.md); 0: the binning's own space. A testing knob: smaller
  // budgets only take more windows.
  std::int64_t backward_row_budget = 0;
};

// Limits enforced at construction and per call (documented in docs/design.md).
constexpr int kMaxImageSide = 16384;
constexpr int kMaxTrack = 128;

// The spheres and cameras of one call. Pointers are to contiguous arrays of `dtype`
// on the Renderer's device; B = batch_size cameras, N = n_spheres, C = n_channels.
struct SceneArgs {
  DType dtype = DType::Float32;
  int batch_size = 1;             // B
  std::int64_t n_spheres = 0;     // N
  bool shared_spheres = true;     // one set of spheres for all B cameras (else one per camera)
  const void* positions = nullptr;  // [B?, N, 3] centres, world units
  const void* features = nullptr;   // [B?, N, C]
  const void* radii = nullptr;      // [B?, N], > 0, world units
  const void* opacities = nullptr;  // [B?, N] in [0, 1], or null (all 1)
  const void* background = nullptr; // [C] background features
  const void* cameras = nullptr;    // [B, 15], layout in camera.h (CAMERA_PARAMS)
  bool right_handed = false;        // optical axis = -normalize(pdy x pdx)
};

struct RenderOptions {
  double gamma = 0.1;                       // in [1e-5, 1]
  double percent_allowed_difference = 0.0;  // p in [0, 1); 0 disables early termination
  std::int64_t max_n_hits = -1;             // hard cap on processed hits per pixel; < 0: none
  void* stream = nullptr;                   // CUDA stream (cudaStream_t); ignored on the CPU
};

// Caller-owned outputs of forward, [B, H, W, ...] row-major.
struct ForwardOutputs {
  void* image = nullptr;          // [B, H, W, C]
  void* blend_state = nullptr;    // [B, H, W, 2]: (m, D), needed by backward
  std::int32_t* hit_count = nullptr;  // [B, H, W]: processed hits
  // [B, H, W]: per pixel, one past the position of its last processed hit in its tile's
  // list (0 if none). Backward revisits exactly the hits before it.
  std::int32_t* traversal_end = nullptr;
  void* forward_info = nullptr;   // [B, H, W, 3 + 2K] (Pulsar layout) or null
  // [B, H, W, 3] or null: moments M_k = sum_i a_i n_i^k, k = 0, 1, 2, of the hits'
  // normalised depths n_i under their normalised blend weights a_i = w_i / total weight
  // (background included). M_0 is the coverage; depth and distortion derive from them.
  void* depth_moments = nullptr;
};

// What backward reads besides the scene: the forward's outputs and dL/dimage.
struct BackwardArgs {
  const void* grad_image = nullptr;   // [B, H, W, C]
  const void* image = nullptr;        // [B, H, W, C]
  const void* blend_state = nullptr;  // [B, H, W, 2]
  const std::int32_t* traversal_end = nullptr;  // [B, H, W], from forward
  // Both or neither: the forward's depth moments and dL/d(moments), [B, H, W, 3].
  const void* depth_moments = nullptr;
  const void* grad_depth_moments = nullptr;
};

// Gradient outputs; a null pointer means "not requested" and costs nothing. Every
// requested array is fully written (no need to zero it). Sphere gradients have the
// sphere arrays' shapes (summed over cameras when shared_spheres).
struct GradientOutputs {
  void* positions = nullptr;   // [B?, N, 3]
  void* features = nullptr;    // [B?, N, C]
  void* radii = nullptr;       // [B?, N]
  void* opacities = nullptr;   // [B?, N]
  void* background = nullptr;  // [C], summed over the batch
  void* cameras = nullptr;     // [B, 15]
};

class Backend;
struct CameraParamsArgs;

class Renderer {
 public:
  explicit Renderer(const RendererConfig& config);
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // Renders B images. Returns a token naming the binning it built, which backward can
  // reuse when no other call came in between.
  std::uint64_t forward(const SceneArgs& scene, const RenderOptions& options,
                        const ForwardOutputs& outputs);

  // forward in two calls: begin_forward starts the binning (on CUDA it enqueues the
  // device work up to its one host synchronisation and returns), finish_forward completes
  // it for the same scene and options and renders into the outputs. The caller may
  // allocate the outputs in between while the device works. finish_forward without a
  // begin_forward of its own (or after another call came in between) is an error.
  void begin_forward(const SceneArgs& scene, const RenderOptions& options);
  std::uint64_t finish_forward(const SceneArgs& scene, const RenderOptions& options,
                               const ForwardOutputs& outputs);

  // begin_forward with the cameras given as Pulsar camera vectors: use_camera_vectors,
  // then begin_forward, in one call. The caller allocates nothing and makes one call
  // before the binning's first kernel (on the lent H100's host the separate conversion's
  // allocation and call cost 56 us of W1's call, docs/benchmarks.md). finish_forward
  // then takes the same scene, whose cameras point at the renderer's conversion.
  void begin_forward_from_vectors(SceneArgs& scene, const RenderOptions& options,
                                  const CameraParamsArgs& camera_vectors);

  // Converts camera_vectors (params: [B, L] on this renderer's device, B =
  // scene.batch_size, of the scene's dtype, for this renderer's image size, projection
  // and the scene's handedness) into packed cameras [B, 15] in a buffer the renderer
  // owns, on options.stream (camera_vectors.stream is not read), and points
  // scene.cameras at them. The next conversion rewrites the buffer: a backward of a
  // begin_forward_from_vectors converts its vectors again (the same values).
  void use_camera_vectors(SceneArgs& scene, const RenderOptions& options, const CameraParamsArgs& camera_vectors);

  // Exact gradients of the forward (model.md section 8) for the same scene and options.
  void backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                const GradientOutputs& grads, std::uint64_t forward_token);

  const RendererConfig& config() const { return config_; }
  // Bytes of scratch the Renderer currently owns (host or device).
  std::size_t scratch_bytes() const;
  // (tile, sphere) instances the last binning stored (a diagnostic: on CUDA, those up to
  // each tile's depth bound).
  std::int64_t binned_instances() const;

 private:
  void check_call(const SceneArgs& scene, const RenderOptions& options) const;
  // Binning in its two halves (the backend's begin_binning / finish_binning) with the
  // token bookkeeping; prepare runs both.
  void start_binning(const SceneArgs& scene, const RenderOptions& options);
  void complete_binning(const SceneArgs& scene, const RenderOptions& options);
  void prepare(const SceneArgs& scene, const RenderOptions& options);

  RendererConfig config_;
  std::unique_ptr<Backend> backend_;
  std::uint64_t binned_token_ = 0;  // token of the binning the backend holds; 0: none
  std::uint64_t next_token_ = 1;
  bool forward_begun_ = false;      // a begin_forward awaits its finish_forward
};

// Pulsar camera vectors -> packed native cameras, in one call (include/pulsar/
// camera_params.h holds the conversion; model.md section 2 its meaning). Replaces ~60
// tiny framework ops per direction on the hot path. Pointers are to contiguous arrays of
// `dtype` on `device`; B = batch_size, L = length.
struct CameraParamsArgs {
  DType dtype = DType::Float32;
  DeviceKind device = DeviceKind::CPU;
  int device_index = 0;           // CUDA device ordinal
  void* stream = nullptr;         // CUDA stream (cudaStream_t); ignored on the CPU
  int batch_size = 1;             // B >= 1
  int length = 8;                 // L in {8, 10, 11, 13}
  int width = 0, height = 0;      // image size in pixels (>= 1)
  bool orthographic = false;      // focal length ignored, packed as 0
  bool right_handed = false;      // optical axis negated
  bool first_R_then_T = false;    // eye = M * position
  double min_depth = 0.0;         // near depth, world units; 0: focal length + 2e-6
  double max_depth = 1.0;         // far depth, world units (stored, not validated)
  const void* params = nullptr;   // [B, L] camera vectors
};

// Writes packed [B, 15] (camera.h layout: eye, p00_rel, pdx, pdy, focal, resolved
// min_depth, max_depth). Asynchronous on CUDA (enqueued on args.stream).
void camera_params_to_packed(const CameraParamsArgs& args, void* packed);

// Writes grad_params [B, L] = (d packed / d params)^T grad_packed, for grad_packed
// [B, 15]: the exact derivative of camera_params_to_packed (every element is written).
void camera_params_backward(const CameraParamsArgs& args, const void* grad_packed, void* grad_params);

struct BuildInfo {
  std::string version;
  bool cpu = true;
  bool cuda = false;
  std::string cuda_version;       // of the toolkit compiled against
  std::string cuda_architectures; // as configured
  std::string compiler;
};
BuildInfo build_info();

}  // namespace pulsar
