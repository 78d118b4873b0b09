// The router's engine thread: one SpeculativeEngine over the target and
// drafter (RouterBackends: the gRPC clients in the router, in-process
// backends in tests), fed by Generate streams through a thread-safe queue.
//
// Each loop iteration admits queued requests (target-only when the drafter
// is not healthy), applies cancellations and expired deadlines, runs one
// round for every running request (Step), and completes finished requests.
// Tokens reach a request's GenerationSink from the engine's token callback:
// detokenized incrementally, cut at stop strings (text that could still
// become a stop string is held back), with TTFT/ITL metrics. The last
// message of a successful request carries finished, the finish and stop
// reasons, usage and the acceptance statistics; a failed, cancelled or
// expired request ends with the status alone.
//
//   RouterBackends backends{&verifier, &verifier, &drafter, &drafter};
//   GenerationLoop loop(backends, tokenizer, registry, options);
//   loop.Start();
//   loop.Submit(std::move(request));   // from a reactor; never blocks
//   loop.Cancel(sink);                 // client went away
//
// Failure containment: a request that fails because the target is
// unreachable (UNAVAILABLE: the round failed or its stream broke), out of
// KV (RESOURCE_EXHAUSTED) or the loop is retired, is offered to
// Options::reroute (StackSet: another stack, or the same one once it is
// back) instead of failing, whether or not it has streamed tokens: its
// StreamProgress goes with it, and the stack that takes it prefills the
// prompt and every emitted token and continues (router/stream_progress.h).
// A round whose target call fails with UNAVAILABLE (the whole step or one
// prompt) marks the target unreachable: queued requests are offered to
// `reroute` (or refused) until an Info probe, every target_info_retry_ms,
// answers.
//
// Thread-safe: Submit/Cancel/CountRejected/served_model/running/load/
// reachable from any thread. The backends are driven by the loop thread only;
// sinks are called on it (and on the submitting thread when the loop is
// stopping), never under the loop's lock.
#ifndef DEDIT_ROUTER_GENERATION_LOOP_H_
#define DEDIT_ROUTER_GENERATION_LOOP_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/speculative_engine.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "dedit/v1/generation.pb.h"
#include "router/router_backends.h"
#include "router/router_metrics.h"
#include "router/stream_progress.h"

namespace dedit {

// The receiving end of one Generate stream (implemented over a gRPC
// reactor). Called on the loop thread; must not block.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void Send(v1::GenerateResponse response) = 0;
  // Ends the stream: OK after the final message, or an error.
  virtual void Finish(const absl::Status& status) = 0;
  // True once the client went away (thread-safe). Checked at admission, so
  // that a cancel that raced a reroute to another stack is not lost.
  virtual bool client_gone() const { return false; }
};

// How a session turn ended, for the session (docs/ARCHITECTURE.md §8).
struct TurnEnd {
  uint64_t loop = 0;    // GenerationLoop::serial() of the loop it ran in
  SequenceId kept = 0;  // the sequence kept there for the next turn; 0 = none
  int64_t reused_tokens = 0;  // prompt tokens whose KV was reused
  bool cache_lost = false;  // the kept KV was gone: the prompt was re-prefilled
};

// A validated, tokenized request (see request_builder.h).
struct RouterRequest {
  GenerationRequest engine;  // prompt ids, sampling, W, K, stop ids
  bool speculate = true;     // false → target-only whatever the drafter
  std::vector<std::string> stop_strings;
  std::chrono::system_clock::time_point deadline =
      std::chrono::system_clock::time_point::max();
  std::chrono::steady_clock::time_point arrival;
  std::shared_ptr<GenerationSink> sink;
  // Stacks that failed this request (StackSet: it does not go back to one
  // while another takes it).
  std::vector<std::string> tried_stacks;
  // Stacks that failed it as unreachable (StackSet::Options::max_moves);
  // a refusal for KV room, where it queues, does not count.
  int moves = 0;
  // What its client has received; set at admission (null before), carried
  // when the request moves to another stack mid-stream.
  std::shared_ptr<StreamProgress> stream;
  // Sessions: a turn (engine.keep set). Its sequence stays in the engine
  // when it ends; engine.continue_sequence names the sequence kept by the
  // previous turn in the loop `pinned_loop` (any other loop ignores it).
  // A cancelled turn ends with a final message (FINISH_REASON_CANCELLED),
  // not a status. `on_turn_end` runs on the loop thread before the final
  // message (not for a turn that ends with an error status).
  bool session_turn = false;
  uint64_t pinned_loop = 0;
  std::function<void(const TurnEnd&)> on_turn_end;
};

// What the router serves, as learned from the services (ListModels/Info).
struct ServedModel {
  bool ready = false;  // target reached at least once
  std::string name;
  int vocab_size = 0;
  int64_t max_context = 0;
  std::vector<int32_t> eos_token_ids;
};

// KV tokens to reserve on the target for a sequence's whole life
// (docs/ARCHITECTURE.md §3 "Admission control"): the prompt, every token it
// may generate and one verify block of `window`, but never more than the
// `max_context` positions a sequence can ever hold — the engine ends a
// request at the context limit and shrinks its last blocks to fit, so a
// large max_tokens must not make the reservation exceed what is usable.
int64_t KvReservationTokens(int64_t prompt_tokens, int64_t max_new_tokens,
                            int window, int64_t max_context);

class GenerationLoop {
 public:
  struct Options {
    std::string model_name;  // empty → the target's
    int max_tokens_limit = 4096;
    int max_passes = 8;
    int64_t target_info_retry_ms = 500;
    // Prompt tokens admitted per round (at least one request always is):
    // they all travel in that round's one Step message, so this keeps the
    // message under the target's receive limit (--max_receive_bytes;
    // docs/SERVICES.md). The rest wait for the next round, in order.
    int64_t max_prefill_tokens_per_round = int64_t{1} << 20;
    // How each round's block is chosen (common/engine/speculation_options.h).
    // The n-gram method needs no drafter service: requests that ask for it
    // speculate whatever the drafter's health.
    SpeculationOptions speculation;
    // Names this loop's stack in the per-stack metrics (`stack` label);
    // empty → no per-stack metrics.
    std::string stack_name;
    // Offered, on the loop thread, each request that failed with `status`
    // (UNAVAILABLE or RESOURCE_EXHAUSTED) and might succeed elsewhere, with
    // its stream's progress (RouterRequest::stream; null or no tokens
    // before its first token). Returns true if it took the request (then
    // the loop forgets it); false → the request ends with `status`. Must
    // not block or call back into this loop.
    std::function<bool(RouterRequest& request, const absl::Status& status)>
        reroute;
  };

  // REQUIRES: backends.verifier and backends.target are set; drafter and
  // drafter_health both set or both null (target-only router); all outlive
  // the loop. `tokenizer` may be null (token ids only, no text deltas).
  // Metrics are registered in `registry` once the target has answered.
  GenerationLoop(RouterBackends backends, const Tokenizer* tokenizer,
                 std::shared_ptr<prometheus::Registry> registry,
                 Options options);
  ~GenerationLoop();  // Stop()s

  // Starts the loop thread. Until TargetControl::FetchInfo succeeds (retried
  // every target_info_retry_ms) requests are finished with UNAVAILABLE.
  void Start();
  // Finishes every request still queued or running with UNAVAILABLE, then
  // joins the loop thread. Idempotent.
  void Stop();
  // Stop() for one stack that left: queued requests are offered to
  // Options::reroute at once; running ones may finish for `drain`, then
  // end with `status` (UNAVAILABLE; offered to reroute if they have no
  // token yet). A target that died fails them sooner.
  void Retire(const absl::Status& status, absl::Duration drain);
  // Retire() without the wait: the loop ends on its own (finished()), and
  // a later Retire() or Stop() joins it at once.
  void BeginRetire(const absl::Status& status, absl::Duration drain);
  // The loop thread has ended (after a Retire/BeginRetire, or a Stop).
  bool finished() const { return finished_.load(); }

  // Queues a request; its sink hears from the loop thread from then on.
  void Submit(RouterRequest request);
  // The client behind `sink` went away: its request ends CANCELLED and its
  // sequence is released on both sides. Unknown or finished sinks are
  // ignored. A weak reference, not an address: a sink freed before the
  // loop gets to the cancel can never match a newer request whose sink
  // reuses its memory.
  void Cancel(std::weak_ptr<const GenerationSink> sink);
  // Counts a request refused before it reached the loop (validation).
  void CountRejected(const absl::Status& status);
  // Releases a sequence a session turn kept (TurnEnd::kept) on both
  // services, on the loop thread. Unknown ids are ignored.
  void ReleaseKept(SequenceId id);
  // Unique among the loops of this process (a loop that left and came back
  // has a new one).
  uint64_t serial() const { return serial_; }

  ServedModel served_model() const;
  int running() const { return running_.load(); }
  // Admitted plus queued requests: what admission balances on.
  int load() const { return running_.load() + queued_.load(); }
  // False from a Step that failed with UNAVAILABLE (or before the first
  // Info) until an Info probe answers.
  bool reachable() const { return reachable_.load(); }
  const Options& options() const { return options_; }

 private:
  struct Active {
    RouterRequest request;  // request.stream is set
    bool deadline_exceeded = false;
    bool client_cancelled = false;
    bool cache_lost = false;     // its kept sequence was in another loop
    int64_t reserve_tokens = 0;  // KV reserved on the target
    // A stream that moved here: the tokens prefilled again (prompt and
    // what it had emitted), counted once its next token arrives.
    int64_t reprefill_tokens = 0;
  };

  void Run();
  bool ConnectTarget();  // fetches target info, builds the engine
  void Admit(RouterRequest request);
  // A fresh request's stream state (detokenizer, stop-string bound, a seed
  // when it has none, so that a move keeps its draws); a moved one keeps
  // its own.
  void StartStream(RouterRequest& request);
  // The engine request for `request` on this loop; sets `cache_lost` when
  // it names a kept sequence this loop cannot continue.
  GenerationRequest EngineRequestFor(const RouterRequest& request,
                                     bool* cache_lost) const;
  // A moved stream's first token here: counts the move.
  void CountResumed(Active& a);
  // Offers a failed request to Options::reroute with its progress; true
  // when it was taken.
  bool MoveStream(Active& a, GenerationResult& result,
                  const absl::Status& status);
  void OnTokens(SequenceId id, const std::vector<int32_t>& tokens);
  void Complete(GenerationResult& result);
  void FailQueued(const absl::Status& status);
  // Offers a request that has sent nothing to Options::reroute; finishes
  // it with `status` when nobody takes it.
  void RerouteOrFinish(RouterRequest request, const absl::Status& status);
  bool ProbeTarget();  // Info once; true (and reachable) when it answered
  void SetLease(double sequence_lease_seconds);
  // Renews the kept sequences' leases when due (KeepAlive).
  void KeepKeptAlive();
  void MarkUnreachable();
  // The loop thread has something to do (or must stop).
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RouterBackends backends_;
  const Tokenizer* tokenizer_;
  std::shared_ptr<prometheus::Registry> registry_;
  Options options_;

  // Loop-thread state: only Run() and what it calls touch it.
  std::unique_ptr<SpeculativeEngine> engine_;
  int64_t max_context_ = 0;  // the target's, from its Info
  // Kept (session) sequences' leases are renewed every lease / 3 (0 = the
  // target's sequences never expire).
  std::chrono::steady_clock::duration keep_alive_period_{};
  std::chrono::steady_clock::time_point next_keep_alive_;
  std::unique_ptr<RouterMetrics> metrics_;  // published as shared_metrics_
  std::map<SequenceId, Active> active_;
  std::vector<SequenceId> to_cancel_;  // stop strings hit during a Step
  std::mt19937_64 seeds_;  // seeds of unseeded requests (StartStream)
  // stop_status_ as the loop thread last saw it.
  absl::Status stop_status_for_loop_ =
      absl::UnavailableError("router is shutting down");

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Why running and queued requests end at Stop()/Retire().
  absl::Status stop_status_ ABSL_GUARDED_BY(mu_);
  absl::Time drain_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<RouterRequest> submitted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<const GenerationSink>> cancelled_
      ABSL_GUARDED_BY(mu_);
  std::vector<SequenceId> release_kept_ ABSL_GUARDED_BY(mu_);
  const uint64_t serial_;
  ServedModel served_ ABSL_GUARDED_BY(mu_);
  // Set once by the loop thread; the metrics themselves are thread-safe.
  RouterMetrics* shared_metrics_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::atomic<int> running_{0};
  std::atomic<int> queued_{0};  // submitted_.size()
  std::atomic<bool> reachable_{false};
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_GENERATION_LOOP_H_
