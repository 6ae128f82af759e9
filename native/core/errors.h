// Errors are exceptions: invalid arguments become std::invalid_argument (Python
// ValueError through pybind11), failures of the machine std::runtime_error (RuntimeError).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace pulsar {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

#define PULSAR_REQUIRE(cond, ...)                                            \
  do {                                                                       \
    if (!(cond)) throw std::invalid_argument(::pulsar::concat(__VA_ARGS__)); \
  } while (0)

}  // namespace pulsar
