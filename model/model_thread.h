// The thread that owns a model in a service (docs/ARCHITECTURE.md §7), as
// the target and drafter workers share it. RPC reactions queue work under
// mu_ and return; the thread (ModelThreadScope, then Run()) takes the work
// and answers through callbacks with no lock held.
//
// A subclass declares its own queues ABSL_GUARDED_BY(mu_), swaps them out
// (with new_releases_) in Run(), answers what is left when Run() returns,
// and calls Stop() in its destructor, before its own members go.
//
//   class DrafterWorker : public ModelThread {
//     void Run() override { while (TakeWork(inbox)) { ... } }
//   };
//   worker.Start();  ...  worker.Stop();
#ifndef DEDIT_MODEL_MODEL_THREAD_H_
#define DEDIT_MODEL_MODEL_THREAD_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/draft.h"

namespace dedit {

// Drop these sequences; `done` (may be empty) hears how many existed.
using SequenceReleaseDone = std::function<void(int released)>;
struct SequenceReleaseJob {
  std::vector<SequenceId> sequences;
  SequenceReleaseDone done;
};

class ModelThread {
 public:
  ModelThread(const ModelThread&) = delete;
  ModelThread& operator=(const ModelThread&) = delete;
  virtual ~ModelThread();

  // Starts the thread: ModelThreadScope(cpu_threads), then Run().
  void Start();
  // Tells Run() to return and joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Queued for the model thread; answered with 0 at once when stopping.
  void Release(std::vector<SequenceId> sequences, SequenceReleaseDone done)
      ABSL_LOCKS_EXCLUDED(mu_);

 protected:
  explicit ModelThread(int cpu_threads) : cpu_threads_(cpu_threads) {}

  // The thread's body: take work until stopping_, then answer what is left.
  virtual void Run() = 0;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<SequenceReleaseJob> new_releases_ ABSL_GUARDED_BY(mu_);

 private:
  const int cpu_threads_;
  std::thread thread_;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_MODEL_THREAD_H_
