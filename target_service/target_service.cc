#include "target_service/target_service.h"

#include <atomic>
#include <memory>
#include <utility>

#include "common/serving/model_service_reactors.h"
#include "proto/grpc_status.h"

namespace dedit {

namespace {

std::vector<TargetPrefillItem> PrefillItems(const v1::PrefillRequest& request) {
  std::vector<TargetPrefillItem> items;
  items.reserve(request.items_size());
  for (const v1::PrefillItem& p : request.items()) {
    TargetPrefillItem item;
    item.work.sequence = p.sequence();
    item.work.prompt.assign(p.prompt().begin(), p.prompt().end());
    item.work.sampling.temperature = p.sampling().temperature();
    item.work.sampling.top_k = p.sampling().top_k();
    item.work.sampling.top_p =
        p.sampling().top_p() == 0.0f ? 1.0f : p.sampling().top_p();
    item.work.sampling.has_seed = p.sampling().has_seed();
    item.work.sampling.seed = p.sampling().seed();
    item.reserve_tokens = p.reserve_tokens();
    item.work.start = p.start();
    item.work.context = !p.no_context();
    items.push_back(std::move(item));
  }
  return items;
}

std::vector<VerifyWork> VerifyItems(const v1::VerifyRequest& request) {
  std::vector<VerifyWork> items;
  items.reserve(request.items_size());
  for (const v1::VerifyItem& v : request.items()) {
    items.push_back({v.sequence(), v.start(),
                     std::vector<int32_t>(v.block().begin(), v.block().end())});
  }
  return items;
}

void FillPrefillResponse(const std::vector<absl::StatusOr<int32_t>>& results,
                         v1::PrefillResponse* response) {
  for (const absl::StatusOr<int32_t>& r : results) {
    v1::PrefillResult* out = response->add_results();
    if (r.ok()) {
      out->set_first_token(*r);
    } else {
      out->set_code(static_cast<int>(r.status().code()));
      out->set_message(std::string(r.status().message()));
    }
  }
}

void FillVerifyResponse(const std::vector<VerifyOutcome>& outcomes,
                        v1::VerifyResponse* response) {
  for (const VerifyOutcome& o : outcomes) {
    v1::VerifyResult* out = response->add_results();
    out->set_accepted(o.accepted);
    out->mutable_target_tokens()->Add(o.target_tokens.begin(),
                                      o.target_tokens.end());
  }
}

}  // namespace

void TargetServiceImpl::RunStep(const v1::StepRequest& request,
                                v1::StepResponse* response,
                                std::function<void(absl::Status)> done) {
  const absl::Status poisoned = worker_->poisoned();
  if (!poisoned.ok()) {
    done(poisoned);
    return;
  }
  std::vector<TargetPrefillItem> prefills = PrefillItems(request.prefill());
  std::vector<VerifyWork> verifies = VerifyItems(request.verify());
  // Answered once both halves are done (each half's callback runs once, on
  // the model thread).
  struct Pending {
    Pending(int halves, std::function<void(absl::Status)> done)
        : remaining(halves), done(std::move(done)) {}
    std::atomic<int> remaining;
    absl::Status verify_status;  // written before the decrement
    std::function<void(absl::Status)> done;
  };
  const int halves = (prefills.empty() ? 0 : 1) + (verifies.empty() ? 0 : 1);
  if (halves == 0) {
    done(absl::OkStatus());
    return;
  }
  auto pending = std::make_shared<Pending>(halves, std::move(done));
  auto finish_half = [pending]() {
    if (pending->remaining.fetch_sub(1) == 1) {
      pending->done(pending->verify_status);
    }
  };
  worker_->Step(
      std::move(prefills),
      [response, finish_half](std::vector<absl::StatusOr<int32_t>> results) {
        FillPrefillResponse(results, response->mutable_prefill());
        finish_half();
      },
      std::move(verifies),
      [response, pending,
       finish_half](absl::StatusOr<std::vector<VerifyOutcome>> result) {
        if (result.ok()) {
          FillVerifyResponse(*result, response->mutable_verify());
        } else {
          pending->verify_status = result.status();
        }
        finish_half();
      });
}

grpc::ServerUnaryReactor* TargetServiceImpl::Step(
    grpc::CallbackServerContext* context, const v1::StepRequest* request,
    v1::StepResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunStep(*request, response, [reactor](absl::Status status) {
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>*
TargetServiceImpl::Rounds(grpc::CallbackServerContext*) {
  return new RoundStreamReactor<v1::StepRequest, v1::StepResponse>(
      &rounds_,
      [this](const v1::StepRequest& request, v1::StepResponse* response,
             std::function<void(absl::Status)> done) {
        RunStep(request, response, std::move(done));
      });
}

grpc::ServerUnaryReactor* TargetServiceImpl::Prefill(
    grpc::CallbackServerContext* context, const v1::PrefillRequest* request,
    v1::PrefillResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (FinishIfPoisoned(worker_->poisoned(), reactor)) return reactor;
  worker_->Prefill(
      PrefillItems(*request),
      [reactor, response](std::vector<absl::StatusOr<int32_t>> results) {
        FillPrefillResponse(results, response);
        reactor->Finish(grpc::Status::OK);
      },
      request->round_calls() > 1);
  return reactor;
}

grpc::ServerUnaryReactor* TargetServiceImpl::Verify(
    grpc::CallbackServerContext* context, const v1::VerifyRequest* request,
    v1::VerifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (FinishIfPoisoned(worker_->poisoned(), reactor)) return reactor;
  worker_->Verify(
      VerifyItems(*request),
      [reactor, response](absl::StatusOr<std::vector<VerifyOutcome>> result) {
        if (!result.ok()) {
          reactor->Finish(ToGrpcStatus(result.status()));
          return;
        }
        FillVerifyResponse(*result, response);
        reactor->Finish(grpc::Status::OK);
      },
      request->round_calls() > 1);
  return reactor;
}

grpc::ServerUnaryReactor* TargetServiceImpl::Release(
    grpc::CallbackServerContext* context, const v1::ReleaseRequest* request,
    v1::ReleaseResponse* response) {
  return ReleaseReactor(context, worker_, *request, response);
}

grpc::ServerUnaryReactor* TargetServiceImpl::KeepIdle(
    grpc::CallbackServerContext* context, const v1::KeepIdleRequest* request,
    v1::KeepIdleResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (FinishIfPoisoned(worker_->poisoned(), reactor)) return reactor;
  worker_->KeepIdle(std::vector<SequenceId>(request->sequences().begin(),
                                            request->sequences().end()),
                    [reactor, response](std::vector<SequenceId> missing) {
                      response->mutable_missing()->Add(missing.begin(),
                                                       missing.end());
                      reactor->Finish(grpc::Status::OK);
                    });
  return reactor;
}

grpc::ServerUnaryReactor* TargetServiceImpl::KeepAlive(
    grpc::CallbackServerContext* context, const v1::KeepAliveRequest* request,
    v1::KeepAliveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (FinishIfPoisoned(worker_->poisoned(), reactor)) return reactor;
  worker_->KeepAlive(std::vector<SequenceId>(request->sequences().begin(),
                                             request->sequences().end()),
                     [reactor, response](std::vector<SequenceId> missing) {
                       for (SequenceId id : missing) response->add_missing(id);
                       reactor->Finish(grpc::Status::OK);
                     });
  return reactor;
}

grpc::ServerUnaryReactor* TargetServiceImpl::Info(
    grpc::CallbackServerContext* context, const v1::TargetInfoRequest*,
    v1::TargetInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Config and options are immutable after load; counts come from the
  // model thread's snapshot.
  const Qwen3Config& c = worker_->config();
  response->set_model_name(identity_.model_name);
  response->set_vocab_size(c.vocab_size);
  response->set_max_context(c.max_position_embeddings);
  for (int id : c.eos_token_ids) response->add_eos_token_ids(id);
  for (int id : worker_->model().options().feature_layer_ids) {
    response->add_feature_layer_ids(id);
  }
  response->set_feature_width(worker_->model().feature_width());
  response->set_device(identity_.device);
  response->set_dtype(identity_.dtype);
  const TargetWorker::Snapshot s = worker_->snapshot();
  response->set_num_sequences(s.num_sequences);
  response->set_cached_tokens(s.cached_tokens);
  response->set_reserved_tokens(s.reserved_tokens);
  response->set_kv_capacity_tokens(s.kv_capacity_tokens);
  response->set_idle_sequences(s.idle_sequences);
  response->set_idle_cached_tokens(s.idle_cached_tokens);
  response->set_kv_bytes_in_use(s.kv_bytes_in_use);
  response->set_kv_bytes_held(s.kv_bytes_held);
  response->set_evicted_sequences(s.evicted_sequences);
  response->set_sequence_lease_seconds(
      absl::ToDoubleSeconds(worker_->sequence_lease()));
  response->set_expired_sequences(s.expired_sequences);
  response->set_round_streams(rounds_.size());
  response->set_context_stream_connected(stream_ != nullptr &&
                                         stream_->connected());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace dedit
