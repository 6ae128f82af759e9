// parallel_for over [0, n) with dynamic scheduling on std::threads. Work items are
// claimed from an atomic counter; the first exception thrown by any worker is rethrown
// on the calling thread after all workers have stopped.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace pulsar {

inline int resolve_thread_count(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

// fn(item, worker): worker in [0, threads) identifies per-thread scratch.
template <typename Fn>
void parallel_for(int threads, std::int64_t n, Fn&& fn) {
  if (n <= 0) return;
  const int workers = int(std::min<std::int64_t>(threads, n));
  if (workers <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&](int worker) {
    try {
      for (std::int64_t i = next++; i < n && !failed; i = next++) fn(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace pulsar
