// A minimal 3-vector for host and device code, with the derivative twins of the few
// nonlinear vector functions the renderer uses (norm, normalize, cross).
#pragma once

#include <cmath>

#include "pulsar/hd.h"

namespace pulsar {

template <typename T>
struct Vec3 {
  T x, y, z;
};

template <typename T>
PULSAR_HD Vec3<T> make_vec3(T x, T y, T z) {
  return Vec3<T>{x, y, z};
}
template <typename T>
PULSAR_HD Vec3<T> load_vec3(const T* p) {
  return Vec3<T>{p[0], p[1], p[2]};
}
template <typename T>
PULSAR_HD void store_vec3(T* p, Vec3<T> v) {
  p[0] = v.x;
  p[1] = v.y;
  p[2] = v.z;
}

template <typename T>
PULSAR_HD Vec3<T> operator+(Vec3<T> a, Vec3<T> b) {
  return {a.x + b.x, a.y + b.y, a.z + b.z};
}
template <typename T>
PULSAR_HD Vec3<T> operator-(Vec3<T> a, Vec3<T> b) {
  return {a.x - b.x, a.y - b.y, a.z - b.z};
}
template <typename T>
PULSAR_HD Vec3<T> operator-(Vec3<T> a) {
  return {-a.x, -a.y, -a.z};
}
template <typename T>
PULSAR_HD Vec3<T> operator*(T s, Vec3<T> a) {
  return {s * a.x, s * a.y, s * a.z};
}
template <typename T>
PULSAR_HD Vec3<T>& operator+=(Vec3<T>& a, Vec3<T> b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  return a;
}
template <typename T>
PULSAR_HD Vec3<T>& operator-=(Vec3<T>& a, Vec3<T> b) {
  a.x -= b.x;
  a.y -= b.y;
  a.z -= b.z;
  return a;
}

template <typename T>
PULSAR_HD T dot(Vec3<T> a, Vec3<T> b) {
  return a.x * b.x + a.y * b.y + a.z * b.z;
}
template <typename T>
PULSAR_HD Vec3<T> cross(Vec3<T> a, Vec3<T> b) {
  return {a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x};
}
template <typename T>
PULSAR_HD T norm(Vec3<T> a) {
  return std::sqrt(dot(a, a));
}

// cross(a, b) backward: given g = dL/d(a x b), dL/da = b x g and dL/db = g x a.
template <typename T>
PULSAR_HD void cross_backward(Vec3<T> a, Vec3<T> b, Vec3<T> g, Vec3<T>& grad_a, Vec3<T>& grad_b) {
  grad_a += cross(b, g);
  grad_b += cross(g, a);
}

// n = v / |v|.
template <typename T>
PULSAR_HD Vec3<T> normalize(Vec3<T> v) {
  return (T(1) / norm(v)) * v;
}

// normalize backward from the unit vector n = v / |v| and inv_len = 1 / |v|:
// dL/dv = (g - (g.n) n) / |v|. A caller holding n and 1 / |v| (a pixel's ray, whose
// length the CUDA backward stages once per pixel) pays 9 operations per use.
template <typename T>
PULSAR_HD Vec3<T> unit_vector_backward(Vec3<T> n, T inv_len, Vec3<T> g) {
  return inv_len * (g - dot(g, n) * n);
}

// normalize backward: dL/dv = (g - (g.n) n) / |v|, with n = v / |v|.
template <typename T>
PULSAR_HD Vec3<T> normalize_backward(Vec3<T> v, Vec3<T> g) {
  const T inv_len = T(1) / norm(v);
  return unit_vector_backward(inv_len * v, inv_len, g);
}

}  // namespace pulsar
