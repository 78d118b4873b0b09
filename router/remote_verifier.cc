#include "router/remote_verifier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/serving/fire_and_forget.h"
#include "proto/grpc_status.h"

namespace dedit {
RemoteVerifier::RemoteVerifier(std::shared_ptr<grpc::Channel> channel,
                               Options options, uint32_t nonce)
    : stub_(v1::Target::NewStub(channel)), options_(options), nonce_(nonce) {
  if (options_.round_streams) {
    rounds_ =
        std::make_unique<RoundStreamClient<v1::StepRequest, v1::StepResponse>>(
            [stub = stub_.get()](grpc::ClientContext* context,
                                 grpc::CompletionQueue* cq) {
              return stub->PrepareAsyncRounds(context, cq);
            },
            options_.on_round_stream_open);
  }
}

absl::StatusOr<TargetInfo> RemoteVerifier::FetchInfo(int64_t timeout_ms) {
  grpc::ClientContext context;
  context.set_deadline(Clock::now() + std::chrono::milliseconds(timeout_ms));
  v1::TargetInfoResponse response;
  grpc::Status status =
      stub_->Info(&context, v1::TargetInfoRequest(), &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status), "target Info");
  TargetInfo info;
  info.model_name = response.model_name();
  info.vocab_size = response.vocab_size();
  info.max_context = response.max_context();
  info.eos_token_ids.assign(response.eos_token_ids().begin(),
                            response.eos_token_ids().end());
  info.sequence_lease_seconds = response.sequence_lease_seconds();
  return info;
}

void RemoteVerifier::SetRequestLimits(SequenceId id, int64_t reserve_tokens,
                                      Clock::time_point deadline) {
  limits_[id] = {reserve_tokens, deadline};
}

RemoteVerifier::Clock::time_point RemoteVerifier::CallDeadline(
    const std::vector<SequenceId>& ids) const {
  const Clock::time_point cap =
      Clock::now() + std::chrono::milliseconds(options_.rpc_timeout_ms);
  Clock::time_point latest = Clock::time_point::min();
  for (SequenceId id : ids) {
    auto it = limits_.find(id);
    if (it == limits_.end() ||
        it->second.deadline == Clock::time_point::max()) {
      return cap;
    }
    latest = std::max(latest, it->second.deadline);
  }
  return ids.empty() ? cap : std::min(cap, latest);
}

absl::StatusOr<TargetStepResult> RemoteVerifier::Step(
    const std::vector<PrefillWork>& prefills,
    const std::vector<VerifyWork>& verifies) {
  // One message per round: the target runs it in one forward.
  v1::StepRequest request;
  v1::StepResponse response;
  std::vector<SequenceId> ids;

  for (const PrefillWork& p : prefills) {
    if (p.start > 0) {
      // A continuation must reach the target after its KeepIdle.
      Keeping& k = *keeping_;
      absl::MutexLock lock(&k.mu);
      const SequenceId id = p.sequence;
      auto answered = [&k, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(k.mu) {
        return k.ids.count(id) == 0;
      };
      // The KeepIdle call ends by its deadline at the latest.
      k.mu.AwaitWithTimeout(absl::Condition(&answered),
                            absl::FromChrono(kFireAndForgetDeadline));
    }
    v1::PrefillItem* item = request.mutable_prefill()->add_items();
    item->set_sequence(WireSequenceId(nonce_, p.sequence));
    item->set_start(p.start);
    item->set_no_context(!p.context);
    item->mutable_prompt()->Add(p.prompt.begin(), p.prompt.end());
    v1::TargetSampling* s = item->mutable_sampling();
    s->set_temperature(p.sampling.temperature);
    s->set_top_k(p.sampling.top_k);
    s->set_top_p(p.sampling.top_p);
    s->set_has_seed(p.sampling.has_seed);
    s->set_seed(p.sampling.seed);
    auto it = limits_.find(p.sequence);
    item->set_reserve_tokens(it == limits_.end() ? 0
                                                 : it->second.reserve_tokens);
    ids.push_back(p.sequence);
  }
  for (const VerifyWork& v : verifies) {
    v1::VerifyItem* item = request.mutable_verify()->add_items();
    item->set_sequence(WireSequenceId(nonce_, v.sequence));
    item->set_start(v.start);
    item->mutable_block()->Add(v.block.begin(), v.block.end());
    ids.push_back(v.sequence);
  }
  if (prefills.empty() && verifies.empty()) return TargetStepResult{};
  const Clock::time_point deadline = CallDeadline(ids);
  // A failed call fails the round when it has verify blocks, otherwise
  // every prompt in it.
  absl::Status status;
  if (rounds_ != nullptr) {
    status = rounds_->Call(request, &response, deadline);
  } else {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    status = FromGrpcStatus(stub_->Step(&context, request, &response));
  }
  const v1::VerifyResponse& verify_response = response.verify();
  const v1::PrefillResponse& prefill_response = response.prefill();

  TargetStepResult result;
  if (!verifies.empty()) {
    if (!status.ok()) {
      return Annotate(status, "target Step");
    }
    if (verify_response.results_size() != static_cast<int>(verifies.size())) {
      return absl::InternalError(
          "target Step returned a wrong verify result count");
    }
    for (int i = 0; i < verify_response.results_size(); ++i) {
      const v1::VerifyResult& r = verify_response.results(i);
      const int window = static_cast<int>(verifies[i].block.size());
      if (r.accepted() < 0 || r.accepted() >= window ||
          r.target_tokens_size() != window) {
        return absl::InternalError(
            "target Step returned a malformed verify outcome");
      }
      result.verified.push_back(
          {r.accepted(), std::vector<int32_t>(r.target_tokens().begin(),
                                              r.target_tokens().end())});
    }
  }
  if (!prefills.empty()) {
    const bool call_ok = status.ok() && prefill_response.results_size() ==
                                            static_cast<int>(prefills.size());
    const absl::Status call_error =
        status.ok() ? absl::InternalError(
                          "target Step returned a wrong prefill result count")
                    : Annotate(status, "target Step");
    for (size_t i = 0; i < prefills.size(); ++i) {
      if (!call_ok) {
        result.first_tokens.push_back(-1);
        result.prefill_status.push_back(call_error);
        continue;
      }
      const v1::PrefillResult& r =
          prefill_response.results(static_cast<int>(i));
      result.first_tokens.push_back(r.first_token());
      result.prefill_status.push_back(StatusFromCode(r.code(), r.message()));
    }
  }
  return result;
}

absl::Status RemoteVerifier::Release(SequenceId sequence) {
  limits_.erase(sequence);
  // The engine does not wait for KV to be freed (common/serving/
  // fire_and_forget.h: what a lost Release leaves, the lease frees).
  v1::ReleaseRequest request;
  request.add_sequences(WireSequenceId(nonce_, sequence));
  FireAndForget(stub_->async(), &v1::Target::Stub::async::Release,
                std::move(request));
  return absl::OkStatus();
}

}  // namespace dedit

namespace dedit {

void RemoteVerifier::KeepAlive(const std::vector<SequenceId>& sequences) {
  if (sequences.empty()) return;
  v1::KeepAliveRequest request;
  for (SequenceId id : sequences) {
    request.add_sequences(WireSequenceId(nonce_, id));
  }
  // A missing id is found by the session's next turn (NOT_FOUND, then a
  // whole prefill); nothing to do here.
  FireAndForget(stub_->async(), &v1::Target::Stub::async::KeepAlive,
                std::move(request));
}

absl::Status RemoteVerifier::Keep(SequenceId sequence) {
  // The next turn sets new limits; no stale deadline meanwhile.
  limits_.erase(sequence);
  v1::KeepIdleRequest request;
  request.add_sequences(WireSequenceId(nonce_, sequence));
  {
    absl::MutexLock lock(&keeping_->mu);
    keeping_->ids.insert(sequence);
  }
  FireAndForget(stub_->async(), &v1::Target::Stub::async::KeepIdle,
                std::move(request), [keeping = keeping_, sequence] {
                  absl::MutexLock lock(&keeping->mu);
                  keeping->ids.erase(sequence);
                });
  return absl::OkStatus();
}

}  // namespace dedit
