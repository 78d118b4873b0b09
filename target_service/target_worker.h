// The target's model thread: continuous batching of prefill chunks and
// verify blocks from every RPC into packed Qwen3Model forwards (docs/ARCHITECTURE.md
// §3), per-sequence sampling state, KV admission control, and the hand-off
// of committed tokens' context features to the drafter.
//
// Scheduling, once per forward:
//   1. releases are applied first (they free KV capacity);
//   2. new prefills are admitted or refused (RESOURCE_EXHAUSTED, see below);
//   3. every queued verify block goes in whole (decode latency first), then
//      prefill chunks fill what is left of `max_batch_tokens`, oldest
//      prompt first; a long prompt is prefilled over several forwards;
//   4. after the forward, verify blocks are accepted/truncated, and the
//      committed rows' features are published in sequence order before any
//      RPC is answered, so the drafter receives context before the router
//      can ask for a draft that needs it.
//
// Admission control refuses instead of queueing: the router advances all
// sequences in lock-step rounds, so a prefill parked in the target until KV
// frees up would stall every other request's round behind it (and could
// deadlock: only those rounds free KV). A refused prompt fails alone with
// RESOURCE_EXHAUSTED, which clients treat as "retry later". Each prefill
// reserves its whole life (prompt + max new tokens + one window), so an
// admitted sequence never runs out of KV mid-generation.
//
//   TargetWorker worker(std::move(model), &context_stream, observer, opts);
//   worker.Start();
//   worker.Verify(items, [](absl::StatusOr<std::vector<VerifyOutcome>> r) {
//     ... answer the RPC ...
//   });
//
// Thread-safe: Prefill/Verify/Release/snapshot may be called from any
// thread; the callbacks run on the model thread and must not block.
#ifndef DEDIT_TARGET_SERVICE_TARGET_WORKER_H_
#define DEDIT_TARGET_SERVICE_TARGET_WORKER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/qwen3_model.h"
#include "engine/round_interfaces.h"
#include "model/context_sink.h"
#include "model/sampling.h"

namespace dedit {

// Where committed features go (the context stream to the drafter).
class ContextPublisher : public ContextSink {
 public:
  // The sequence is gone from the target; sent after all of its context.
  virtual void OnRelease(SequenceId sequence) = 0;
};

struct TargetWorkerOptions {
  int max_batch_tokens = 2048;      // tokens per forward (>= the largest W)
  // How long a forward may wait for the announced companion of a queued
  // call (a round's Prefill and Verify travel as two RPCs). Everything that
  // queues while a forward runs joins the next one anyway.
  int64_t max_batch_wait_us = 2000;
  int64_t kv_capacity_tokens = 1 << 20;
  // libtorch CPU threads of the model thread (0 = libtorch's default).
  // OpenMP's thread count is per calling thread, so it is set there.
  int cpu_threads = 0;
};

// One forward, for metrics.
struct TargetForwardStats {
  int segments = 0;        // sequences in the forward
  int tokens = 0;
  double seconds = 0;
  int64_t cached_tokens = 0;
  int64_t kv_capacity_tokens = 0;
};

struct TargetPrefillItem {
  PrefillWork work;
  int64_t reserve_tokens = 0;  // KV tokens reserved for the sequence's life
};

class TargetWorker {
 public:
  using PrefillDone =
      std::function<void(std::vector<absl::StatusOr<int32_t>> first_tokens)>;
  using VerifyDone =
      std::function<void(absl::StatusOr<std::vector<VerifyOutcome>>)>;
  using ReleaseDone = std::function<void(int released)>;
  using ForwardObserver = std::function<void(const TargetForwardStats&)>;

  struct Snapshot {
    int num_sequences = 0;
    int64_t cached_tokens = 0;
    int64_t reserved_tokens = 0;
    int64_t kv_capacity_tokens = 0;
  };

  // `publisher` and `observer` may be null/empty.
  TargetWorker(std::unique_ptr<Qwen3Model> model, ContextPublisher* publisher,
               ForwardObserver observer, TargetWorkerOptions options);
  ~TargetWorker();  // Stop()s

  const Qwen3Config& config() const { return model_->config(); }
  const Qwen3Model& model() const { return *model_; }

  void Start();
  // Answers queued work with UNAVAILABLE and joins the model thread.
  void Stop();

  // Per item: the first sampled token, or why the prompt was refused.
  // `with_verify`: the client sent a Verify call together with this one;
  // the next forward waits (bounded) for it so that both share it.
  void Prefill(std::vector<TargetPrefillItem> items, PrefillDone done,
               bool with_verify = false);
  // All-or-nothing: one bad item fails the call (it means a router bug or
  // a target restart, not a user error).
  void Verify(std::vector<VerifyWork> items, VerifyDone done,
              bool with_prefill = false);
  void Release(std::vector<SequenceId> sequences, ReleaseDone done);

  Snapshot snapshot() const;

 private:
  struct PrefillJob {
    std::vector<TargetPrefillItem> items;
    bool with_verify = false;
    PrefillDone done;
    std::vector<absl::StatusOr<int32_t>> results;
    int remaining = 0;
  };
  struct VerifyJob {
    std::vector<VerifyWork> items;
    VerifyDone done;
    bool with_prefill = false;
  };
  struct ReleaseJob {
    std::vector<SequenceId> sequences;
    ReleaseDone done;
  };
  // A prompt being prefilled, possibly over several forwards.
  struct PrefillProgress {
    std::shared_ptr<PrefillJob> job;
    size_t item = 0;
    int64_t done_tokens = 0;
  };
  struct SequenceState {
    std::unique_ptr<TokenSampler> sampler;
    int64_t reserved_tokens = 0;
  };

  void Run();
  bool HasQueuedWork() const;  // REQUIRES mu_
  bool CompanionMissing() const;  // REQUIRES mu_
  void ApplyReleases(std::vector<ReleaseJob>& jobs);
  void AdmitPrefills(std::vector<std::shared_ptr<PrefillJob>>& jobs);
  absl::Status CheckVerify(const VerifyJob& job) const;
  void RunForward(std::vector<VerifyJob>& verifies);
  void FinishPrefill(PrefillProgress& p, absl::StatusOr<int32_t> result);
  void DropSequence(SequenceId id);
  void PublishSnapshot();

  std::unique_ptr<Qwen3Model> model_;  // model thread only
  ContextPublisher* publisher_;
  ForwardObserver observer_;
  TargetWorkerOptions options_;

  // Model-thread state.
  std::unordered_map<SequenceId, SequenceState> sequences_;
  std::deque<PrefillProgress> prefilling_;
  int64_t reserved_tokens_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                                 // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<PrefillJob>> new_prefills_;  // GUARDED_BY(mu_)
  std::vector<VerifyJob> new_verifies_;                   // GUARDED_BY(mu_)
  std::vector<ReleaseJob> new_releases_;                  // GUARDED_BY(mu_)
  Snapshot snapshot_;                                     // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace dedit

#endif  // DEDIT_TARGET_SERVICE_TARGET_WORKER_H_
