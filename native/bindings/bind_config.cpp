#include "bindings.h"
#include "pulsar/camera.h"
#include "pulsar/renderer.h"

namespace py = pybind11;

namespace pulsar::bindings {

void bind_config(py::module_& m) {
  py::enum_<DType>(m, "DType").value("float32", DType::Float32).value("float64", DType::Float64);
  py::enum_<DeviceKind>(m, "DeviceKind").value("cpu", DeviceKind::CPU).value("cuda", DeviceKind::CUDA);

  py::class_<RendererConfig>(m, "RendererConfig")
      .def(py::init<>())
      .def_readwrite("width", &RendererConfig::width)
      .def_readwrite("height", &RendererConfig::height)
      .def_readwrite("n_channels", &RendererConfig::n_channels)
      .def_readwrite("n_track", &RendererConfig::n_track)
      .def_readwrite("orthographic", &RendererConfig::orthographic)
      .def_readwrite("background_normalized_depth", &RendererConfig::background_normalized_depth)
      .def_readwrite("device", &RendererConfig::device)
      .def_readwrite("device_index", &RendererConfig::device_index)
      .def_readwrite("num_threads", &RendererConfig::num_threads)
      .def_readwrite("backward_row_budget", &RendererConfig::backward_row_budget);

  m.attr("CAMERA_PARAMS") = CAMERA_PARAMS;
  m.attr("MAX_IMAGE_SIDE") = kMaxImageSide;
  m.attr("MAX_TRACK") = kMaxTrack;
}

}  // namespace pulsar::bindings
