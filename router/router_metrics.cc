#include "router/router_metrics.h"

#include <algorithm>
#include <cctype>

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

RouterMetrics::RouterMetrics(prometheus::Registry& r, const std::string& model)
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
              .Add({{"model", model}})) {
  for (const char* phase : {"draft", "verify", "total"}) {
    round_duration_.Add({{"model", model}, {"phase", phase}}, LatencyBuckets());
  }
  requests_.Add({{"model", model}, {"status", "ok"}});
}

void RouterMetrics::OnRound(const RoundRecord& round, int block_size) {
  if (round.fallback) fallback_rounds_.Increment();
  if (round.window < 2) return;
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
  if (interval_seconds < 0 || n <= 0) return;
  for (int i = 0; i < n; ++i) itl_.Observe(interval_seconds / n);
}

void RouterMetrics::OnRequestStarted(int prompt_tokens) {
  running_.Increment();
  prompt_tokens_.Increment(prompt_tokens);
}

void RouterMetrics::OnRequestFinished(const std::string& status,
                                      double duration_seconds,
                                      bool was_running) {
  requests_.Add({{"model", model_}, {"status", status}}).Increment();
  if (was_running) {
    running_.Decrement();
    request_duration_.Observe(duration_seconds);
  }
}

std::string RouterMetrics::StatusLabel(const absl::Status& status) {
  if (status.ok()) return "ok";
  std::string name = absl::StatusCodeToString(status.code());
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

}  // namespace dedit
