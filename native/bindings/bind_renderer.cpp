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
  // The GIL is released while native work runs, so renderers on other threads proceed.
  py::class_<Renderer>(m, "Renderer")
      .def(py::init<const RendererConfig&>(), py::arg("config"))
      // make_outputs: a Python callable returning ForwardOutputs, called once the binning's
      // device work is enqueued (the caller allocates its outputs while the device bins).
      .def(
          "forward",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, py::function make_outputs) {
            const std::function<ForwardOutputs()> make = [&make_outputs] {
              py::gil_scoped_acquire acquire;
              return make_outputs().cast<ForwardOutputs>();
            };
            run_interruptible(options, [&](const RenderOptions& o) { r.forward(scene, o, make); });
          },
          py::arg("scene"), py::arg("options"), py::arg("make_outputs"))
      .def(
          "forward",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, const ForwardOutputs& outputs) {
            run_interruptible(options, [&](const RenderOptions& o) { r.forward(scene, o, outputs); });
          },
          py::arg("scene"), py::arg("options"), py::arg("outputs"))
      .def(
          "backward",
          [](Renderer& r, const SceneArgs& scene, const RenderOptions& options, const BackwardArgs& args,
             const GradientOutputs& grads) {
            run_interruptible(options, [&](const RenderOptions& o) { r.backward(scene, o, args, grads); });
          },
          py::arg("scene"), py::arg("options"), py::arg("args"), py::arg("grads"))
      .def_property_readonly("config", &Renderer::config)
      .def_property_readonly("scratch_bytes", &Renderer::scratch_bytes)
      .def_property_readonly("binned_instances", &Renderer::binned_instances)
      .def_property("instance_capacity", &Renderer::instance_capacity, &Renderer::set_instance_capacity)
      // stream: cudaStream_t as an int (0 on the CPU); waits for it with the GIL released.
      .def(
          "take_instance_overflow",
          [](Renderer& r, std::uintptr_t stream) {
            py::gil_scoped_release release;
            return r.take_instance_overflow(reinterpret_cast<void*>(stream));
          },
          py::arg("stream"));
}

}  // namespace pulsar::bindings
