// Polls for work for a bounded time before a thread sleeps on its queue.
//
// A model thread that sleeps (absl::Mutex::Await, a futex) between rounds
// is woken by the RPC thread that queues the next call: on a virtual
// machine whose idle vCPU halts, that wake-up is a large part of what the
// services add to a target-only round on the bundled pair
// (docs/log/2026-12-06-bench-notebook.md, "Idle spin"). Polling for a few
// hundred microseconds after each step keeps the core awake while the next
// round is on its way, at the price of that core while the service is idle.
//
//   SpinUntilReady(mu_, absl::Microseconds(spin_us), ready);  // mu_ free
//   absl::MutexLock lock(&mu_);
//   mu_.Await(absl::Condition(&ready));  // at once if the spin saw work
#ifndef DEDIT_BASE_SPIN_WAIT_H_
#define DEDIT_BASE_SPIN_WAIT_H_

#include <chrono>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dedit {

// Calls `ready` with `mu` held (taken with TryLock, so the producers that
// queue work under `mu` are never made to wait behind the poller) until
// it returns true or `spin` has passed, yielding the CPU between tries;
// the caller then waits on `mu` as it would have, which returns at once
// when the spin saw work. `spin` <= 0 returns at once. Call it without `mu`
// held.
template <typename Ready>
void SpinUntilReady(absl::Mutex& mu, absl::Duration spin, Ready ready)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {  // `ready` reads state `mu` guards
  if (spin <= absl::ZeroDuration()) return;
  const auto until =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
  while (std::chrono::steady_clock::now() < until) {
    if (mu.TryLock()) {
      const bool is_ready = ready();
      mu.Unlock();
      if (is_ready) return;
    }
    std::this_thread::yield();
  }
}

}  // namespace dedit

#endif  // DEDIT_BASE_SPIN_WAIT_H_
