// The public C++ API of the native core: a Renderer constructed once for an image size
// and a device, called per frame with plain pointers (the caller owns inputs and
// outputs; the Renderer owns its scratch). No framework types appear here.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "pulsar/depth_stats.h"

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

// How SceneArgs::cameras is laid out. Packed: [B, 15] general cameras (camera.h). Pulsar
// camera vectors: [B, L], L in {8, 10, 11, 13} (camera_params.h, docs/model.md section 2),
// converted by the renderer into packed cameras for this call, and the camera gradient of
// backward is then taken through the conversion back to the vectors.
struct CameraVectors {
  int length = 0;                 // 0: cameras are packed; else L, the vectors' length
  bool first_R_then_T = false;    // eye = M * position
  double min_depth = 0.0;         // near depth, world units; 0: focal length + 2e-6
  double max_depth = 1.0;         // far depth, world units
};

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
  const void* cameras = nullptr;    // [B, 15] packed, or [B, L] camera vectors (camera_vectors)
  CameraVectors camera_vectors;     // length 0: `cameras` are packed
  bool right_handed = false;        // optical axis = -normalize(pdy x pdx)
};

// Slots of a call's values (RenderOptions::values, CameraParamsArgs::values).
struct CallValue {
  enum : int { kGamma = 0, kPercentAllowedDifference = 1, kMinDepth = 2, kMaxDepth = 3, kCount = 4 };
};

struct RenderOptions {
  double gamma = 0.1;                       // in [1e-5, 1]
  double percent_allowed_difference = 0.0;  // p in [0, 1); 0 disables early termination
  // The call's settings as data, or null: double[CallValue::kCount] in the backend's
  // memory (device memory on CUDA). When set, the kernels read gamma and p from it instead
  // of the two fields above, and a conversion of camera vectors reads its depth range from
  // it (CameraVectors' depths are ignored; packed cameras carry their own), so that a
  // captured CUDA graph reads the values current at each replay. Checked where they are
  // (call_values_valid: gamma in [1e-5, 1], p in [0, 1), 0 <= near < far < inf): on the
  // CPU by the call (std::invalid_argument); on CUDA, where the host does not read them,
  // values out of range make the image, its state and every gradient NaN.
  const double* values = nullptr;
  std::int64_t max_n_hits = -1;             // hard cap on processed hits per pixel; < 0: none
  void* stream = nullptr;                   // CUDA stream (cudaStream_t); ignored on the CPU
  // Asked by the CPU backend from the calling thread between work items, at most every
  // 50 ms; when it returns true the call stops: its worker threads are joined and it
  // throws Interrupted. Null (the default): never asked. The CUDA backend, which only
  // enqueues work, ignores it. (A pointer, so that the struct stays trivially copyable.)
  const std::function<bool()>* interrupt_requested = nullptr;
  // A partial render: the blend of one share of a scene's spheres, as the per-pixel state
  // that merges exactly with the other shares' (docs/model.md section 5, "Shares"): forward
  // writes the share's feature sum A into `image` and its own normaliser into blend_state
  // (ForwardOutputs). The background's features are not read; its weight still counts in
  // the termination rule. Depth statistics, when asked for, are those of the share's own
  // hits (the mean and variance under their weights, the coverage against the share's
  // normaliser), which merge with the other shares' like partial variances. Backward, given
  // the merged state of all shares instead (BackwardArgs; with the merged depth statistics),
  // differentiates this share's spheres; partial tells it that the pixel's other
  // contributors are not all among them.
  bool partial = false;
};

// Thrown by a call whose RenderOptions::interrupt_requested returned true. The renderer
// is usable afterwards (as after any failed call: the next call bins again).
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("pulsar: the call was interrupted") {}
};

// Caller-owned outputs of forward, [B, H, W, ...] row-major. A partial render
// (RenderOptions::partial) writes, in `image`, the feature sum A of its spheres relative to
// exp(m), and in blend_state (m, D_share): D_share = D - exp(s_bg - m), the normaliser
// without the background's weight (blend.h, partial_normalizer).
struct ForwardOutputs {
  void* image = nullptr;          // [B, H, W, C]
  void* blend_state = nullptr;    // [B, H, W, 2]: (m, D), needed by backward
  std::int32_t* hit_count = nullptr;  // [B, H, W]: processed hits
  // [B, H, W]: per pixel, one past the position of its last processed hit in its tile's
  // list (0 if none). Backward revisits exactly the hits before it.
  std::int32_t* traversal_end = nullptr;
  void* forward_info = nullptr;   // [B, H, W, 3 + 2K] (Pulsar layout) or null
  // [B, H, W, kDepthStats] or null: the depth statistics of docs/model.md section 7, in
  // the slots below: the coverage M_0 = sum_i a_i (a_i = w_i / total weight, background
  // included), and the mean and variance of the hits' normalised depths n_i under the
  // weights b_i = a_i / M_0, the mean as the unevaluated sum of two values (blend.h,
  // DepthStats). Depth and distortion derive from them.
  void* depth_moments = nullptr;
};

// What backward reads besides the scene: the forward's outputs and dL/dimage.
struct BackwardArgs {
  const void* grad_image = nullptr;   // [B, H, W, C]
  const void* image = nullptr;        // [B, H, W, C]
  const void* blend_state = nullptr;  // [B, H, W, 2]
  const std::int32_t* traversal_end = nullptr;  // [B, H, W], from forward
  // Both or neither: the forward's depth statistics and their gradient, [B, H, W,
  // kDepthStats] (the gradient's kDepthMeanLow slot is not read: the two parts of the mean
  // share dL/dmean).
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
  void* cameras = nullptr;     // [B, 15] packed, or [B, L] like the camera vectors
};

class Backend;

// One renderer per image size and device. Calls on one renderer must not overlap (one
// thread at a time): a call made while another is running raises std::runtime_error.
// Renderers are independent of each other; separate renderers may run in parallel.
class Renderer {
 public:
  explicit Renderer(const RendererConfig& config);
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // Renders B images into `outputs`. The renderer keeps the binning it built for the
  // backward of this forward. On CUDA the call synchronises with the host once (the
  // binning reads back how many (tile, sphere) instances it stores, to size their lists)
  // unless an instance capacity sizes it (set_instance_capacity, or a stream capture);
  // everything else is enqueued on options.stream.
  void forward(const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs);

  // The same, with the outputs made by `make_outputs`, which the renderer calls once,
  // after the binning's device work is enqueued and before its host synchronisation: a
  // caller that allocates its outputs there does so while the device bins.
  void forward(const SceneArgs& scene, const RenderOptions& options,
               const std::function<ForwardOutputs()>& make_outputs);

  // Exact gradients of the forward (docs/model.md section 8) for the same scene and
  // options, given that forward's very output arrays (args). After a partial forward, args
  // hold the merged image and blend state of all shares (the same for every share) with
  // this share's traversal end: the gradients are those of this share's spheres, and the
  // camera's and background's parts that come through them (every share computes the
  // background's whole gradient: it depends on the merged state alone). When that forward
  // is the last this renderer ran (its traversal_end array is the one given), its binning is
  // reused; otherwise the binning is rebuilt from the same inputs, which gives the same
  // lists. (Output arrays overwritten by another forward hold that forward's results, so
  // the backward of the first needs its own arrays in any case.)
  void backward(const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
                const GradientOutputs& grads);

  const RendererConfig& config() const { return config_; }
  // Bytes of scratch the Renderer currently owns (host or device).
  std::size_t scratch_bytes() const;
  // (tile, sphere) instances the last binning stored (a diagnostic: on CUDA, those up to
  // each tile's depth bound; -1 when the binning was sized by a capacity and the count
  // stayed on the device).
  std::int64_t binned_instances() const;
  // CUDA: the (tile, sphere) instances a binning without host synchronisation has room
  // for (docs/design.md, "Capture"). `capacity` > 0 fixes it, and every call is sized by
  // it (none synchronises); 0 (the default) learns it from the counts that calls outside a
  // stream capture read back, and only captured calls are sized by it (a call outside a
  // capture builds its lists in room its predecessors' counts call for, if any, reads its
  // own count back before it renders and, when the count outgrew the room, bins again).
  // A binning whose count exceeds its capacity writes NaN over its outputs and gradients
  // and records the count: the next call that reads its count back throws, as does
  // take_instance_overflow. The CPU backend keeps no capacity (0).
  void set_instance_capacity(std::int64_t capacity);
  std::int64_t instance_capacity() const;
  // The largest instance count a binning could not store since the last read (0: none),
  // after waiting for `stream` (cudaStream_t); resets the record.
  std::int64_t take_instance_overflow(void* stream);

 private:
  class Busy;  // marks the renderer in use for one call (renderer.cpp)
  void check_call(const SceneArgs& scene, const RenderOptions& options) const;
  // The scene with its cameras packed: `scene` itself, or, for camera vectors, a copy
  // pointing at the renderer's conversion of them (in its first half of camera scratch),
  // converted now when `convert`, else as the last conversion left them.
  SceneArgs with_packed_cameras(const SceneArgs& scene, const RenderOptions& options, bool convert = true);
  void bin(const SceneArgs& scene, const RenderOptions& options);
  // The second call of a binning (Backend::finish_binning), and when its lists lacked room
  // for its instances (Backend::settle_binning), the binning again, sized by its count.
  void complete_binning(const SceneArgs& scene, const RenderOptions& options);

  RendererConfig config_;
  std::unique_ptr<Backend> backend_;
  // traversal_end of the forward whose binning the backend holds; null: none to reuse.
  const void* binned_for_ = nullptr;
  std::atomic<bool> busy_{false};
};

struct CameraParamsArgs;

// Pulsar camera vectors -> packed cameras, outside a render call (the renderer converts
// SceneArgs' camera vectors itself). camera_params.h holds the conversion, docs/model.md
// section 2 its meaning. Pointers are to contiguous arrays of `dtype` on `device`;
// B = batch_size, L = length.
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
  // Or null: a call's values (RenderOptions::values), whose depth slots replace min_depth
  // and max_depth where the conversion runs (device memory on CUDA).
  const double* values = nullptr;
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
