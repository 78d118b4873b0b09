// A value one thread publishes whole and other threads read whole: a
// model thread's stats snapshot, read by Info RPCs and metrics without
// touching the model. Thread-safe.
//
//   Published<Snapshot> snapshot_;
//   snapshot_.Set(s);                  // model thread, after each step
//   Snapshot now = snapshot_.Get();    // any thread
#ifndef DEDIT_BASE_PUBLISHED_H_
#define DEDIT_BASE_PUBLISHED_H_

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dedit {

template <typename T>
class Published {
 public:
  Published() = default;
  explicit Published(T value) : value_(std::move(value)) {}

  void Set(T value) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    value_ = std::move(value);
  }
  T Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return value_;
  }

 private:
  mutable absl::Mutex mu_;
  T value_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dedit

#endif  // DEDIT_BASE_PUBLISHED_H_
