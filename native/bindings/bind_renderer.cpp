#include <functional>

#include "bindings.h"
#include "pulsar/renderer.h"

namespace py = pybind11;

namespace pulsar::bindings {

namespace {

// The interpreter's main thread, the one Python runs signal handlers in.
unsigned long main_thread_ident = 0;

// Runs call(options) with the GIL released. Called from the main thread, the call gets
// an interrupt check (RenderOptions::interrupt_requested) that takes the GIL and runs
// Python's pending signal handlers: Ctrl-C (KeyboardInterrupt), or any exception a
// handler raises, stops the native call (the CPU backend asks between work items, at
// most every 50 ms) and propagates once the call has unwound. Other threads never run
// signal handlers, so their calls get no check. The GIL is held on entry.
template <typename Call>
void run_interruptible(const RenderOptions& options, Call&& call) {
  RenderOptions with_check = options;
  const std::function<bool()> check = [] {
    py::gil_scoped_acquire acquire;
    return PyErr_CheckSignals() != 0;  // the handler's exception stays set for below
  };
  if (PyThread_get_thread_ident() == main_thread_ident) with_check.interrupt_requested = &check;
  bool interrupted = false;
  {
    py::gil_scoped_release release;
    try {
      call(with_check);
    } catch (const Interrupted&) {
      interrupted = true;
    }
  }
  if (interrupted) {
    if (PyErr_Occurred() == nullptr) throw std::runtime_error("pulsar: the call was interrupted");
    throw py::error_already_set();
  }
}

}  // namespace

void bind_renderer(py::module_& m) {
  main_thread_ident = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();

  py::class_<CallMemory>(m, "CallMemory")
      .def(py::init([](std::uintptr_t binning, std::size_t binning_bytes, std::uintptr_t entries,
                       std::int64_t capacity, std::uintptr_t workspace, std::size_t workspace_bytes) {
             CallMemory memory;
             memory.binning = reinterpret_cast<void*>(binning);
             memory.binning_bytes = binning_bytes;
             memory.entries = reinterpret_cast<std::int32_t*>(entries);
             memory.capacity = capacity;
             memory.workspace = reinterpret_cast<void*>(workspace);
             memory.workspace_bytes = workspace_bytes;
             return memory;
           }),
           py::arg("binning"), py::arg("binning_bytes"), py::arg("entries"), py::arg("capacity"),
           py::arg("workspace"), py::arg("workspace_bytes"))
      .def_readonly("binning_bytes", &CallMemory::binning_bytes)
      .def_readonly("workspace_bytes", &CallMemory::workspace_bytes)
      .def_readonly("capacity", &CallMemory::capacity);

  py::class_<BinningReport>(m, "BinningReport")
      .def_readonly("verified", &BinningReport::verified)
      .def_readonly("instances", &BinningReport::instances)
      .def_readonly("small_box_instances", &BinningReport::small_box_instances)
      .def_readonly("overflowed", &BinningReport::overflowed)
      .def_readonly("overflows", &BinningReport::overflows)
      .def_readonly("invalid_values", &BinningReport::invalid_values)
      .def_readonly("max_instances", &BinningReport::max_instances);

  py::class_<RendererStatus>(m, "RendererStatus")
      .def_readonly("max_instances", &RendererStatus::max_instances)
      .def_readonly("overflowed", &RendererStatus::overflowed)
      .def_readonly("invalid_values", &RendererStatus::invalid_values);

  // The GIL is released while native work runs, so renderers on other threads proceed.
  py::class_<Renderer>(m, "Renderer")
      .def(py::init<const RendererConfig&>(), py::arg("config"))
      .def(
          "memory_needs",
          [](const Renderer& r, DType dtype, int batch_size, std::int64_t n_spheres, std::int64_t capacity) {
            const MemoryNeeds needs = r.memory_needs(dtype, batch_size, n_spheres, capacity);
            return py::make_tuple(needs.binning_bytes, needs.workspace_bytes);
          },
          py::arg("dtype"), py::arg("batch_size"), py::arg("n_spheres"), py::arg("capacity"))
      .def(
          "forward",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs,
             const CallMemory& memory, bool verify) {
            BinningReport report;
            run_interruptible(options, [&](const RenderOptions& o) { report = r.forward(scene, o, outputs, memory, verify); });
            return report;
          },
          py::arg("scene"), py::arg("options"), py::arg("outputs"), py::arg("memory"), py::arg("verify"))
      .def(
          "bin",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, const CallMemory& memory,
             bool verify) {
            BinningReport report;
            run_interruptible(options, [&](const RenderOptions& o) { report = r.bin(scene, o, memory, verify); });
            return report;
          },
          py::arg("scene"), py::arg("options"), py::arg("memory"), py::arg("verify"))
      .def(
          "count_instances",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, const CallMemory& memory) {
            std::int64_t count = 0;
            run_interruptible(options, [&](const RenderOptions& o) { count = r.count_instances(scene, o, memory); });
            return count;
          },
          py::arg("scene"), py::arg("options"), py::arg("memory"))
      .def(
          "backward",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
             const GradientOutputs& grads, const CallMemory& memory) {
            run_interruptible(options, [&](const RenderOptions& o) { r.backward(scene, o, args, grads, memory); });
          },
          py::arg("scene"), py::arg("options"), py::arg("args"), py::arg("grads"), py::arg("memory"))
      .def(
          "take_status",
          [](Renderer& r, std::uintptr_t stream, bool wait) {
            py::gil_scoped_release release;
            return r.take_status(reinterpret_cast<void*>(stream), wait);
          },
          py::arg("stream"), py::arg("wait"))
      .def_property_readonly("config", &Renderer::config)
      .def_property_readonly("scratch_bytes", &Renderer::scratch_bytes)
      .def_property_readonly("binned_instances", &Renderer::binned_instances);

  m.def(
      "binning_bytes",
      [](DeviceKind device, int width, int height, DType dtype, int batch_size, std::int64_t n_spheres) {
        return binning_bytes(device, width, height, dtype, batch_size, n_spheres);
      },
      py::arg("device"), py::arg("width"), py::arg("height"), py::arg("dtype"), py::arg("batch_size"),
      py::arg("n_spheres"));
  m.attr("CALL_VALUES") = kCallValues;
}

}  // namespace pulsar::bindings
