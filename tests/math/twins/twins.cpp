// The table of derivative twins: for each twin of include/pulsar, its forward function
// and the twin in vector-Jacobian form (twin.h), on points of each branch it has.
//
// Twins that add to caller-owned outputs (cross_backward, the intersection twins, the
// gradient sums, add_sensor_offset) start from the nonzero values kStart*, subtracted
// afterwards: a twin that overwrote its output instead of adding to it fails.
#include <cmath>
#include <string>
#include <vector>

#include "pulsar/blend.h"
#include "pulsar/camera.h"
#include "pulsar/camera_params.h"
#include "pulsar/dual.h"
#include "pulsar/intersection.h"
#include "pulsar/pixel_ray.h"
#include "pulsar/vec3.h"
#include "twin.h"

namespace twins {
namespace {

using pulsar::Vec3;
using V = Vec3<double>;

constexpr double kPi = 3.14159265358979323846;
const V kStartVec{0.375, -0.625, 0.875};
constexpr double kStart = 0.4375;
const pulsar::RadiusGradSums<double> kStartRadius{0.3125, -0.6875};

V at(const double* x) { return pulsar::load_vec3(x); }
void put(double* y, V v) { pulsar::store_vec3(y, v); }

V random_vec(Rng& rng, double lo, double hi) { return {rng.uniform(lo, hi), rng.uniform(lo, hi), rng.uniform(lo, hi)}; }
V random_unit(Rng& rng) {
  for (;;) {
    const V v = random_vec(rng, -1, 1);
    const double n = norm(v);
    if (n > 0.2 && n <= 1) return (1 / n) * v;
  }
}
// A unit vector orthogonal to the unit vector u.
V orthogonal_unit(Rng& rng, V u) {
  for (;;) {
    const V v = random_unit(rng);
    const V w = v - dot(v, u) * u;
    if (norm(w) > 0.3) return normalize(w);
  }
}
// A unit vector at an angle in [lo, hi] radians from the unit vector u.
V unit_at_angle(Rng& rng, V u, double lo, double hi) {
  const double angle = rng.uniform(lo, hi);
  return std::cos(angle) * u + std::sin(angle) * orthogonal_unit(rng, u);
}
double away_from_zero(Rng& rng) { return rng.sign() * rng.uniform(0.5, 2); }

double radius_grad(pulsar::RadiusGradSums<double> sums, double r) {
  sums.closeness -= kStartRadius.closeness;
  sums.half_chord -= kStartRadius.half_chord;
  return sums.resolve(r, 1 / r);
}

std::string hit_branch(const pulsar::PairHit<double>& h) {
  if (h.tiny) return h.inside ? "tiny_inside" : "tiny_outside";
  return h.inside ? "hit" : "miss";
}

// ------------------------------------------------------------------------- dual.h
// A dual operation f written once over the scalar type: run on double it is the forward;
// run on Dual<double, N> seeded with the identity its tangents are the Jacobian (the
// derivative rules under test). f(in, s): N inputs, s the fixed parameters.
template <int N, class F>
Twin dual_twin(const std::string& name, int n_param, std::function<void(Rng&, double*)> draw, F f) {
  Twin tw;
  tw.name = "dual/" + name;
  tw.n_in = N;
  tw.n_out = 1;
  tw.n_param = n_param;
  tw.n_points = 8;
  tw.step = 1e-4;
  tw.sample = [draw](Rng& rng, int, double* x) { draw(rng, x); };
  tw.forward = [f](const double* x, double* y) { y[0] = f(x, x + N); };
  tw.backward = [f](const double* x, const double* g, double* vjp) {
    using D = pulsar::Dual<double, N>;
    D in[N];
    for (int k = 0; k < N; ++k) {
      in[k] = D(x[k]);
      in[k].d[k] = 1;
    }
    const D out = f(static_cast<const D*>(in), x + N);
    for (int k = 0; k < N; ++k) vjp[k] = g[0] * out.d[k];
  };
  return tw;
}

// Draws for the dual operations: any value, or one away from zero for divisors.
void draw_any_any(Rng& rng, double* x) {
  x[0] = rng.uniform(-2, 2);
  x[1] = rng.uniform(-2, 2);
}
void draw_any_nonzero(Rng& rng, double* x) {
  x[0] = rng.uniform(-2, 2);
  x[1] = away_from_zero(rng);
}
void draw_nonzero_any(Rng& rng, double* x) {
  x[0] = away_from_zero(rng);
  x[1] = rng.uniform(-2, 2);
}
void draw_any(Rng& rng, double* x) { x[0] = rng.uniform(-3, 3); }
void draw_positive(Rng& rng, double* x) { x[0] = rng.uniform(0.2, 4); }

// ------------------------------------------------------------------------- intersection.h
// finish_hit's inputs as its callers leave them: x = delta, o1, l^2, r | tiny-sphere rule.
pulsar::PairHit<double> finish_hit_at(const double* x) {
  pulsar::PairHit<double> h;
  h.delta = x[0];
  h.o1 = x[1];
  h.perp_sq = x[2];
  h.inside = h.delta <= x[3];
  h.tiny = x[4] != 0;
  h.hit = h.inside || h.tiny;
  pulsar::finish_hit(h, x[3], 1 / x[3]);
  return h;
}

Twin finish_hit_twin(const std::string& branch, bool tiny, bool inside) {
  Twin tw;
  tw.name = "intersection/finish_hit_backward/" + branch;
  tw.n_in = 4;
  tw.n_out = 2;
  tw.n_param = 1;
  tw.n_points = 8;
  tw.step = 1e-4;
  tw.sample = [tiny, inside](Rng& rng, int, double* x) {
    const double r = rng.uniform(0.5, 2);
    x[0] = (inside ? rng.uniform(0.15, 0.85) : rng.uniform(1.15, 2)) * r;  // delta
    x[1] = rng.uniform(2, 20);                                           // o1
    x[2] = rng.uniform(0.1, 0.8) * r * r;                                // l^2 < r^2
    x[3] = r;
    x[4] = tiny;
  };
  tw.forward = [](const double* x, double* y) {
    const pulsar::PairHit<double> h = finish_hit_at(x);
    y[0] = h.kappa;
    y[1] = h.depth;
  };
  tw.backward = [](const double* x, const double* g, double* vjp) {
    const pulsar::PairHit<double> h = finish_hit_at(x);
    pulsar::RadiusGradSums<double> grad_r = kStartRadius;
    pulsar::finish_hit_backward(h, 1 / x[3], g[0], g[1], vjp[0], vjp[1], vjp[2], grad_r);
    vjp[3] = radius_grad(grad_r, x[3]);
  };
  tw.branch = [](const double* x) { return hit_branch(finish_hit_at(x)); };
  return tw;
}

// A perspective pair as the renderer evaluates it: x = c (centre - eye), r, d (unit ray) |
// pixel size (focal length 1), whether the sphere is tiny.
struct PerspectivePair {
  pulsar::CameraFrame<double> cam{};
  V c;
  double t, r;
  pulsar::PairTerms<double> terms;
  pulsar::PairHit<double> hit;

  explicit PerspectivePair(const double* x) : c(at(x)), t(norm(c)), r(x[3]) {
    cam.orthographic = false;
    cam.focal = 1;
    cam.pixel_size = x[7];
    terms = pulsar::pair_terms(cam, t, r, x[8] != 0);
    pulsar::PixelRay<double> ray{};
    ray.dir = at(x + 4);
    hit = pulsar::evaluate_pair(cam, c, t, r, terms, ray);
  }
};

Twin perspective_twin(const std::string& branch, bool tiny, bool inside) {
  Twin tw;
  tw.name = "intersection/intersect_perspective_backward/" + branch;
  tw.n_in = 7;
  tw.n_out = 2;
  tw.n_param = 2;
  tw.n_points = 8;
  tw.step = 3e-5;  // a step of the ray moves the chord by t times as much
  tw.sample = [tiny, inside](Rng& rng, int, double* x) {
    const double t = rng.uniform(4, 30);
    const V axis = random_unit(rng);
    const double r = rng.uniform(0.05, 0.2) * t;
    const double delta = (inside ? rng.uniform(0.15, 0.85) : rng.uniform(1.2, 1.7)) * r;
    // The ray at the angle phi from the centre whose chord 2 t sin(phi / 2) is delta.
    const double phi = 2 * std::asin(delta / (2 * t));
    put(x, t * axis);
    x[3] = r;
    put(x + 4, std::cos(phi) * axis + std::sin(phi) * orthogonal_unit(rng, axis));
    // Tiny: the rule's chord 0.75 ps t / f at 2 to 3 radii.
    x[7] = tiny ? rng.uniform(2, 3) * r / (pulsar::kTinyCentreRadiusPx * t) : 1e-3;
    x[8] = tiny;
  };
  tw.forward = [](const double* x, double* y) {
    const PerspectivePair p(x);
    y[0] = p.hit.kappa;
    y[1] = p.hit.depth;
  };
  tw.backward = [](const double* x, const double* g, double* vjp) {
    const PerspectivePair p(x);
    pulsar::CentreGradSums<double> grad_c;
    grad_c.chord = kStartVec;
    grad_c.dist = kStart;
    pulsar::CentreGradSums<double> start_c = grad_c;
    pulsar::RadiusGradSums<double> grad_r = kStartRadius;
    V grad_d = kStartVec;
    pulsar::intersect_perspective_backward(p.hit, p.t, p.terms, g[0], g[1], grad_c, grad_r, grad_d);
    put(vjp, grad_c.resolve(p.c, p.terms) - start_c.resolve(p.c, p.terms));
    vjp[3] = radius_grad(grad_r, p.r);
    put(vjp + 4, grad_d - kStartVec);
  };
  tw.branch = [](const double* x) { return hit_branch(PerspectivePair(x).hit); };
  return tw;
}

// An orthographic pair: x = a, b (centre - sensor point in the pixel frame), cz, r |
// pixel width, pixel height, whether the sphere is tiny.
struct OrthographicPair {
  pulsar::CameraFrame<double> cam{};
  pulsar::PairTerms<double> terms;
  pulsar::PairHit<double> hit;

  explicit OrthographicPair(const double* x) {
    cam.orthographic = true;
    terms = pulsar::pair_terms(cam, 0.0, x[3], x[6] != 0);
    hit = pulsar::intersect_orthographic(x[0], x[1], x[2], x[3], terms, x[4], x[5]);
  }
};

enum class OrthoCase { kHitFront, kHitBehind, kTinyInside, kTinyOutside };

Twin orthographic_twin(const std::string& branch, OrthoCase which) {
  Twin tw;
  tw.name = "intersection/intersect_orthographic_backward/" + branch;
  tw.n_in = 4;
  tw.n_out = 2;
  tw.n_param = 3;
  tw.n_points = 8;
  tw.step = 1e-4;
  tw.sample = [which](Rng& rng, int, double* x) {
    const double pw = rng.uniform(1, 2), ph = rng.uniform(1, 2);
    const double small = std::fmin(pw, ph);
    const bool tiny = which == OrthoCase::kTinyInside || which == OrthoCase::kTinyOutside;
    double r;
    if (which == OrthoCase::kTinyOutside) {
      // In the centre pixel, out of the sphere.
      r = rng.uniform(0.05, 0.1) * small;
      x[0] = rng.sign() * rng.uniform(0.15, 0.4) * pw;
      x[1] = rng.sign() * rng.uniform(0.15, 0.4) * ph;
    } else {
      r = (tiny ? rng.uniform(0.2, 0.4) * small : rng.uniform(2, 5));
      const double delta = rng.uniform(0.15, 0.85) * r, angle = rng.uniform(0, 2 * kPi);
      x[0] = delta * std::cos(angle);
      x[1] = delta * std::sin(angle);
    }
    x[2] = (which == OrthoCase::kHitBehind ? -1 : 1) * rng.uniform(2, 20);
    x[3] = r;
    x[4] = pw;
    x[5] = ph;
    x[6] = tiny;
  };
  tw.forward = [](const double* x, double* y) {
    const OrthographicPair p(x);
    y[0] = p.hit.kappa;
    y[1] = p.hit.depth;
  };
  tw.backward = [](const double* x, const double* g, double* vjp) {
    const OrthographicPair p(x);
    double ga = kStart, gb = kStart, gcz = kStart;
    pulsar::RadiusGradSums<double> grad_r = kStartRadius;
    pulsar::intersect_orthographic_backward(p.hit, x[0], x[1], x[2], p.terms, g[0], g[1], ga, gb, gcz, grad_r);
    vjp[0] = ga - kStart;
    vjp[1] = gb - kStart;
    vjp[2] = gcz - kStart;
    vjp[3] = radius_grad(grad_r, x[3]);
  };
  tw.branch = [](const double* x) {
    const std::string b = hit_branch(OrthographicPair(x).hit);
    return b == "hit" ? b + (x[2] >= 0 ? "_front" : "_behind") : b;
  };
  return tw;
}

// ------------------------------------------------------------------------- blend.h
pulsar::BlendParams<double> blend_params(double gamma, double min_depth, double max_depth) {
  pulsar::BlendParams<double> p{};
  p.gamma = gamma;
  p.inv_gamma = 1 / gamma;
  p.min_depth = min_depth;
  p.max_depth = max_depth;
  p.inv_range = 1 / (max_depth - min_depth);
  p.inv_gamma_range = 1 / (gamma * (max_depth - min_depth));
  p.bg_exponent = 1e-6 / gamma;
  p.log_odds = 0;
  p.early_stop = false;
  return p;
}

// A depth range and depths inside it: x[0] = min_depth, x[1] = max_depth, z[0..n).
void draw_depths(Rng& rng, double* x, double* z, int n) {
  x[0] = rng.uniform(0.5, 5);
  x[1] = x[0] + rng.uniform(5, 40);
  for (int i = 0; i < n; ++i) z[i] = x[0] + rng.uniform(0.05, 0.95) * (x[1] - x[0]);
}
double draw_gamma(Rng& rng) { return std::exp(rng.uniform(std::log(1e-3), 0.0)); }

// Hits of depth_range_twin.
constexpr int kHits = 4;

// ------------------------------------------------------------------------- camera.h
// A packed camera (camera.h layout): pixel vectors of 0.5 to 2 world units at 45 to 135
// degrees, the film of a 64 x 48 image about the optical axis at the focal length.
void draw_packed_camera(Rng& rng, double* x, bool right_handed) {
  const V ux = random_unit(rng);
  const V uy = unit_at_angle(rng, ux, kPi / 4, 3 * kPi / 4);
  const V pdx = rng.uniform(0.5, 2) * ux, pdy = rng.uniform(0.5, 2) * uy;
  const V z = (right_handed ? -1.0 : 1.0) * normalize(cross(pdy, pdx));
  const double focal = rng.uniform(20, 80);
  put(x + pulsar::kEye, random_vec(rng, -10, 10));
  put(x + pulsar::kP00, focal * z - 31.5 * pdx - 23.5 * pdy + random_vec(rng, -3, 3));
  put(x + pulsar::kPdx, pdx);
  put(x + pulsar::kPdy, pdy);
  x[pulsar::kFocal] = focal;
  x[pulsar::kMinDepth] = rng.uniform(0.1, 1);
  x[pulsar::kMaxDepth] = rng.uniform(10, 50);
}

// load_camera's outputs that carry a gradient, in CameraGrad's flat layout (the layout
// frame_backward reads its gradient in).
void frame_values(const pulsar::CameraFrame<double>& cam, double* y) {
  pulsar::CameraGrad<double> v;
  v.eye = cam.eye;
  v.p00_rel = cam.p00_rel;
  v.pdx = cam.pdx;
  v.pdy = cam.pdy;
  v.z_axis = cam.z_axis;
  v.x_unit = cam.x_unit;
  v.y_unit = cam.y_unit;
  v.min_depth = cam.min_depth;
  v.max_depth = cam.max_depth;
  v.to_array(y);
}

std::string handedness(const double* flag) { return *flag != 0 ? "right_handed" : "left_handed"; }

// pixel_ray's derivative as the backward forms it: the unit ray through normalize_backward
// (perspective) or the film coordinates through the frame's units (orthographic), the
// sensor offset through add_sensor_offset, the frame through frame_backward.
// x = packed camera | column, row, right-handed.
Twin pixel_ray_twin(bool orthographic) {
  Twin tw;
  tw.name = std::string("pixel_ray/pixel_ray/") + (orthographic ? "orthographic" : "perspective");
  tw.n_in = pulsar::CAMERA_PARAMS;
  tw.n_out = orthographic ? 2 : 3;
  tw.n_param = 3;
  tw.n_points = 8;
  tw.step = 1e-4;
  tw.sample = [](Rng& rng, int point, double* x) {
    const bool right_handed = point % 2;
    draw_packed_camera(rng, x, right_handed);
    x[15] = std::floor(rng.uniform(0, 64));
    x[16] = std::floor(rng.uniform(0, 48));
    x[17] = right_handed;
  };
  tw.forward = [orthographic](const double* x, double* y) {
    const auto cam = pulsar::load_camera(x, orthographic, x[17] != 0);
    const pulsar::PixelRay<double> ray = pulsar::pixel_ray(cam, int(x[15]), int(x[16]));
    if (orthographic) {
      y[0] = ray.sx;
      y[1] = ray.sy;
    } else {
      put(y, ray.dir);
    }
  };
  tw.backward = [orthographic](const double* x, const double* g, double* vjp) {
    const auto cam = pulsar::load_camera(x, orthographic, x[17] != 0);
    const V s = cam.sensor_offset(x[15], x[16]);
    pulsar::CameraGrad<double> grad;
    if (orthographic) {  // sx = s . x_unit, sy = s . y_unit
      grad.x_unit = g[0] * s;
      grad.y_unit = g[1] * s;
      grad.add_sensor_offset(g[0] * cam.x_unit + g[1] * cam.y_unit, x[15], x[16]);
    } else {
      grad.add_sensor_offset(pulsar::normalize_backward(s, at(g)), x[15], x[16]);
    }
    pulsar::frame_backward(cam, grad, vjp);
  };
  tw.branch = [](const double* x) { return handedness(x + 17); };
  return tw;
}

// ------------------------------------------------------------------------- camera_params.h
// x = camera vector (length values) | width, height, orthographic, right-handed,
// first_R_then_T, min_depth (0: the focal length's default), max_depth. Point p takes
// the flags from its bits, so that 16 points cover every combination.
pulsar::CameraParamsSpec spec_at(int length, const double* flags) {
  pulsar::CameraParamsSpec spec;
  spec.length = length;
  spec.width = int(flags[0]);
  spec.height = int(flags[1]);
  spec.orthographic = flags[2] != 0;
  spec.right_handed = flags[3] != 0;
  spec.first_R_then_T = flags[4] != 0;
  spec.min_depth = flags[5];
  spec.max_depth = flags[6];
  return spec;
}

template <int Chunk>
Twin camera_params_twin(int length, bool small_angle, const std::string& suffix) {
  Twin tw;
  tw.name = "camera_params/packed_camera_from_params_backward/L" + std::to_string(length) + suffix;
  tw.n_in = length;
  tw.n_out = pulsar::CAMERA_PARAMS;
  tw.n_param = 7;
  tw.n_points = 16;
  // The series branch holds for rotation angles under 1e-4 (drawn under 5e-5): the
  // stencil's 2 steps keep them there. The forward is a polynomial of degree 4 in the
  // rotation vector there, which the fourth-order stencil differentiates exactly.
  tw.step = small_angle ? 1e-5 : 1e-4;
  const bool six_d = length == 11 || length == 13;
  tw.sample = [length, six_d, small_angle](Rng& rng, int point, double* x) {
    const bool orthographic = point & 1, right_handed = point & 2, first_r = point & 4;
    const bool near_default = point & 8;
    put(x, random_vec(rng, -5, 5));
    int k = 3;
    if (six_d) {
      const V a1 = rng.uniform(0.5, 2) * random_unit(rng);
      const V a2 = rng.uniform(0.5, 2) * unit_at_angle(rng, normalize(a1), kPi / 6, 5 * kPi / 6);
      put(x + 3, a1);
      put(x + 6, a2);
      k = 9;
    } else {
      const double angle = small_angle ? rng.uniform(1e-5, 5e-5) : rng.uniform(0.2, 2.8);
      put(x + 3, angle * random_unit(rng));
      k = 6;
    }
    x[k] = orthographic ? 0.0 : rng.uniform(0.5, 3);  // focal length
    x[k + 1] = rng.uniform(1, 5);                      // sensor width
    if (length == 10 || length == 13) {
      x[k + 2] = rng.uniform(-3, 3);  // principal point offsets, pixels
      x[k + 3] = rng.uniform(-3, 3);
    }
    double* flags = x + length;
    flags[0] = 64;
    flags[1] = 48;
    flags[2] = orthographic;
    flags[3] = right_handed;
    flags[4] = first_r;
    flags[5] = near_default ? 0.0 : rng.uniform(0.5, 2);
    flags[6] = 100;
  };
  tw.forward = [length](const double* x, double* y) {
    pulsar::packed_camera_from_params(x, spec_at(length, x + length), y);
  };
  tw.backward = [length](const double* x, const double* g, double* vjp) {
    pulsar::packed_camera_from_params_backward<double, Chunk>(x, spec_at(length, x + length), g, vjp);
  };
  tw.branch = [length, six_d](const double* x) {
    const pulsar::CameraParamsSpec spec = spec_at(length, x + length);
    std::string b = spec.orthographic ? "orthographic" : "perspective";
    b += spec.right_handed ? ",right_handed" : ",left_handed";
    b += spec.first_R_then_T ? ",R_then_T" : ",T_then_R";
    b += spec.min_depth == 0 ? ",near_default" : ",near_given";
    if (!six_d) b += dot(at(x + 3), at(x + 3)) < 1e-8 ? ",series" : ",closed_form";
    return b;
  };
  return tw;
}

}  // namespace

std::vector<Twin> twin_table() {
  std::vector<Twin> table;

  // vec3.h ---------------------------------------------------------------------------
  table.push_back(Twin{"vec3/cross_backward", 6, 3, 0, 8, 1e-4,
                       [](Rng& rng, int, double* x) {
                         put(x, random_vec(rng, -2, 2));
                         put(x + 3, random_vec(rng, -2, 2));
                       },
                       [](const double* x, double* y) { put(y, cross(at(x), at(x + 3))); },
                       [](const double* x, const double* g, double* vjp) {
                         V ga = kStartVec, gb = kStartVec;
                         pulsar::cross_backward(at(x), at(x + 3), at(g), ga, gb);
                         put(vjp, ga - kStartVec);
                         put(vjp + 3, gb - kStartVec);
                       },
                       nullptr});
  table.push_back(
      Twin{"vec3/normalize_backward", 3, 3, 0, 8, 1e-4,
           [](Rng& rng, int, double* x) { put(x, rng.uniform(0.5, 3) * random_unit(rng)); },
           [](const double* x, double* y) { put(y, pulsar::normalize(at(x))); },
           [](const double* x, const double* g, double* vjp) { put(vjp, pulsar::normalize_backward(at(x), at(g))); },
           nullptr});

  // dual.h: every arithmetic rule of Dual ----------------------------------------------
  table.push_back(dual_twin<2>("add", 0, draw_any_any, [](auto in, const double*) { return in[0] + in[1]; }));
  table.push_back(dual_twin<2>("subtract", 0, draw_any_any, [](auto in, const double*) { return in[0] - in[1]; }));
  table.push_back(dual_twin<2>("multiply", 0, draw_any_any, [](auto in, const double*) { return in[0] * in[1]; }));
  table.push_back(dual_twin<2>("divide", 0, draw_any_nonzero, [](auto in, const double*) { return in[0] / in[1]; }));
  table.push_back(dual_twin<1>("negate", 0, draw_any, [](auto in, const double*) { return -in[0]; }));
  table.push_back(dual_twin<2>("add_assign", 0, draw_any_any, [](auto in, const double*) {
    auto a = in[0];
    a += in[1];
    return a;
  }));
  table.push_back(dual_twin<2>("subtract_assign", 0, draw_any_any, [](auto in, const double*) {
    auto a = in[0];
    a -= in[1];
    return a;
  }));
  // Dual and constant: x[0] the dual's value, x[1] the constant.
  table.push_back(dual_twin<1>("add_constant", 1, draw_any_any, [](auto in, const double* s) { return in[0] + s[0]; }));
  table.push_back(dual_twin<1>("constant_add", 1, draw_any_any, [](auto in, const double* s) { return s[0] + in[0]; }));
  table.push_back(
      dual_twin<1>("subtract_constant", 1, draw_any_any, [](auto in, const double* s) { return in[0] - s[0]; }));
  table.push_back(
      dual_twin<1>("constant_subtract", 1, draw_any_any, [](auto in, const double* s) { return s[0] - in[0]; }));
  table.push_back(
      dual_twin<1>("multiply_constant", 1, draw_any_any, [](auto in, const double* s) { return in[0] * s[0]; }));
  table.push_back(
      dual_twin<1>("constant_multiply", 1, draw_any_any, [](auto in, const double* s) { return s[0] * in[0]; }));
  table.push_back(
      dual_twin<1>("divide_constant", 1, draw_any_nonzero, [](auto in, const double* s) { return in[0] / s[0]; }));
  table.push_back(
      dual_twin<1>("constant_divide", 1, draw_nonzero_any, [](auto in, const double* s) { return s[0] / in[0]; }));
  table.push_back(dual_twin<1>("sqrt", 0, draw_positive, [](auto in, const double*) {
    using std::sqrt;
    return sqrt(in[0]);
  }));
  table.push_back(dual_twin<1>("sin", 0, draw_any, [](auto in, const double*) {
    using std::sin;
    return sin(in[0]);
  }));
  table.push_back(dual_twin<1>("cos", 0, draw_any, [](auto in, const double*) {
    using std::cos;
    return cos(in[0]);
  }));

  // intersection.h: each twin on each branch of its forward ------------------------------
  table.push_back(finish_hit_twin("hit", false, true));
  table.push_back(finish_hit_twin("tiny_inside", true, true));
  table.push_back(finish_hit_twin("tiny_outside", true, false));
  table.push_back(perspective_twin("hit", false, true));
  table.push_back(perspective_twin("tiny_inside", true, true));
  table.push_back(perspective_twin("tiny_outside", true, false));
  table.push_back(orthographic_twin("hit_front", OrthoCase::kHitFront));
  table.push_back(orthographic_twin("hit_behind", OrthoCase::kHitBehind));
  table.push_back(orthographic_twin("tiny_inside", OrthoCase::kTinyInside));
  table.push_back(orthographic_twin("tiny_outside", OrthoCase::kTinyOutside));

  // blend.h -----------------------------------------------------------------------------
  // x = z | min_depth, max_depth.
  table.push_back(Twin{
      "blend/normalized_depth_grad", 1, 1, 2, 8, 1e-4, [](Rng& rng, int, double* x) { draw_depths(rng, x + 1, x, 1); },
      [](const double* x, double* y) { y[0] = pulsar::normalized_depth(blend_params(0.1, x[1], x[2]), x[0]); },
      [](const double* x, const double* g, double* vjp) {
        vjp[0] = pulsar::normalized_depth_grad(blend_params(0.1, x[1], x[2]), g[0]);
      },
      nullptr});
  // x = opacity | z, gamma, min_depth, max_depth.
  table.push_back(Twin{"blend/blend_exponent_grad_opacity", 1, 1, 4, 8, 1e-4,
                       [](Rng& rng, int, double* x) {
                         x[0] = rng.uniform(0.05, 1);
                         x[2] = draw_gamma(rng);
                         draw_depths(rng, x + 3, x + 1, 1);
                       },
                       [](const double* x, double* y) {
                         const auto p = blend_params(x[2], x[3], x[4]);
                         y[0] = pulsar::blend_exponent(p, pulsar::blend_exponent_slope(p, x[0]), x[1]);
                       },
                       [](const double* x, const double* g, double* vjp) {
                         vjp[0] = pulsar::blend_exponent_grad_opacity(blend_params(x[2], x[3], x[4]), x[1], g[0]);
                       },
                       nullptr});
  // x = z | opacity, gamma, min_depth, max_depth.
  table.push_back(Twin{"blend/blend_exponent_grad_depth", 1, 1, 4, 8, 1e-4,
                       [](Rng& rng, int, double* x) {
                         x[1] = rng.uniform(0.05, 1);
                         x[2] = draw_gamma(rng);
                         draw_depths(rng, x + 3, x, 1);
                       },
                       [](const double* x, double* y) {
                         const auto p = blend_params(x[2], x[3], x[4]);
                         y[0] = pulsar::blend_exponent(p, pulsar::blend_exponent_slope(p, x[1]), x[0]);
                       },
                       [](const double* x, const double* g, double* vjp) {
                         const auto p = blend_params(x[2], x[3], x[4]);
                         vjp[0] = pulsar::blend_exponent_grad_depth(pulsar::blend_exponent_slope(p, x[1]), g[0]);
                       },
                       nullptr});
  // The depth range's terms of kHits normalised depths: x = min_depth, max_depth | z[kHits].
  table.push_back(Twin{"blend/DepthRangeSums/normalized_depth", 2, kHits, kHits, 8, 1e-4,
                       [](Rng& rng, int, double* x) { draw_depths(rng, x, x + 2, kHits); },
                       [](const double* x, double* y) {
                         const auto p = blend_params(0.1, x[0], x[1]);
                         for (int i = 0; i < kHits; ++i) y[i] = pulsar::normalized_depth(p, x[2 + i]);
                       },
                       [](const double* x, const double* g, double* vjp) {
                         const auto p = blend_params(0.1, x[0], x[1]);
                         pulsar::DepthRangeSums<double> sums;
                         for (int i = 0; i < kHits; ++i) sums.add(pulsar::normalized_depth_grad(p, g[i]), x[2 + i]);
                         double grad_min = kStart, grad_max = kStart;
                         sums.finish(p, grad_min, grad_max);
                         vjp[0] = grad_min - kStart;
                         vjp[1] = grad_max - kStart;
                       },
                       nullptr});
  // The depth range's terms of kHits exponents (through their dL/dz, as the backward adds
  // them): x = min_depth, max_depth | z[kHits], opacity[kHits], gamma.
  table.push_back(Twin{"blend/DepthRangeSums/blend_exponent", 2, kHits, 2 * kHits + 1, 8, 1e-4,
                       [](Rng& rng, int, double* x) {
                         draw_depths(rng, x, x + 2, kHits);
                         for (int i = 0; i < kHits; ++i) x[2 + kHits + i] = rng.uniform(0.05, 1);
                         x[2 + 2 * kHits] = draw_gamma(rng);
                       },
                       [](const double* x, double* y) {
                         const auto p = blend_params(x[2 + 2 * kHits], x[0], x[1]);
                         for (int i = 0; i < kHits; ++i)
                           y[i] =
                               pulsar::blend_exponent(p, pulsar::blend_exponent_slope(p, x[2 + kHits + i]), x[2 + i]);
                       },
                       [](const double* x, const double* g, double* vjp) {
                         const auto p = blend_params(x[2 + 2 * kHits], x[0], x[1]);
                         pulsar::DepthRangeSums<double> sums;
                         for (int i = 0; i < kHits; ++i) {
                           const double slope = pulsar::blend_exponent_slope(p, x[2 + kHits + i]);
                           sums.add(pulsar::blend_exponent_grad_depth(slope, g[i]), x[2 + i]);
                         }
                         double grad_min = kStart, grad_max = kStart;
                         sums.finish(p, grad_min, grad_max);
                         vjp[0] = grad_min - kStart;
                         vjp[1] = grad_max - kStart;
                       },
                       nullptr});
  // The depth statistics (DepthStats) of kHits hits, accumulated in a shuffled order of
  // weights: x = the hits' weights w | their normalised depths n (weight_grad), or x = n |
  // w (depth_grad). f = (mean, variance); the twins give dL/dw_i = weight_grad(n_i) / W_h
  // and dL/dn_i = b_i depth_grad(n_i), b_i = w_i / W_h.
  for (const bool by_depth : {false, true}) {
    table.push_back(Twin{
        by_depth ? "blend/depth_grad" : "blend/weight_grad", kHits, 2, kHits, 8, 1e-5,
        [by_depth](Rng& rng, int, double* x) {
          double* w = by_depth ? x + kHits : x;
          double* n = by_depth ? x : x + kHits;
          for (int i = 0; i < kHits; ++i) {
            w[i] = std::exp(rng.uniform(-3, 1));  // weights relative to exp(m): some above 1
            n[i] = rng.uniform(-0.2, 1.2);        // past either end of the depth range too
          }
        },
        [by_depth](const double* x, double* y) {
          const double* w = by_depth ? x + kHits : x;
          const double* n = by_depth ? x : x + kHits;
          pulsar::DepthStats<double> stats;
          for (int i = 0; i < kHits; ++i) stats.add(w[i], n[i]);
          y[0] = stats.mean + stats.mean_low;
          y[1] = stats.variance();
        },
        [by_depth](const double* x, const double* g, double* vjp) {
          const double* w = by_depth ? x + kHits : x;
          const double* n = by_depth ? x : x + kHits;
          pulsar::DepthStats<double> stats;
          for (int i = 0; i < kHits; ++i) stats.add(w[i], n[i]);
          const pulsar::DepthStatsGrad<double> grad{stats.mean, stats.mean_low, stats.variance(), g[0], g[1]};
          for (int i = 0; i < kHits; ++i)
            vjp[i] = by_depth ? w[i] / stats.weight * grad.depth_grad(n[i]) : grad.weight_grad(n[i]) / stats.weight;
        },
        nullptr});
  }

  // camera.h ----------------------------------------------------------------------------
  // load_camera's frame: x = packed camera | right-handed (alternating by point).
  table.push_back(Twin{"camera/frame_backward", pulsar::CAMERA_PARAMS, pulsar::CameraGrad<double>::kValues, 1, 8, 1e-4,
                       [](Rng& rng, int point, double* x) {
                         draw_packed_camera(rng, x, point % 2);
                         x[15] = point % 2;
                       },
                       [](const double* x, double* y) { frame_values(pulsar::load_camera(x, false, x[15] != 0), y); },
                       [](const double* x, const double* g, double* vjp) {
                         const auto cam = pulsar::load_camera(x, false, x[15] != 0);
                         pulsar::frame_backward(cam, pulsar::CameraGrad<double>::from_array(g), vjp);
                       },
                       [](const double* x) { return handedness(x + 15); }});
  // The sensor point of pixel (i, j): x = p00_rel, pdx, pdy | i, j.
  table.push_back(Twin{"camera/add_sensor_offset", 9, 3, 2, 8, 1e-4,
                       [](Rng& rng, int, double* x) {
                         for (int k = 0; k < 9; ++k) x[k] = rng.uniform(-2, 2);
                         x[9] = std::floor(rng.uniform(0, 64));
                         x[10] = std::floor(rng.uniform(0, 48));
                       },
                       [](const double* x, double* y) {
                         pulsar::CameraFrame<double> cam{};
                         cam.p00_rel = at(x);
                         cam.pdx = at(x + 3);
                         cam.pdy = at(x + 6);
                         put(y, cam.sensor_offset(x[9], x[10]));
                       },
                       [](const double* x, const double* g, double* vjp) {
                         pulsar::CameraGrad<double> grad;
                         grad.p00_rel = grad.pdx = grad.pdy = kStartVec;
                         grad.add_sensor_offset(at(g), x[9], x[10]);
                         put(vjp, grad.p00_rel - kStartVec);
                         put(vjp + 3, grad.pdx - kStartVec);
                         put(vjp + 6, grad.pdy - kStartVec);
                       },
                       nullptr});

  // pixel_ray.h -------------------------------------------------------------------------
  table.push_back(pixel_ray_twin(false));
  table.push_back(pixel_ray_twin(true));

  // camera_params.h: every camera vector length; the small-angle series; the chunked runs
  // (the CUDA backward's one tangent per run, and a chunk that splits the vector).
  table.push_back(camera_params_twin<pulsar::kMaxCameraParams>(8, false, ""));
  table.push_back(camera_params_twin<pulsar::kMaxCameraParams>(10, false, ""));
  table.push_back(camera_params_twin<pulsar::kMaxCameraParams>(11, false, ""));
  table.push_back(camera_params_twin<pulsar::kMaxCameraParams>(13, false, ""));
  table.push_back(camera_params_twin<pulsar::kMaxCameraParams>(8, true, "_small_angle"));
  table.push_back(camera_params_twin<pulsar::kMaxCameraParams>(10, true, "_small_angle"));
  table.push_back(camera_params_twin<1>(13, false, "_chunk1"));
  table.push_back(camera_params_twin<4>(10, false, "_chunk4"));
  return table;
}

}  // namespace twins
