// One derivative twin of include/pulsar under test, in vector-Jacobian form.
//
// forward(x, y) is a function f: R^n_in -> R^n_out built from a header's forward code;
// backward(x, g, vjp) must give J_f(x)^T g, built from the header's twin. x holds the
// n_in differentiated inputs followed by n_param values that f reads but that stay fixed
// (a branch flag, a pixel index, a depth range). The harness compares backward with
// central finite differences of <g, f(x)> at points drawn by sample.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace twins {

// A small deterministic generator (SplitMix64): the same points on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * 0x1p-53; }
  // +1 or -1.
  double sign() { return (next() >> 63) ? 1.0 : -1.0; }

 private:
  std::uint64_t state_;
};

struct Twin {
  std::string name;  // "header/twin[/branch]": the header, the twin function, the branch
  int n_in;          // differentiated inputs
  int n_out;         // outputs of f
  int n_param;       // fixed values after the inputs in x
  int n_points;      // random points drawn
  double step;       // finite-difference step, in the inputs' units
  // Draws x (n_in + n_param values) for point number `point`: points away from kinks,
  // and the branch the entry names (entries covering several branches pick by `point`).
  std::function<void(Rng& rng, int point, double* x)> sample;
  std::function<void(const double* x, double* y)> forward;
  std::function<void(const double* x, const double* g, double* vjp)> backward;
  // The branch of f that x lies on ("hit", "tiny_outside", ...), or empty where f is one
  // smooth piece. The harness requires the same branch at every finite-difference point.
  std::function<std::string(const double* x)> branch;
};

// Every twin of include/pulsar, in header order.
std::vector<Twin> twin_table();

}  // namespace twins
