#include "bindings.h"
#include "pulsar/renderer.h"

namespace py = pybind11;

namespace pulsar::bindings {

void bind_build_info(py::module_& m) {
  m.def("build_info", [] {
    const BuildInfo info = build_info();
    py::dict d;
    d["version"] = info.version;
    py::list backends;
    backends.append("cpu");
    if (info.cuda) backends.append("cuda");
    d["backends"] = py::tuple(backends);
    d["cuda"] = info.cuda;
    d["cuda_version"] = info.cuda_version;
    d["cuda_architectures"] = info.cuda_architectures;
    d["compiler"] = info.compiler;
    return d;
  });
}

}  // namespace pulsar::bindings
