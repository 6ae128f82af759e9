// Evaluates every twin of twin_table() and the central finite difference of its forward
// function at random points, in double, and prints both; tests/math/test_derivative_twins.py
// compares them.
//
//   harness [--list] [--seed N] [--perturb NAME]
//
// Output: one line per twin (--list: name, n_in, n_out, n_points), else one line per
// point, tab-separated: name, point, branch ("-" for a function of one piece), the twin's
// J^T g and the finite difference of <g, f> (comma-separated, %.17g). A finite difference
// whose stencil would cross into another branch of f stops the harness (exit status 3).
//
// Built with PULSAR_TWINS_PERTURB defined, --perturb NAME adds 1e-3 of the twin's largest
// component to its component (point mod n_in) at each point of the twin NAME, so that a
// test can show the comparison catches a wrong twin. The harness perturbs the twin's
// result; the headers are compiled as they are.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "twin.h"

namespace {

// Fourth-order central difference of phi(x) = <g, f(x)> along input i, output by output
// (so that outputs that do not move cancel exactly):
// sum_j g_j (8 (f_j(x + h) - f_j(x - h)) - (f_j(x + 2h) - f_j(x - 2h))) / (12 h).
double finite_difference(const twins::Twin& tw, std::vector<double> x, const std::vector<double>& g, int i) {
  const double x0 = x[i];
  const std::string branch = tw.branch ? tw.branch(x.data()) : std::string();
  auto f_at = [&](double offset) {
    x[i] = x0 + offset * tw.step;
    if (tw.branch && tw.branch(x.data()) != branch) {
      std::fprintf(stderr, "%s: the difference along input %d crosses from branch %s to %s\n", tw.name.c_str(), i,
                   branch.c_str(), tw.branch(x.data()).c_str());
      std::exit(3);
    }
    std::vector<double> y(tw.n_out);
    tw.forward(x.data(), y.data());
    return y;
  };
  const std::vector<double> p1 = f_at(1), m1 = f_at(-1), p2 = f_at(2), m2 = f_at(-2);
  double sum = 0;
  for (int j = 0; j < tw.n_out; ++j) sum += g[j] * (8 * (p1[j] - m1[j]) - (p2[j] - m2[j]));
  return sum / (12 * tw.step);
}

// FNV-1a of a twin's name: each twin's stream of points, the same on every platform.
unsigned long long name_hash(const std::string& name) {
  unsigned long long h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void print_values(const std::vector<double>& v) {
  for (std::size_t i = 0; i < v.size(); ++i) std::printf(i ? ",%.17g" : "%.17g", v[i]);
}

int usage() {
  std::fprintf(stderr, "usage: harness [--list] [--seed N] [--perturb NAME]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool list = false;
  unsigned long long seed = 20240611;
  std::string perturbed;
  for (int a = 1; a < argc; ++a) {
    if (!std::strcmp(argv[a], "--list")) {
      list = true;
    } else if (!std::strcmp(argv[a], "--seed") && a + 1 < argc) {
      seed = std::strtoull(argv[++a], nullptr, 10);
    } else if (!std::strcmp(argv[a], "--perturb") && a + 1 < argc) {
      perturbed = argv[++a];
    } else {
      return usage();
    }
  }
#ifndef PULSAR_TWINS_PERTURB
  if (!perturbed.empty()) {
    std::fprintf(stderr, "--perturb needs a build with PULSAR_TWINS_PERTURB defined\n");
    return 2;
  }
#endif
  const std::vector<twins::Twin> table = twins::twin_table();
  bool found = perturbed.empty();
  for (const twins::Twin& tw : table) found = found || tw.name == perturbed;
  if (!found) {
    std::fprintf(stderr, "no twin named %s\n", perturbed.c_str());
    return 2;
  }

  for (const twins::Twin& tw : table) {
    if (list) {
      std::printf("%s\t%d\t%d\t%d\n", tw.name.c_str(), tw.n_in, tw.n_out, tw.n_points);
      continue;
    }
    // Each twin draws from its own stream, so that adding a twin moves no other's points.
    twins::Rng rng(seed ^ name_hash(tw.name));
    for (int p = 0; p < tw.n_points; ++p) {
      std::vector<double> x(tw.n_in + tw.n_param), g(tw.n_out), vjp(tw.n_in, 0.0), fd(tw.n_in);
      tw.sample(rng, p, x.data());
      for (double& gj : g) gj = rng.uniform(-1, 1);
      tw.backward(x.data(), g.data(), vjp.data());
      for (int i = 0; i < tw.n_in; ++i) fd[i] = finite_difference(tw, x, g, i);
#ifdef PULSAR_TWINS_PERTURB
      if (tw.name == perturbed) {
        double scale = 0;
        for (double v : vjp) scale = std::fmax(scale, std::fabs(v));
        vjp[p % tw.n_in] += 1e-3 * (scale > 0 ? scale : 1.0);
      }
#endif
      std::printf("%s\t%d\t%s\t", tw.name.c_str(), p, tw.branch ? tw.branch(x.data()).c_str() : "-");
      print_values(vjp);
      std::printf("\t");
      print_values(fd);
      std::printf("\n");
    }
  }
  return 0;
}
