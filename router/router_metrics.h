// The router's Prometheus metrics (docs/ARCHITECTURE.md §4), all labelled with
// the served model. Counters follow vLLM's spec-decode conventions: a draft is
// one drafted round, draft tokens are W-1 per round, position i is counted
// accepted only if positions 0..i all were.
//
// Several GenerationLoops (one per stack, router/stack_set.h) share one
// registry: the families above are shared (same name and labels → the same
// series), so they stay the router-wide totals the dashboard and rules use.
// Each stack also gets `dedit_stack_*` series labelled {model, stack}: load,
// acceptance, tokens, KV reserved by this router, reachability, outcomes.
// They are removed when the stack's loop goes away.
//
// Thread-safe (prometheus-cpp metrics are).
#ifndef DEDIT_ROUTER_ROUTER_METRICS_H_
#define DEDIT_ROUTER_ROUTER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/speculative_engine.h"

namespace dedit {

class RouterMetrics {
 public:
  // `stack` empty → no per-stack series.
  RouterMetrics(prometheus::Registry& registry, const std::string& model,
                const std::string& stack = "");
  ~RouterMetrics();  // removes this stack's series
  RouterMetrics(const RouterMetrics&) = delete;
  RouterMetrics& operator=(const RouterMetrics&) = delete;

  // One finished round of one request; `block_size` sizes the acceptance
  // histogram's integer buckets (1..W) the first time a drafted round is seen.
  void OnRound(const RoundRecord& round, int block_size);
  void OnStep(const SpeculativeEngine::StepStats& step, double total_seconds);
  void OnFirstToken(double seconds_since_arrival);
  // `n` tokens arrived together `interval_seconds` after the previous ones.
  void OnTokens(int n, double interval_seconds);
  // Admitted on this stack, reserving `reserve_tokens` of its KV.
  void OnRequestStarted(int prompt_tokens, int64_t reserve_tokens = 0);
  // `status` is "ok" or a lowercase gRPC code name ("invalid_argument").
  void OnRequestFinished(const std::string& status, double duration_seconds,
                         bool was_running, int64_t reserve_tokens = 0);
  // A running request left this stack for another (or for this one once
  // its target is back), before its first token or mid-stream.
  void OnRequestRerouted(int64_t reserve_tokens);
  // A stream that had tokens when its stack failed it (`reason`, a
  // stream_progress.h kMove* label) produced its next token after a move:
  // `reprefilled_tokens` were prefilled again, and its client waited
  // `stalled_seconds` since the stack failed it.
  void OnStreamResumed(const std::string& reason, int64_t reprefilled_tokens,
                       double stalled_seconds);
  void OnStackReachable(bool reachable);
  // A session turn ended: prompt tokens reused from its kept KV, and
  // whether that KV was gone (the history was prefilled again).
  void OnSessionTurn(int64_t reused_tokens, bool cache_lost);

  static std::string StatusLabel(const absl::Status& status);

 private:
  const std::string model_;
  prometheus::Counter& num_drafts_;
  prometheus::Counter& num_draft_tokens_;
  prometheus::Counter& num_accepted_tokens_;
  prometheus::Family<prometheus::Counter>& accepted_per_pos_;
  prometheus::Family<prometheus::Histogram>& acceptance_length_family_;
  prometheus::Family<prometheus::Counter>& edit_outcomes_;
  prometheus::Family<prometheus::Histogram>& round_duration_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& request_duration_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Gauge& running_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter& fallback_rounds_;
  prometheus::Counter& lookup_rounds_;
  prometheus::Counter& cut_rounds_;
  prometheus::Counter& skipped_rounds_;
  prometheus::Counter& reused_rounds_;
  prometheus::Counter& paused_rounds_;
  prometheus::Counter& session_turns_;
  prometheus::Counter& session_tokens_saved_;
  prometheus::Counter& session_reprefills_;
  prometheus::Family<prometheus::Counter>& streams_resumed_;
  prometheus::Counter& resumed_tokens_;
  prometheus::Histogram& resume_stall_;

  // Per stack (null when `stack` is empty).
  struct StackSeries {
    prometheus::Family<prometheus::Gauge>* running_family = nullptr;
    prometheus::Gauge* running = nullptr;
    prometheus::Family<prometheus::Gauge>* kv_family = nullptr;
    prometheus::Gauge* kv_reserved_tokens = nullptr;
    prometheus::Family<prometheus::Gauge>* reachable_family = nullptr;
    prometheus::Gauge* reachable = nullptr;
    prometheus::Family<prometheus::Counter>* drafts_family = nullptr;
    prometheus::Counter* drafts = nullptr;
    prometheus::Family<prometheus::Counter>* accepted_family = nullptr;
    prometheus::Counter* accepted_tokens = nullptr;
    prometheus::Family<prometheus::Counter>* tokens_family = nullptr;
    prometheus::Counter* generation_tokens = nullptr;
    prometheus::Family<prometheus::Counter>* requests = nullptr;
  };
  const std::string stack_;
  StackSeries stack_series_;
  prometheus::Counter& StackRequests(const std::string& status);

  // Created on first use: the bucket count and the number of positions
  // come from the first drafted rounds.
  absl::Mutex mu_;
  prometheus::Histogram* acceptance_length_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<prometheus::Counter*> per_pos_ ABSL_GUARDED_BY(mu_);
  std::vector<prometheus::Counter*> stack_requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_ROUTER_METRICS_H_
