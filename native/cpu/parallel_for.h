// parallel_for over [0, n) with dynamic scheduling on std::threads. Work items are
// claimed from an atomic counter; the first exception thrown by any worker is rethrown
// on the calling thread after all workers have stopped. Every thread that was started is
// joined before parallel_for returns or throws, whatever failed: a thread that cannot be
// created, a work item, or the caller's interrupt check.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "../core/errors.h"
#include "pulsar/renderer.h"

namespace pulsar {

inline int resolve_thread_count(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

// How a CPU stage runs: its thread count and the call's interrupt check
// (RenderOptions::interrupt_requested; null: none).
struct Workers {
  int threads = 1;
  const std::function<bool()>* interrupt = nullptr;
};

// The interval at which worker 0 (the calling thread) asks the interrupt check between
// work items: a call stops within this plus the longest work item.
constexpr std::chrono::milliseconds kInterruptPollInterval{50};

// Polls an interrupt check at most every kInterruptPollInterval; throws Interrupted when
// it asks the call to stop.
class InterruptPoll {
 public:
  explicit InterruptPoll(const std::function<bool()>* check)
      : check_(check != nullptr && *check ? check : nullptr), last_(clock::now()) {}
  void operator()() {
    if (check_ == nullptr) return;
    const clock::time_point now = clock::now();
    if (now - last_ < kInterruptPollInterval) return;
    if ((*check_)()) throw Interrupted();
    last_ = clock::now();  // the check's own time (it may wait for the interpreter) not counted
  }

 private:
  using clock = std::chrono::steady_clock;
  const std::function<bool()>* check_;
  clock::time_point last_;
};

// fn(item, worker): worker in [0, threads) identifies per-thread scratch. Worker 0 is the
// calling thread; it alone polls the interrupt check.
template <typename Fn>
void parallel_for(const Workers& workers_in, std::int64_t n, Fn&& fn) {
  if (n <= 0) return;
  InterruptPoll poll(workers_in.interrupt);
  const int workers = int(std::min<std::int64_t>(workers_in.threads, n));
  if (workers <= 1) {
    for (std::int64_t i = 0; i < n; ++i) {
      poll();
      fn(i, 0);
    }
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&](int worker) {
    try {
      for (std::int64_t i = next++; i < n && !failed; i = next++) {
        if (worker == 0) poll();
        fn(i, worker);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  try {
    pool.reserve(workers - 1);
    for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  } catch (const std::exception& start_error) {
    // The threads that did start stop at their next item; none may outlive this frame.
    failed = true;
    for (auto& t : pool) t.join();
    throw std::runtime_error(concat("pulsar: creating CPU worker thread ", pool.size() + 1, " of ", workers - 1,
                                    " failed (", start_error.what(),
                                    "); lower num_threads or raise the process's thread or memory limits"));
  }
  work(0);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace pulsar
