#include "bindings.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "pulsar_py native core (framework-free; called through pulsar_py)";
  pulsar::bindings::bind_config(m);
  pulsar::bindings::bind_calls(m);
  pulsar::bindings::bind_renderer(m);
  pulsar::bindings::bind_build_info(m);
}
