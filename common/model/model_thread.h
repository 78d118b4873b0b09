// The thread that owns a model in a service (docs/ARCHITECTURE.md §7), as
// the target and drafter workers share it. RPC reactions queue work under
// mu_ and return; the thread (ModelThreadScope, WarmUp(), then Run()) takes
// the work and answers through callbacks with no lock held.
//
// A subclass declares its own queues ABSL_GUARDED_BY(mu_), swaps them out
// (with new_releases_) in Run(), answers what is left when Run() returns,
// and calls Stop() in its destructor, before its own members go.
//
// Warm-up and poisoning (docs/ARCHITECTURE.md, "Health"):
//   - WarmUp() runs one small forward on the thread before Run(); a server
//     turns its health SERVING only once AwaitWarmUp() returned OK.
//   - A model call that fails with a sticky device error
//     (IsStickyDeviceError, common/model/torch_status.h) poisons the worker
//     (NoteModelError): from then on every call fails at once with
//     poisoned(), INTERNAL naming the original error, no forward runs after
//     the step that hit it (only bookkeeping such as dropping sequences),
//     and the poison listener (health → NOT_SERVING) is told once. A failed
//     warm-up poisons it too, whatever the error.
//
//   class DrafterWorker : public ModelThread {
//     absl::Status WarmUp() override { ... one small draft ... }
//     void Run() override { while (TakeWork(inbox)) { ... } }
//   };
//   worker.SetPoisonListener([&](const absl::Status& s) { ... });
//   worker.Start();
//   RETURN_IF_ERROR(worker.AwaitWarmUp());  ...  worker.Stop();
#ifndef DEDIT_MODEL_MODEL_THREAD_H_
#define DEDIT_MODEL_MODEL_THREAD_H_

#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/draft.h"

namespace dedit {

// Drop these sequences; `done` (may be empty) hears how many existed.
using SequenceReleaseDone = std::function<void(int released)>;
struct SequenceReleaseJob {
  std::vector<SequenceId> sequences;
  SequenceReleaseDone done;
};

// Told once, with no lock held, that the worker is poisoned (on the
// thread that noted the error: the model thread); gets poisoned(). Must
// not block or call back into the worker.
using PoisonListener = std::function<void(const absl::Status& poisoned)>;

class ModelThread {
 public:
  ModelThread(const ModelThread&) = delete;
  ModelThread& operator=(const ModelThread&) = delete;
  virtual ~ModelThread();

  // REQUIRES: before Start().
  void SetPoisonListener(PoisonListener listener) {
    poison_listener_ = std::move(listener);
  }

  // Starts the thread: ModelThreadScope(cpu_threads), WarmUp(), then Run().
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Tells Run() to return and joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until WarmUp() has run on the thread; its status (an error
  // means the worker is poisoned, with "warm-up forward failed: <error>").
  // FAILED_PRECONDITION before Start().
  absl::Status AwaitWarmUp() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether WarmUp() has finished, successfully.
  bool warmed_up() const ABSL_LOCKS_EXCLUDED(mu_);
  // OK while the worker is sound; once poisoned, the INTERNAL error that
  // every call now fails with (naming the original error).
  absl::Status poisoned() const ABSL_LOCKS_EXCLUDED(mu_);

  // Queued for the model thread; answered with 0 at once when stopping or
  // poisoned.
  void Release(std::vector<SequenceId> sequences, SequenceReleaseDone done)
      ABSL_LOCKS_EXCLUDED(mu_);

 protected:
  explicit ModelThread(int cpu_threads) : cpu_threads_(cpu_threads) {}

  // One small forward through the whole model (add a dummy sequence, run
  // it, drop it), on the thread, before Run(): CUDA/cuBLAS initialization
  // and the first-call costs happen here, and a broken device shows before
  // the server reports SERVING. Nothing may stay behind in the model.
  virtual absl::Status WarmUp() = 0;
  // The thread's body: take work until stopping_, then answer what is left.
  // Once poisoned, answer work with poisoned() without running the model.
  virtual void Run() = 0;

  // An error a model call returned (any thread; the model thread in
  // practice). A sticky device error (an INTERNAL status with
  // IsStickyDeviceError) poisons the worker; anything else is ignored.
  void NoteModelError(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Same, for ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) code: poisoned().
  absl::Status PoisonedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return poison_;
  }

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<SequenceReleaseJob> new_releases_ ABSL_GUARDED_BY(mu_);

 private:
  void Poison(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  const int cpu_threads_;
  PoisonListener poison_listener_;  // set before Start(), then read-only
  std::thread thread_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> warm_up_ ABSL_GUARDED_BY(mu_);
  absl::Status poison_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dedit

#endif  // DEDIT_MODEL_MODEL_THREAD_H_
