#include "router/router_metrics.h"

#include <algorithm>
#include <cctype>

#include "router/stream_progress.h"

namespace dedit {
namespace {

using prometheus::Histogram;

// Sub-10 ms buckets for CPU-scale steps, then vLLM's ranges.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01,  0.025, 0.05,  0.075, 0.1,
          0.25,  0.5,    0.75,  1.0,   2.5,   5.0,   7.5,   10.0,
          20.0,  40.0,   80.0,  160.0, 640.0, 2560.0};
}

Histogram::BucketBoundaries RequestBuckets() {
  return {0.01, 0.05, 0.1,   0.3,   0.5,   0.8,   1.0,    1.5,
          2.0,  2.5,  5.0,   10.0,  15.0,  20.0,  30.0,   40.0,
          50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

}  // namespace

// The registration of every router metric, one declarative entry each.
// NOLINT(readability-function-size)
RouterMetrics::RouterMetrics(prometheus::Registry& r, const std::string& model,
                             const std::string& stack)
    : model_(model),
      num_drafts_(prometheus::BuildCounter()
                      .Name("dedit_spec_decode_num_drafts_total")
                      .Help("Drafted rounds")
                      .Register(r)
                      .Add({{"model", model}})),
      num_draft_tokens_(prometheus::BuildCounter()
                            .Name("dedit_spec_decode_num_draft_tokens_total")
                            .Help("Proposed tokens (W-1 per drafted round)")
                            .Register(r)
                            .Add({{"model", model}})),
      num_accepted_tokens_(
          prometheus::BuildCounter()
              .Name("dedit_spec_decode_num_accepted_tokens_total")
              .Help("Accepted draft tokens")
              .Register(r)
              .Add({{"model", model}})),
      accepted_per_pos_(
          prometheus::BuildCounter()
              .Name("dedit_spec_decode_num_accepted_tokens_per_pos_total")
              .Help("Accepted draft tokens by block position (0 = slot 1)")
              .Register(r)),
      acceptance_length_family_(prometheus::BuildHistogram()
                                    .Name("dedit_spec_decode_acceptance_length")
                                    .Help("Tokens committed per drafted round "
                                          "(acc + 1, bonus included)")
                                    .Register(r)),
      edit_outcomes_(
          prometheus::BuildCounter()
              .Name("dedit_edit_outcomes_total")
              .Help("Per edit pass k < K: did the final proposal "
                    "extend, keep or shorten pass k's accepted prefix")
              .Register(r)),
      round_duration_(
          prometheus::BuildHistogram()
              .Name("dedit_round_duration_seconds")
              .Help("Round phases: batched draft, batched verify, whole round")
              .Register(r)),
      ttft_(prometheus::BuildHistogram()
                .Name("dedit_time_to_first_token_seconds")
                .Help("Request arrival to first token")
                .Register(r)
                .Add({{"model", model}}, LatencyBuckets())),
      itl_(prometheus::BuildHistogram()
               .Name("dedit_inter_token_latency_seconds")
               .Help("Per-token latency after the first (a round's tokens "
                     "share its interval)")
               .Register(r)
               .Add({{"model", model}}, LatencyBuckets())),
      request_duration_(prometheus::BuildHistogram()
                            .Name("dedit_request_duration_seconds")
                            .Help("Request arrival to completion")
                            .Register(r)
                            .Add({{"model", model}}, RequestBuckets())),
      requests_(prometheus::BuildCounter()
                    .Name("dedit_requests_total")
                    .Help("Finished requests by gRPC status")
                    .Register(r)),
      running_(prometheus::BuildGauge()
                   .Name("dedit_requests_running")
                   .Help("Requests admitted and not finished")
                   .Register(r)
                   .Add({{"model", model}})),
      prompt_tokens_(prometheus::BuildCounter()
                         .Name("dedit_prompt_tokens_total")
                         .Help("Prompt tokens of admitted requests")
                         .Register(r)
                         .Add({{"model", model}})),
      generation_tokens_(prometheus::BuildCounter()
                             .Name("dedit_generation_tokens_total")
                             .Help("Generated tokens streamed to clients")
                             .Register(r)
                             .Add({{"model", model}})),
      fallback_rounds_(
          prometheus::BuildCounter()
              .Name("dedit_fallback_rounds_total")
              .Help("Rounds where drafting was wanted but the drafter failed")
              .Register(r)
              .Add({{"model", model}})),
      lookup_rounds_(prometheus::BuildCounter()
                         .Name("dedit_lookup_rounds_total")
                         .Help("Hybrid-method rounds drafted by prompt lookup "
                               "(no Draft call)")
                         .Register(r)
                         .Add({{"model", model}})),
      cut_rounds_(prometheus::BuildCounter()
                      .Name("dedit_cut_rounds_total")
                      .Help("Rounds whose drafter draft was cut before its "
                            "first slot under --min_draft_confidence")
                      .Register(r)
                      .Add({{"model", model}})),
      skipped_rounds_(prometheus::BuildCounter()
                          .Name("dedit_skipped_rounds_total")
                          .Help("Rounds that skipped the drafter after drafts "
                                "cut to nothing (--min_draft_confidence)")
                          .Register(r)
                          .Add({{"model", model}})),
      reused_rounds_(prometheus::BuildCounter()
                         .Name("dedit_reused_draft_rounds_total")
                         .Help("Rounds that verified the rest of an earlier "
                               "draft with no Draft call (--verify_chunk)")
                         .Register(r)
                         .Add({{"model", model}})),
      paused_rounds_(prometheus::BuildCounter()
                         .Name("dedit_paused_rounds_total")
                         .Help("Rounds of speculating requests decoded one "
                               "token: the batch was over "
                               "--max_speculative_batch, or "
                               "--adaptive_speculation found drafting slower")
                         .Register(r)
                         .Add({{"model", model}})),
      session_turns_(prometheus::BuildCounter()
                         .Name("dedit_session_turns_total")
                         .Help("Session turns completed")
                         .Register(r)
                         .Add({{"model", model}})),
      session_tokens_saved_(
          prometheus::BuildCounter()
              .Name("dedit_session_prefill_tokens_saved_total")
              .Help("Prompt tokens of session turns whose KV was reused "
                    "instead of prefilled")
              .Register(r)
              .Add({{"model", model}})),
      session_reprefills_(
          prometheus::BuildCounter()
              .Name("dedit_session_reprefills_total")
              .Help("Session turns whose kept KV was gone (evicted, "
                    "expired, stack left): the whole history was prefilled")
              .Register(r)
              .Add({{"model", model}})),
      streams_resumed_(prometheus::BuildCounter()
                           .Name("dedit_stream_resumed_total")
                           .Help("Streams that lost their stack mid-way and "
                                 "went on from their next token on another "
                                 "(or the same one back), by why they left")
                           .Register(r)),
      resumed_tokens_(prometheus::BuildCounter()
                          .Name("dedit_stream_reprefilled_tokens_total")
                          .Help("Tokens prefilled again to resume moved "
                                "streams: prompt and what they had emitted")
                          .Register(r)
                          .Add({{"model", model}})),
      resume_stall_(prometheus::BuildHistogram()
                        .Name("dedit_stream_resume_seconds")
                        .Help("How long a moved stream's client waited: "
                              "its stack failing it to its next token")
                        .Register(r)
                        .Add({{"model", model}}, RequestBuckets())),
      stack_(stack) {
  if (!stack.empty()) {
    const prometheus::Labels labels = {{"model", model}, {"stack", stack}};
    StackSeries& s = stack_series_;
    // Every loop Registers the same families (the registry merges them);
    // each adds its own stack's series.
    s.running_family = &prometheus::BuildGauge()
                            .Name("dedit_stack_requests_running")
                            .Help(
                                "Requests admitted on the stack and not "
                                "finished")
                            .Register(r);
    s.running = &s.running_family->Add(labels);
    s.kv_family = &prometheus::BuildGauge()
                       .Name("dedit_stack_kv_reserved_tokens")
                       .Help(
                           "KV tokens this router's running requests "
                           "reserve on the stack's target")
                       .Register(r);
    s.kv_reserved_tokens = &s.kv_family->Add(labels);
    s.reachable_family = &prometheus::BuildGauge()
                              .Name("dedit_stack_reachable")
                              .Help(
                                  "1 while the stack's target answers and "
                                  "the stack takes new requests")
                              .Register(r);
    s.reachable = &s.reachable_family->Add(labels);
    s.drafts_family = &prometheus::BuildCounter()
                           .Name("dedit_stack_num_drafts_total")
                           .Help("Drafted rounds on the stack")
                           .Register(r);
    s.drafts = &s.drafts_family->Add(labels);
    s.accepted_family = &prometheus::BuildCounter()
                             .Name("dedit_stack_num_accepted_tokens_total")
                             .Help("Accepted draft tokens on the stack")
                             .Register(r);
    s.accepted_tokens = &s.accepted_family->Add(labels);
    s.tokens_family = &prometheus::BuildCounter()
                           .Name("dedit_stack_generation_tokens_total")
                           .Help("Tokens streamed from the stack")
                           .Register(r);
    s.generation_tokens = &s.tokens_family->Add(labels);
    s.requests = &prometheus::BuildCounter()
                      .Name("dedit_stack_requests_total")
                      .Help(
                          "Requests that left the stack, by gRPC status "
                          "(rerouted: moved to another stack, or queued "
                          "for one, with their progress)")
                      .Register(r);
    StackRequests("ok");
  }
  // Every reason from the start, so that dashboards show zeros, not gaps.
  for (const char* reason : {kMoveTargetFailed, kMoveStackLeft, kMoveKvFull}) {
    streams_resumed_.Add({{"model", model}, {"reason", reason}});
  }
  for (const char* phase : {"draft", "verify", "total"}) {
    round_duration_.Add({{"model", model}, {"phase", phase}}, LatencyBuckets());
  }
  requests_.Add({{"model", model}, {"status", "ok"}});
}

RouterMetrics::~RouterMetrics() {
  StackSeries& s = stack_series_;
  if (s.running == nullptr) return;
  // The families stay in the registry (other stacks use them); this
  // stack's series go, so a stack that left leaves no stale gauge.
  s.running_family->Remove(s.running);
  s.kv_family->Remove(s.kv_reserved_tokens);
  s.reachable_family->Remove(s.reachable);
  s.drafts_family->Remove(s.drafts);
  s.accepted_family->Remove(s.accepted_tokens);
  s.tokens_family->Remove(s.generation_tokens);
  absl::MutexLock lock(&mu_);
  for (prometheus::Counter* c : stack_requests_) s.requests->Remove(c);
}

prometheus::Counter& RouterMetrics::StackRequests(const std::string& status) {
  prometheus::Counter& c = stack_series_.requests->Add(
      {{"model", model_}, {"stack", stack_}, {"status", status}});
  absl::MutexLock lock(&mu_);
  if (std::find(stack_requests_.begin(), stack_requests_.end(), &c) ==
      stack_requests_.end()) {
    stack_requests_.push_back(&c);
  }
  return c;
}

void RouterMetrics::OnRound(const RoundRecord& round, int block_size) {
  if (round.fallback) fallback_rounds_.Increment();
  if (round.looked_up) lookup_rounds_.Increment();
  if (round.cut) cut_rounds_.Increment();
  if (round.skipped) skipped_rounds_.Increment();
  if (round.reused) reused_rounds_.Increment();
  if (round.paused) paused_rounds_.Increment();
  if (round.window < 2) return;
  if (stack_series_.drafts != nullptr) {
    stack_series_.drafts->Increment();
    stack_series_.accepted_tokens->Increment(round.accepted);
  }
  num_drafts_.Increment();
  num_draft_tokens_.Increment(round.window - 1);
  num_accepted_tokens_.Increment(round.accepted);
  absl::MutexLock lock(&mu_);
  if (acceptance_length_ == nullptr) {
    const int w = std::max(block_size, round.window);
    Histogram::BucketBoundaries buckets;
    for (int i = 1; i <= w; ++i) buckets.push_back(i);
    acceptance_length_ =
        &acceptance_length_family_.Add({{"model", model_}}, buckets);
  }
  acceptance_length_->Observe(round.accepted + 1);
  while (per_pos_.size() < static_cast<size_t>(round.window - 1)) {
    per_pos_.push_back(&accepted_per_pos_.Add(
        {{"model", model_}, {"position", std::to_string(per_pos_.size())}}));
  }
  for (int i = 0; i < round.accepted; ++i) per_pos_[i]->Increment();
  for (size_t k = 0; k < round.edits.size(); ++k) {
    edit_outcomes_
        .Add({{"model", model_},
              {"pass", std::to_string(k + 1)},
              {"outcome", EditOutcomeName(round.edits[k])}})
        .Increment();
  }
}

void RouterMetrics::OnStep(const SpeculativeEngine::StepStats& step,
                           double total_seconds) {
  if (step.drafts > 0) {
    round_duration_
        .Add({{"model", model_}, {"phase", "draft"}}, LatencyBuckets())
        .Observe(step.draft_seconds);
  }
  if (step.verifies + step.prefills > 0) {
    round_duration_
        .Add({{"model", model_}, {"phase", "verify"}}, LatencyBuckets())
        .Observe(step.verify_seconds);
  }
  round_duration_.Add({{"model", model_}, {"phase", "total"}}, LatencyBuckets())
      .Observe(total_seconds);
}

void RouterMetrics::OnFirstToken(double seconds) { ttft_.Observe(seconds); }

void RouterMetrics::OnTokens(int n, double interval_seconds) {
  generation_tokens_.Increment(n);
  if (stack_series_.generation_tokens != nullptr) {
    stack_series_.generation_tokens->Increment(n);
  }
  if (interval_seconds < 0 || n <= 0) return;
  for (int i = 0; i < n; ++i) itl_.Observe(interval_seconds / n);
}

void RouterMetrics::OnRequestStarted(int prompt_tokens,
                                     int64_t reserve_tokens) {
  running_.Increment();
  prompt_tokens_.Increment(prompt_tokens);
  if (stack_series_.running != nullptr) {
    stack_series_.running->Increment();
    stack_series_.kv_reserved_tokens->Increment(
        static_cast<double>(reserve_tokens));
  }
}

void RouterMetrics::OnRequestFinished(const std::string& status,
                                      double duration_seconds, bool was_running,
                                      int64_t reserve_tokens) {
  requests_.Add({{"model", model_}, {"status", status}}).Increment();
  if (was_running) {
    running_.Decrement();
    request_duration_.Observe(duration_seconds);
    if (stack_series_.running != nullptr) {
      stack_series_.running->Decrement();
      stack_series_.kv_reserved_tokens->Decrement(
          static_cast<double>(reserve_tokens));
      StackRequests(status).Increment();
    }
  }
}

void RouterMetrics::OnRequestRerouted(int64_t reserve_tokens) {
  running_.Decrement();
  if (stack_series_.running != nullptr) {
    stack_series_.running->Decrement();
    stack_series_.kv_reserved_tokens->Decrement(
        static_cast<double>(reserve_tokens));
    StackRequests("rerouted").Increment();
  }
}

void RouterMetrics::OnStreamResumed(const std::string& reason,
                                    int64_t reprefilled_tokens,
                                    double stalled_seconds) {
  streams_resumed_.Add({{"model", model_}, {"reason", reason}}).Increment();
  resumed_tokens_.Increment(static_cast<double>(reprefilled_tokens));
  resume_stall_.Observe(stalled_seconds);
}

void RouterMetrics::OnSessionTurn(int64_t reused_tokens, bool cache_lost) {
  session_turns_.Increment();
  session_tokens_saved_.Increment(static_cast<double>(reused_tokens));
  if (cache_lost) session_reprefills_.Increment();
}

void RouterMetrics::OnStackReachable(bool reachable) {
  if (stack_series_.reachable != nullptr) {
    stack_series_.reachable->Set(reachable ? 1 : 0);
  }
}

std::string RouterMetrics::StatusLabel(const absl::Status& status) {
  if (status.ok()) return "ok";
  std::string name = absl::StatusCodeToString(status.code());
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

}  // namespace dedit
