// A forward-mode dual number: a value and N tangents (directional derivatives).
//
// Why: small conversions written once as templates over the scalar type (e.g. the
// camera vector's conversion to the packed camera, camera_params.h) get their exact
// Jacobian by running the same code with S = Dual<T, N>, seeded with one unit tangent per
// input. The derivative then sits beside the function and cannot drift from it.
//
// The value part of every operation is computed exactly as for plain T, so a Dual run
// reproduces the plain run's values bit for bit. Comparisons are not overloaded: code
// that branches compares `.v` (or value_of(x), which works for T and Dual alike).
#pragma once

#include <cmath>

#include "pulsar/hd.h"

namespace pulsar {

template <typename T, int N>
struct Dual {
  T v;     // value
  T d[N];  // d[k] = d(value) / d(input k)

  PULSAR_HD Dual() : v(0) {
    for (int k = 0; k < N; ++k) d[k] = T(0);
  }
  // A constant: zero tangents. Implicit so that T constants mix with duals.
  PULSAR_HD Dual(T value) : v(value) {  // NOLINT(google-explicit-constructor)
    for (int k = 0; k < N; ++k) d[k] = T(0);
  }
};

// The scalar type under S: T for T, T for Dual<T, N>.
template <typename S>
struct ScalarOf {
  using type = S;
};
template <typename T, int N>
struct ScalarOf<Dual<T, N>> {
  using type = T;
};

// The value of a plain scalar or a dual, for comparisons in code templated on S.
template <typename T>
PULSAR_HD T value_of(T x) {
  return x;
}
template <typename T, int N>
PULSAR_HD T value_of(const Dual<T, N>& x) {
  return x.v;
}

// ---------------------------------------------------------------- dual (op) dual
template <typename T, int N>
PULSAR_HD Dual<T, N> operator+(const Dual<T, N>& a, const Dual<T, N>& b) {
  Dual<T, N> r;
  r.v = a.v + b.v;
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] + b.d[k];
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator-(const Dual<T, N>& a, const Dual<T, N>& b) {
  Dual<T, N> r;
  r.v = a.v - b.v;
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] - b.d[k];
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator*(const Dual<T, N>& a, const Dual<T, N>& b) {
  Dual<T, N> r;
  r.v = a.v * b.v;
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] * b.v + a.v * b.d[k];
  return r;
}
// (a / b)' = (a' - (a / b) b') / b.
template <typename T, int N>
PULSAR_HD Dual<T, N> operator/(const Dual<T, N>& a, const Dual<T, N>& b) {
  Dual<T, N> r;
  r.v = a.v / b.v;
  for (int k = 0; k < N; ++k) r.d[k] = (a.d[k] - r.v * b.d[k]) / b.v;
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator-(const Dual<T, N>& a) {
  Dual<T, N> r;
  r.v = -a.v;
  for (int k = 0; k < N; ++k) r.d[k] = -a.d[k];
  return r;
}

// ---------------------------------------------------------------- dual (op) scalar
template <typename T, int N>
PULSAR_HD Dual<T, N> operator+(const Dual<T, N>& a, T s) {
  Dual<T, N> r = a;
  r.v = a.v + s;
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator+(T s, const Dual<T, N>& a) {
  Dual<T, N> r = a;
  r.v = s + a.v;
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator-(const Dual<T, N>& a, T s) {
  Dual<T, N> r = a;
  r.v = a.v - s;
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator-(T s, const Dual<T, N>& a) {
  Dual<T, N> r;
  r.v = s - a.v;
  for (int k = 0; k < N; ++k) r.d[k] = -a.d[k];
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator*(const Dual<T, N>& a, T s) {
  Dual<T, N> r;
  r.v = a.v * s;
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] * s;
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator*(T s, const Dual<T, N>& a) {
  Dual<T, N> r;
  r.v = s * a.v;
  for (int k = 0; k < N; ++k) r.d[k] = s * a.d[k];
  return r;
}
template <typename T, int N>
PULSAR_HD Dual<T, N> operator/(const Dual<T, N>& a, T s) {
  Dual<T, N> r;
  r.v = a.v / s;
  for (int k = 0; k < N; ++k) r.d[k] = a.d[k] / s;
  return r;
}
// (s / a)' = -(s / a) a' / a.
template <typename T, int N>
PULSAR_HD Dual<T, N> operator/(T s, const Dual<T, N>& a) {
  Dual<T, N> r;
  r.v = s / a.v;
  for (int k = 0; k < N; ++k) r.d[k] = -r.v * a.d[k] / a.v;
  return r;
}

template <typename T, int N>
PULSAR_HD Dual<T, N>& operator+=(Dual<T, N>& a, const Dual<T, N>& b) {
  return a = a + b;
}
template <typename T, int N>
PULSAR_HD Dual<T, N>& operator-=(Dual<T, N>& a, const Dual<T, N>& b) {
  return a = a - b;
}

// ---------------------------------------------------------------- functions (found by ADL)
// f(a) for a scalar function f with value f(a.v) and slope f'(a.v): the chain rule.
template <typename T, int N>
PULSAR_HD Dual<T, N> chain(const Dual<T, N>& a, T value, T slope) {
  Dual<T, N> r;
  r.v = value;
  for (int k = 0; k < N; ++k) r.d[k] = slope * a.d[k];
  return r;
}
// sqrt(x)' = x' / (2 sqrt(x)): infinite at x = 0, where callers must not differentiate.
template <typename T, int N>
PULSAR_HD Dual<T, N> sqrt(const Dual<T, N>& a) {
  using std::sqrt;
  const T root = sqrt(a.v);
  return chain(a, root, T(0.5) / root);
}
template <typename T, int N>
PULSAR_HD Dual<T, N> sin(const Dual<T, N>& a) {
  using std::cos;
  using std::sin;
  return chain(a, T(sin(a.v)), T(cos(a.v)));
}
template <typename T, int N>
PULSAR_HD Dual<T, N> cos(const Dual<T, N>& a) {
  using std::cos;
  using std::sin;
  return chain(a, T(cos(a.v)), T(-sin(a.v)));
}

}  // namespace pulsar
