// The drafter's model thread (docs/ARCHITECTURE.md §3): applies the context
// features streamed by the target, and serves Draft requests batched across
// sequences and RPCs with one DEditDrafter::Draft call (P1..PK).
//
// A draft whose context has not arrived yet (DraftRequest.start beyond the
// sequence's context length) waits, up to `context_wait_ms`, for the
// stream to deliver it: the router asks for the next draft as soon as the
// target answers Verify, and the features of the tokens it just committed
// are still on the wire. Past the bound the item fails with UNAVAILABLE
// (the router then decodes that request target-only).
//
// Context with a gap (a chunk whose start is not the sequence's length,
// e.g. after the stream reconnected) drops the sequence: a drafter must
// never draft from incomplete context.
//
//   DrafterWorker worker(std::move(drafter), observer, options);
//   worker.Start();
//   worker.AddContext(seq, 0, features);       // from the context stream
//   worker.Draft(requests, [](std::vector<absl::StatusOr<DraftResult>> r) {});
//
// Before any work the model thread runs a warm-up (WarmUp(): a dummy
// sequence, a few tokens of zero context, one draft pass, dropped again;
// health turns SERVING only after it, common/model/model_thread.h). A Draft
// answered with a sticky device error poisons the worker: every later call
// fails with INTERNAL naming that error.
//
// Thread-safe; callbacks run on the model thread, with no lock held, and
// must not block.
#ifndef DEDIT_DRAFTER_SERVICE_DRAFTER_WORKER_H_
#define DEDIT_DRAFTER_SERVICE_DRAFTER_WORKER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/published.h"
#include "common/model/dedit_drafter.h"
#include "common/model/model_thread.h"

namespace dedit {

struct DrafterWorkerOptions {
  int64_t max_batch_wait_us = 0;  // gather more Draft RPCs (see main.cc)
  int64_t context_wait_ms = 500;  // bounded wait for missing context
  // After a forward, how long the model thread polls for the next call
  // before it sleeps (common/base/spin_wait.h). 0: it sleeps at once.
  int64_t idle_spin_us = 0;
  int max_passes = 8;  // largest K served
  // A sequence neither fed nor drafted for this long (a session between
  // turns) is parked: its context leaves the pool's slots for a copy of its
  // own tokens (common/model/kv_pool.h). 0: never.
  int64_t park_idle_ms = 2000;
  // Draft items per batched forward (0 = all that are ready). Items beyond
  // it wait for the next forward, chosen round-robin across callers, so a
  // caller flooding the drafter with items gets an equal share of each
  // forward, not all of it: the others' drafts still arrive in time.
  int max_batch_sequences = 256;
  // libtorch CPU threads of the model thread (0 = default; OpenMP's count
  // is per calling thread, so it is set there).
  int cpu_threads = 0;
  // Test seam, empty in production: runs on the model thread before every
  // DEditDrafter::Draft call (the warm-up's included); a non-OK status
  // fails that call as if the drafter had returned it, e.g. a sticky
  // "libtorch: CUDA error: ..." to poison the worker.
  std::function<absl::Status()> before_forward_for_test;
};

// One batched Draft call, for metrics.
struct DrafterBatchStats {
  int sequences = 0;
  int max_passes = 0;
  double seconds = 0;
  int64_t context_tokens = 0;  // over all sequences, after the call
  // One entry per Draft job whose first item this call drafts: seconds from
  // the job reaching the worker to the model thread's first look at it
  // (the model thread was busy), and from that look to the job's context
  // being there (its features were still on the target's stream).
  std::vector<double> queue_wait_seconds;
  std::vector<double> context_wait_seconds;
};

class DrafterWorker : public ModelThread {
 public:
  using DraftDone =
      std::function<void(std::vector<absl::StatusOr<DraftResult>>)>;
  using ReleaseDone = SequenceReleaseDone;
  using BatchObserver = std::function<void(const DrafterBatchStats&)>;

  struct Snapshot {
    int num_sequences = 0;
    int64_t context_tokens = 0;
    // Context KV bytes the tokens take, and what the pool holds for them.
    int64_t kv_bytes_in_use = 0;
    int64_t kv_bytes_held = 0;
    // Since start: contexts dropped because the stream that fed them ended.
    int64_t orphaned_contexts = 0;
  };

  DrafterWorker(std::unique_ptr<DEditDrafter> drafter, BatchObserver observer,
                DrafterWorkerOptions options);
  ~DrafterWorker() override;

  const DrafterConfig& config() const { return drafter_->config(); }
  // Context positions a sequence may hold: the target's max context.
  int64_t max_context_tokens() const { return drafter_->max_context_tokens(); }
  const DrafterWorkerOptions& options() const { return options_; }

  // Start(), Stop(), Release() (answers how many of the sequences had
  // context), AwaitWarmUp() and poisoned() are ModelThread's. Stop()
  // answers waiting drafts with UNAVAILABLE (queued releases with 0) and
  // joins. Once poisoned, drafts are answered with poisoned() at once and
  // context is dropped.

  // Context stream events, applied in arrival order (dropped once stopping).
  // `stream` names the context stream the event came on (any id unique
  // among the worker's streams); a sequence belongs to the stream that last
  // fed it.
  void AddContext(SequenceId sequence, int64_t start, at::Tensor features,
                  uint64_t stream = 0) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseFromStream(SequenceId sequence) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream ended (the target restarted, crashed or lost the
  // connection): the sequences it fed are dropped. Their target either is
  // gone, with its KV, or lost context chunks while disconnected, and
  // release markers sent meanwhile are lost too: keeping them would leak.
  // A live target's sequences then draft with NOT_FOUND/DATA_LOSS and
  // decode target-only: speed lost, never correctness.
  void EndStream(uint64_t stream) ABSL_LOCKS_EXCLUDED(mu_);

  // Per request: the K passes, or why not (see the file comment).
  // `caller` names who asked (the RPC's peer): ready items are shared out
  // round-robin across callers (DrafterWorkerOptions::max_batch_sequences).
  void Draft(std::vector<DraftRequest> requests, DraftDone done,
             std::string caller = "") ABSL_LOCKS_EXCLUDED(mu_);

  // As of the end of the model thread's last pass.
  Snapshot snapshot() const { return snapshot_.Get(); }

  // Called on the model thread with every snapshot published (after every
  // pass, also one that only applied context or releases), so that gauges
  // follow releases. REQUIRES: before Start().
  void SetSnapshotListener(std::function<void(const Snapshot&)> listener) {
    snapshot_listener_ = std::move(listener);
  }

 private:
  struct ContextEvent {
    SequenceId sequence = 0;
    int64_t start = 0;
    at::Tensor features;  // undefined for a release
    bool release = false;
    uint64_t stream = 0;
    bool end_stream = false;  // drop every sequence `stream` fed
  };
  struct DraftJob {
    std::vector<DraftRequest> requests;
    DraftDone done;
    std::chrono::steady_clock::time_point context_deadline;
    // For DrafterBatchStats: when the job reached the worker and when the
    // model thread first looked at it; once ready, its queue and context
    // waits in seconds, until the batch that drafts its first item reports
    // them.
    std::chrono::steady_clock::time_point arrived;
    std::optional<std::chrono::steady_clock::time_point> first_look;
    std::optional<std::pair<double, double>> waits;
    // Per item: unset = waiting for context; otherwise OK (ready) or error.
    std::vector<std::optional<absl::Status>> state;
    std::string caller;
    // Once ready: per item, its answer (set for failed items at once and
    // for drafted ones after their forward); `undrafted` items are left.
    std::vector<std::optional<absl::StatusOr<DraftResult>>> results;
    size_t undrafted = 0;
  };
  using ReleaseJob = SequenceReleaseJob;

  struct Inbox {
    std::deque<ContextEvent> context;
    std::vector<DraftJob> drafts;
    std::vector<ReleaseJob> releases;
  };

  absl::Status WarmUp() override;
  void Run() override;
  // Answers every draft in `inbox` and waiting_ with `status`, releases
  // with 0; drops the context events.
  void FailAll(Inbox& inbox, const absl::Status& status);
  // DEditDrafter::Draft after the before_forward_for_test seam; an error
  // goes to NoteModelError.
  absl::StatusOr<std::vector<DraftResult>> RunDraft(
      const std::vector<DraftRequest>& batch);
  // Waits for work (or until the earliest waiting draft's context deadline;
  // at most max_batch_wait_us more for further Draft calls) and swaps the
  // queues into `inbox`; false when stopping.
  bool TakeWork(Inbox& inbox) ABSL_LOCKS_EXCLUDED(mu_);
  bool HasQueuedWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `event` in arrival order. The context events taken together
  // queue their appends in `queue`, made in one DEditDrafter::AppendContexts
  // call (a round's chunks of every sequence, and a sequence's chunks that
  // arrived together); an event that changes a sequence with queued chunks
  // flushes the queue first.
  void ApplyContext(ContextEvent& event, ContextQueue& queue);
  void FlushContext(ContextQueue& queue);
  // A sequence whose context cannot be trusted: dropped, its drafts fail.
  void BreakSequence(SequenceId id);
  void ApplyReleases(std::vector<ReleaseJob>& jobs);
  void RemoveSequence(SequenceId id);
  // Resolves items whose context is there (or whose wait ran out);
  // returns whether the whole job is resolved.
  bool Resolve(DraftJob& job, std::chrono::steady_clock::time_point now);
  absl::Status CheckRequest(const DraftRequest& r) const;
  // Moves a resolved job to ready_ (its failed items answered in it).
  void MakeReady(DraftJob job, std::chrono::steady_clock::time_point now);
  // One batched forward over at most max_batch_sequences undrafted items
  // of ready_, taken round-robin across callers; answers every job it
  // completes.
  void RunFairBatch();
  // Parks the sequences idle for park_idle_ms (last_used_), and gives the
  // next time one falls due.
  void ParkIdle(std::chrono::steady_clock::time_point now);
  std::optional<std::chrono::steady_clock::time_point> NextParking() const;
  void PublishSnapshot() ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<DEditDrafter> drafter_;  // model thread only
  BatchObserver observer_;
  DrafterWorkerOptions options_;
  std::vector<DraftJob> waiting_;  // model thread only
  std::deque<DraftJob> ready_;     // model thread only, oldest first
  size_t next_caller_ = 0;         // round-robin start, model thread only
  // Sequences whose context has a gap; their drafts fail at once.
  std::unordered_set<SequenceId> broken_;  // model thread only
  // The stream that last fed each sequence (also broken ones).
  std::unordered_map<SequenceId, uint64_t> owner_;  // model thread only
  int64_t orphaned_contexts_ = 0;                   // model thread only
  // When each resident sequence was last fed or drafted (parked ones are
  // not here until used again); model thread only.
  std::unordered_map<SequenceId, std::chrono::steady_clock::time_point>
      last_used_;

  std::deque<ContextEvent> new_context_ ABSL_GUARDED_BY(mu_);
  std::vector<DraftJob> new_drafts_ ABSL_GUARDED_BY(mu_);
  Published<Snapshot> snapshot_;
  std::function<void(const Snapshot&)> snapshot_listener_;
};

}  // namespace dedit

#endif  // DEDIT_DRAFTER_SERVICE_DRAFTER_WORKER_H_
