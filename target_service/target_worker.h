// The target's model thread: continuous batching of prefill chunks and
// verify blocks from every RPC into packed Qwen3Model forwards
// (docs/ARCHITECTURE.md §3), per-sequence sampling state, KV admission
// control, and the hand-off of committed tokens' context features to the
// drafter.
//
// Two classes:
//   - TargetBatcher owns the model and every sequence's state and runs one
//     scheduling step as five named steps (below). It is thread-compatible:
//     the model thread (or a test) drives it.
//   - TargetWorker is the thread around it: RPC threads enqueue work, the
//     model thread swaps the queues out under the lock and runs
//     TargetBatcher::Step without it.
//
// Before any step, WarmUp() runs one small prefill forward of a dummy
// sequence (TargetWorker: on the model thread, before health turns
// SERVING; common/model/model_thread.h), and a call answered with a sticky
// device error poisons the worker: every later call fails with INTERNAL.
//
// One step (TargetBatcher::Step):
//   1. ApplyReleases: releases first (they free KV capacity); a prompt
//      still being prefilled is answered CANCELLED;
//   2. AdmitPrefills: new prompts are admitted or refused
//      (RESOURCE_EXHAUSTED, INVALID_ARGUMENT, ALREADY_EXISTS; see below);
//   3. PlanForward: every verify call that checks out goes in whole (decode
//      latency first), then prefill chunks fill what is left of
//      `max_batch_tokens`, oldest prompt first; a long prompt is prefilled
//      over several forwards;
//   4. RunPlan: the packed forward, reported to the observer;
//   5. CommitPlan: verify blocks are accepted and truncated, prefill chunks
//      committed (common/model/verify_commit.h), and the committed rows'
//      features published in segment order before any RPC of the forward is
//      answered, so the drafter receives context before the router can ask
//      for a draft that needs it.
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
// TargetWorker is thread-safe: Prefill/Verify/Release/snapshot may be called
// from any thread; the callbacks run on the model thread, with no lock
// held, and must not block.
#ifndef DEDIT_TARGET_SERVICE_TARGET_WORKER_H_
#define DEDIT_TARGET_SERVICE_TARGET_WORKER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/published.h"
#include "common/engine/round_interfaces.h"
#include "common/model/context_sink.h"
#include "common/model/model_thread.h"
#include "common/model/qwen3_model.h"
#include "common/model/sampling.h"

namespace dedit {

// Where committed features go (the context stream to the drafter).
class ContextPublisher : public ContextSink {
 public:
  // The sequence is gone from the target; sent after all of its context.
  virtual void OnRelease(SequenceId sequence) = 0;
};

struct TargetWorkerOptions {
  int max_batch_tokens = 2048;  // tokens per forward (>= the largest W)
  // How long a forward may wait for the announced companion of a queued
  // call (a round's Prefill and Verify travel as two RPCs). Everything that
  // queues while a forward runs joins the next one anyway.
  int64_t max_batch_wait_us = 2000;
  // After a step, how long the model thread polls for the next call before
  // it sleeps (common/base/spin_wait.h). 0: it sleeps at once.
  int64_t idle_spin_us = 0;
  int64_t kv_capacity_tokens = 1 << 20;
  // A sequence that no call names for this long is released as if its
  // router had asked (KV freed, the drafter told): a router that crashed
  // or lost its stack never frees its sequences itself. Every
  // Prefill, Verify and Step naming a sequence renews its lease, and
  // KeepAlive renews it without a forward (idle multi-turn sessions).
  // A prompt still being prefilled never expires. Zero: never.
  absl::Duration sequence_lease = absl::ZeroDuration();
  // libtorch CPU threads of the model thread (0 = libtorch's default).
  // OpenMP's thread count is per calling thread, so it is set there.
  int cpu_threads = 0;
  // Test seam, empty in production: runs on the model thread before every
  // model forward (the warm-up's included); a non-OK status fails that
  // forward as if the model had returned it, e.g. a sticky
  // "libtorch: CUDA error: ..." to poison the worker.
  std::function<absl::Status()> before_forward_for_test;
};

// One forward, for metrics.
struct TargetForwardStats {
  int segments = 0;  // sequences in the forward
  int tokens = 0;
  double seconds = 0;
  int64_t cached_tokens = 0;
  int64_t kv_capacity_tokens = 0;
};

struct TargetPrefillItem {
  PrefillWork work;
  int64_t reserve_tokens = 0;  // KV tokens reserved for the sequence's life
};

// Per item: the first sampled token, or why the prompt was refused.
using TargetPrefillDone =
    std::function<void(std::vector<absl::StatusOr<int32_t>> first_tokens)>;
using TargetVerifyDone =
    std::function<void(absl::StatusOr<std::vector<VerifyOutcome>>)>;
using TargetReleaseDone = SequenceReleaseDone;
using TargetForwardObserver = std::function<void(const TargetForwardStats&)>;

// Work handed from an RPC to the model thread; `done` is called exactly once.
struct TargetPrefillJob {
  std::vector<TargetPrefillItem> items;
  TargetPrefillDone done;
  // The client sent a Verify call together with this one (round_calls = 2).
  bool with_verify = false;
};
// All-or-nothing: one bad item fails the call (it means a router bug or a
// target restart, not a user error).
struct TargetVerifyJob {
  std::vector<VerifyWork> items;
  TargetVerifyDone done;
  bool with_prefill = false;  // the Prefill call of the same round follows
};
using TargetReleaseJob = SequenceReleaseJob;

// KeepIdle's answer: the ids that no longer exist.
using TargetKeepIdleDone = std::function<void(std::vector<SequenceId> missing)>;
struct TargetKeepIdleJob {
  std::vector<SequenceId> sequences;
  TargetKeepIdleDone done;  // may be empty
};

struct TargetWorkerSnapshot {
  int num_sequences = 0;
  int64_t cached_tokens = 0;
  int64_t reserved_tokens = 0;
  int64_t kv_capacity_tokens = 0;
  // Since the worker started: sequences released because their lease ran
  // out (a counter for metrics).
  int64_t expired_sequences = 0;
  // KV bytes the cached tokens take, and the bytes the pool holds for them
  // (slots, slack and parked copies).
  int64_t kv_bytes_in_use = 0;
  int64_t kv_bytes_held = 0;
  int idle_sequences = 0;          // sessions kept between turns
  int64_t idle_cached_tokens = 0;  // their KV tokens
  int64_t evicted_sequences = 0;   // idle ones evicted for room, in all
};

// Renew the leases of these sequences; `done` hears the ones that do not
// exist (any more).
using TargetKeepAliveDone =
    std::function<void(std::vector<SequenceId> missing)>;
struct TargetKeepAliveJob {
  std::vector<SequenceId> sequences;
  TargetKeepAliveDone done;
};

// One forward's work, chosen by TargetBatcher::PlanForward. `segments` holds
// the blocks of `verifies` (items in call order) first, then one segment per
// entry of `chunks`.
struct TargetForwardPlan {
  // `length` prompt tokens of `sequence` at positions start..; `last` when
  // they end the prompt (the forward then asks for the logits of its final
  // row, and committing it samples the first token).
  struct Chunk {
    SequenceId sequence = 0;
    int64_t start = 0;
    int64_t length = 0;
    bool last = false;
  };
  // Verify calls refused before the forward, with why; CommitPlan answers
  // them.
  std::vector<std::pair<TargetVerifyJob, absl::Status>> refused;
  std::vector<TargetVerifyJob> verifies;
  std::vector<Chunk> chunks;
  std::vector<TargetSegment> segments;
  int tokens = 0;
};

// The model thread's state and the steps of one scheduling round (see the
// file comment). Thread-compatible. Every callback of a job runs inside the
// step that answers it. `publisher` may be null and `observer` empty.
class TargetBatcher {
 public:
  TargetBatcher(std::unique_ptr<Qwen3Model> model, ContextPublisher* publisher,
                TargetForwardObserver observer, TargetWorkerOptions options);

  // Its config() and options() are immutable and may be read from any
  // thread; everything else about the model is the driving thread's.
  const Qwen3Model& model() const { return *model_; }

  // A prefill forward of a few tokens of a dummy sequence that is dropped
  // again (the worker runs it before serving, common/model/model_thread.h); the
  // logits are copied back and must be finite. Nothing else is changed;
  // the observer is not told (it feeds the serving metrics).
  absl::Status WarmUp();

  // Leases first (RenewLeases, then ExpireLeases at `now`), then steps
  // 1-5 in order. A step with no work only expires leases.
  void Step(std::vector<TargetReleaseJob> releases,
            std::vector<TargetPrefillJob> prefills,
            std::vector<TargetVerifyJob> verifies,
            std::vector<TargetKeepAliveJob> keep_alives = {},
            absl::Time now = absl::Now());

  // Renews the named sequences' leases to `now` and answers each job with
  // the ones that do not exist.
  void RenewLeases(std::vector<TargetKeepAliveJob> jobs, absl::Time now);
  // Releases every sequence whose lease ran out by `now` (not those still
  // prefilling), as ApplyReleases would; returns how many. Nothing with a
  // zero options().sequence_lease.
  int ExpireLeases(absl::Time now);

  const TargetWorkerOptions& options() const { return options_; }

  // Step 1. Drops the sequences (KV, sampler, reservation; the publisher is
  // told OnRelease) and answers each job with how many existed.
  void ApplyReleases(std::vector<TargetReleaseJob> jobs);
  // Sessions (docs/ARCHITECTURE.md §8): marks the sequences idle, kept
  // between turns. An idle sequence reserves only its cached tokens and is
  // evicted, least recently used first, when a prompt needs the room; a
  // continuation (PrefillWork::start > 0) makes it active again. Sequences
  // still prefilling are left as they are. Run before AdmitPrefills; renews
  // the leases of the sequences named to `now`.
  void ApplyKeepIdle(std::vector<TargetKeepIdleJob> jobs,
                     absl::Time now = absl::Now());
  // Step 2. Admitted prompts wait in the prefill queue; a job whose items
  // were all refused is answered at once. A continuation (work.start > 0)
  // truncates its sequence's KV to `start` tokens, replaces the sampler and
  // the reservation, and prefills the prompt after them; it is NOT_FOUND
  // when the sequence does not exist (any more). When the reservations
  // would exceed the capacity, idle sequences are evicted first (least
  // recently used first; the publisher is told OnRelease), if that makes
  // enough room.
  void AdmitPrefills(std::vector<TargetPrefillJob> jobs);
  // Step 3. Checks the verify calls (unknown sequence: NOT_FOUND; start not
  // the cached length or still prefilling: FAILED_PRECONDITION; bad block or
  // a sequence in two calls: INVALID_ARGUMENT) and packs the forward. An
  // empty plan (no segments) is valid.
  TargetForwardPlan PlanForward(std::vector<TargetVerifyJob> verifies);
  // Step 4. Runs the plan's forward (nothing for an empty plan) and reports
  // it to the observer.
  absl::StatusOr<TargetForwardResult> RunPlan(const TargetForwardPlan& plan);
  // Step 5. REQUIRES: `forward` is RunPlan(plan) and no step ran in between.
  // Answers the refused calls; commits every verify block and prefill chunk
  // (common/model/verify_commit.h), publishing their features in segment order;
  // then answers the plan's verify calls and every prefill call it
  // completed. A failed forward fails the plan's verify calls, and its
  // chunks' prompts (those sequences are dropped). A verify call whose
  // commit fails is answered with that error; its sequences stay, for the
  // router to release.
  void CommitPlan(TargetForwardPlan plan,
                  const absl::StatusOr<TargetForwardResult>& forward);

  // Answers every prompt still being prefilled with `status` (shutdown).
  void CancelPrefills(const absl::Status& status);

  bool has_prefills() const { return !prefilling_.empty(); }
  TargetWorkerSnapshot snapshot() const;

 private:
  // A prefill call: the per-item answers it collects.
  struct PrefillCall {
    TargetPrefillJob job;
    std::vector<absl::StatusOr<int32_t>> results;
    int remaining = 0;
  };
  // A prompt being prefilled, possibly over several forwards.
  struct PrefillProgress {
    std::shared_ptr<PrefillCall> call;
    size_t item = 0;
    int64_t done_tokens = 0;
    const PrefillWork& work() const { return call->job.items[item].work; }
  };
  struct SequenceState {
    std::unique_ptr<TokenSampler> sampler;
    int64_t reserved_tokens = 0;
    bool idle = false;         // kept between turns (ApplyKeepIdle)
    uint64_t idle_since = 0;   // idle_tick_ when it became idle (LRU order)
    absl::Time lease_renewed;  // the last call that named the sequence
    // Its context features go to the drafter (PrefillWork::context, fixed
    // when the sequence is created).
    bool context = true;
  };
  // publisher_ for a sequence that feeds the drafter, else null.
  ContextPublisher* PublisherFor(SequenceId id) const;

  // model_->Forward, after the before_forward_for_test seam.
  absl::StatusOr<TargetForwardResult> Forward(
      const std::vector<TargetSegment>& segments);
  absl::Status CheckPrompt(const TargetPrefillItem& item) const;
  // Admits one checked item (reserving `reserve`), or says why not.
  absl::Status AdmitItem(const TargetPrefillItem& item, int64_t reserve);
  // Evicts idle sequences other than `keep`, least recently idle first,
  // until `need` more tokens fit; evicts nothing when even all of them
  // would not make room. Returns whether `need` fits now.
  bool MakeRoom(int64_t need, SequenceId keep);
  absl::Status CheckVerify(const TargetVerifyJob& job) const;
  // PlanForward's halves: the verify calls that check out go in whole (the
  // rest into plan.refused); then prefill chunks, oldest prompt first, up
  // to max_batch_tokens in all.
  void PlanVerifyBlocks(std::vector<TargetVerifyJob> verifies,
                        TargetForwardPlan& plan) const;
  void PlanPrefillChunks(TargetForwardPlan& plan) const;
  std::deque<PrefillProgress>::iterator FindPrefill(SequenceId id);
  std::deque<PrefillProgress>::const_iterator FindPrefill(SequenceId id) const;
  absl::StatusOr<std::vector<VerifyOutcome>> CommitVerifyCall(
      const TargetVerifyJob& job, size_t first_segment,
      const TargetForwardResult& out);
  // Records `result` for `p`'s item (an error drops the sequence); returns
  // the call when that was its last open item, for the caller to answer.
  std::shared_ptr<PrefillCall> FinishPrefill(const PrefillProgress& p,
                                             absl::StatusOr<int32_t> result);
  static void Answer(PrefillCall& call);
  void DropSequence(SequenceId id);

  std::unique_ptr<Qwen3Model> model_;
  ContextPublisher* publisher_;
  TargetForwardObserver observer_;
  TargetWorkerOptions options_;
  std::unordered_map<SequenceId, SequenceState> sequences_;
  std::deque<PrefillProgress> prefilling_;  // oldest first
  int64_t reserved_tokens_ = 0;
  uint64_t idle_tick_ = 0;
  int64_t evicted_ = 0;
  int64_t expired_sequences_ = 0;
  // The `now` of the step running (for the leases its calls renew).
  absl::Time step_time_ = absl::InfinitePast();
};

// The model thread around a TargetBatcher (see the file comment).
class TargetWorker : public ModelThread {
 public:
  using PrefillDone = TargetPrefillDone;
  using VerifyDone = TargetVerifyDone;
  using ReleaseDone = TargetReleaseDone;
  using KeepAliveDone = TargetKeepAliveDone;
  using ForwardObserver = TargetForwardObserver;
  using Snapshot = TargetWorkerSnapshot;

  // `publisher` may be null and `observer` empty.
  TargetWorker(std::unique_ptr<Qwen3Model> model, ContextPublisher* publisher,
               ForwardObserver observer, TargetWorkerOptions options);
  ~TargetWorker() override;  // Stop()s

  const Qwen3Config& config() const { return batcher_.model().config(); }
  const Qwen3Model& model() const { return batcher_.model(); }
  absl::Duration sequence_lease() const { return options_.sequence_lease; }

  // Start(), Stop(), Release(), AwaitWarmUp() and poisoned() are
  // ModelThread's: the thread runs TargetBatcher::WarmUp() first. Stop()
  // answers queued calls and prompts still being prefilled with UNAVAILABLE
  // (queued releases with 0) and joins the model thread. Once poisoned
  // (a call was answered with a sticky device error), calls and prompts
  // still being prefilled are answered with poisoned() instead, at once.

  // `with_verify`: the client sent a Verify call together with this one;
  // the next forward waits (bounded) for it so that both share it.
  void Prefill(std::vector<TargetPrefillItem> items, PrefillDone done,
               bool with_verify = false) ABSL_LOCKS_EXCLUDED(mu_);
  // All-or-nothing (TargetVerifyJob).
  void Verify(std::vector<VerifyWork> items, VerifyDone done,
              bool with_prefill = false) ABSL_LOCKS_EXCLUDED(mu_);
  // A whole round at once (the Step RPC): both jobs are queued together,
  // so they share the next forward without waiting for a companion. An
  // empty side is skipped and its callback not called.
  void Step(std::vector<TargetPrefillItem> prefills, PrefillDone prefill_done,
            std::vector<VerifyWork> verifies, VerifyDone verify_done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Renews the sequences' leases (TargetWorkerOptions::sequence_lease)
  // without a forward; `done` hears the ids that do not exist (all of them
  // when the worker is stopping or poisoned).
  void KeepAlive(std::vector<SequenceId> sequences, KeepAliveDone done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sessions: marks the sequences idle between turns
  // (TargetBatcher::ApplyKeepIdle); `done` (may be empty) gets the ids that
  // no longer exist. Answered with every id when stopping or poisoned.
  void KeepIdle(std::vector<SequenceId> sequences, TargetKeepIdleDone done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // As of the end of the last step.
  Snapshot snapshot() const { return snapshot_.Get(); }

  // Called on the model thread with every snapshot published, i.e. after
  // every step, also one that only released sequences: gauges such as KV
  // usage follow releases, not only forwards.
  // REQUIRES: before Start().
  void SetSnapshotListener(std::function<void(const Snapshot&)> listener) {
    snapshot_listener_ = std::move(listener);
  }

 private:
  struct Inbox {
    std::vector<TargetReleaseJob> releases;
    std::vector<TargetKeepIdleJob> idles;
    std::vector<TargetPrefillJob> prefills;
    std::vector<TargetVerifyJob> verifies;
    std::vector<TargetKeepAliveJob> keep_alives;
  };

  absl::Status WarmUp() override { return batcher_.WarmUp(); }
  void Run() override;
  // Waits for work (at most max_batch_wait_us more for an announced
  // companion call) and swaps the queues into `inbox`; false when stopping.
  bool TakeWork(Inbox& inbox) ABSL_LOCKS_EXCLUDED(mu_);
  // Answers everything in `inbox` with `status` (releases with 0).
  static void FailInbox(Inbox& inbox, const absl::Status& status);
  // Why a new call is refused at once (poisoned, then stopping), or OK.
  absl::Status RefusalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `done`, after every error it is given went to NoteModelError.
  PrefillDone NotingErrors(PrefillDone done);
  VerifyDone NotingErrors(VerifyDone done);
  // Queues the jobs given, together (one lock), or answers them with the
  // refusal when the worker takes no work.
  void Enqueue(std::optional<TargetPrefillJob> prefill,
               std::optional<TargetVerifyJob> verify) ABSL_LOCKS_EXCLUDED(mu_);
  bool HasQueuedWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CompanionMissing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishSnapshot() ABSL_LOCKS_EXCLUDED(mu_);

  TargetBatcher batcher_;  // model thread only, but for model() (immutable)
  const TargetWorkerOptions options_;

  std::vector<TargetKeepIdleJob> new_idles_ ABSL_GUARDED_BY(mu_);
  std::vector<TargetPrefillJob> new_prefills_ ABSL_GUARDED_BY(mu_);
  std::vector<TargetVerifyJob> new_verifies_ ABSL_GUARDED_BY(mu_);
  std::vector<TargetKeepAliveJob> new_keep_alives_ ABSL_GUARDED_BY(mu_);
  Published<Snapshot> snapshot_;
  std::function<void(const Snapshot&)> snapshot_listener_;
};

}  // namespace dedit

#endif  // DEDIT_TARGET_SERVICE_TARGET_WORKER_H_
