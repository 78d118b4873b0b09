#include "router/generation_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "proto/grpc_status.h"

namespace dedit {
namespace {

class GenerateReactor;

// The loop's handle on one stream. Outlives the reactor (the loop may still
// hold it after the client left); writes after that are dropped. One write
// in flight at a time; messages queued meanwhile are merged, so a slow
// client receives fewer, larger messages instead of stalling the loop.
class StreamSink : public GenerationSink {
 public:
  explicit StreamSink(GenerateReactor* reactor) : reactor_(reactor) {}

  void Send(v1::GenerateResponse response) override;
  void Finish(const absl::Status& status) override;
  void OnWriteDone(bool ok);
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
  }

 private:
  void FinishLocked(const grpc::Status& status);  // REQUIRES mu_

  std::mutex mu_;
  GenerateReactor* reactor_;                // GUARDED_BY(mu_); null once done
  std::deque<v1::GenerateResponse> queue_;  // GUARDED_BY(mu_); front in flight
  bool writing_ = false;                    // GUARDED_BY(mu_)
  bool finish_requested_ = false;           // GUARDED_BY(mu_)
  bool finished_ = false;                   // GUARDED_BY(mu_)
  grpc::Status final_status_;               // GUARDED_BY(mu_)
};

class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(GenerationLoop* loop) : loop_(loop) {
    sink_ = std::make_shared<StreamSink>(this);
  }
  std::shared_ptr<StreamSink> sink() { return sink_; }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override { loop_->Cancel(sink_.get()); }
  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  GenerationLoop* loop_;
  std::shared_ptr<StreamSink> sink_;
};

void StreamSink::Send(v1::GenerateResponse response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reactor_ == nullptr || finish_requested_) return;
  if (queue_.size() >= 2) {
    // Merge into the newest queued (not in flight) message.
    v1::GenerateResponse& back = queue_.back();
    back.mutable_token_ids()->MergeFrom(response.token_ids());
    back.mutable_text()->append(response.text());
    if (response.finished()) {
      back.set_finished(true);
      back.set_finish_reason(response.finish_reason());
      *back.mutable_usage() = response.usage();
      *back.mutable_acceptance() = response.acceptance();
      back.set_stop_reason(response.stop_reason());
    }
    return;
  }
  queue_.push_back(std::move(response));
  if (!writing_) {
    writing_ = true;
    reactor_->StartWrite(&queue_.front());
  }
}

void StreamSink::Finish(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finish_requested_) return;
  finish_requested_ = true;
  final_status_ = ToGrpcStatus(status);
  if (!writing_) FinishLocked(final_status_);
}

void StreamSink::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!queue_.empty()) queue_.pop_front();
  if (!ok) queue_.clear();  // the client is gone; OnCancel follows
  if (!queue_.empty() && reactor_ != nullptr) {
    reactor_->StartWrite(&queue_.front());
    return;
  }
  writing_ = false;
  if (finish_requested_) FinishLocked(final_status_);
}

void StreamSink::FinishLocked(const grpc::Status& status) {
  if (finished_ || reactor_ == nullptr) return;
  finished_ = true;
  reactor_->Finish(status);
}

}  // namespace

RequestLimits GenerationServiceImpl::CurrentLimits() const {
  RequestLimits limits;
  limits.model = loop_->served_model();
  limits.max_tokens_limit = defaults_.max_tokens_limit;
  limits.max_passes = defaults_.max_passes;
  const int block = drafter_ != nullptr ? drafter_->block_size() : 0;
  limits.drafter_block_size = block;
  limits.default_window = defaults_.default_window > 0
                              ? defaults_.default_window
                              : (block > 0 ? block : 1);
  const int k = drafter_ != nullptr ? drafter_->num_passes() : 0;
  limits.default_passes =
      defaults_.default_passes > 0 ? defaults_.default_passes : std::max(1, k);
  return limits;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationServiceImpl::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(loop_);
  const RequestLimits limits = CurrentLimits();
  if (!limits.model.ready) {
    reactor->sink()->Finish(
        absl::UnavailableError("target service is not reachable"));
    return reactor;
  }
  absl::StatusOr<RouterRequest> built =
      BuildRouterRequest(*request, limits, tokenizer_);
  if (!built.ok()) {
    loop_->CountRejected(built.status());
    reactor->sink()->Finish(built.status());
    return reactor;
  }
  built->arrival = std::chrono::steady_clock::now();
  built->deadline = context->deadline();
  built->sink = reactor->sink();
  loop_->Submit(std::move(*built));
  return reactor;
}

void GenerationServiceImpl::FillCard(v1::ModelCard* card) const {
  const RequestLimits limits = CurrentLimits();
  card->set_name(limits.model.name);
  card->set_vocab_size(limits.model.vocab_size);
  card->set_max_context(limits.model.max_context);
  card->set_max_tokens_limit(limits.max_tokens_limit);
  card->set_drafter_block_size(limits.drafter_block_size);
  card->set_drafter_max_passes(limits.max_passes);
  card->set_default_window(limits.default_window);
  card->set_default_passes(limits.default_passes);
  card->set_has_tokenizer(tokenizer_ != nullptr);
}

grpc::ServerUnaryReactor* GenerationServiceImpl::ListModels(
    grpc::CallbackServerContext* context, const v1::ListModelsRequest*,
    v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (loop_->served_model().ready) FillCard(response->add_models());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationServiceImpl::Info(
    grpc::CallbackServerContext* context, const v1::RouterInfoRequest*,
    v1::RouterInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FillCard(response->mutable_model());
  response->set_drafter_healthy(drafter_ != nullptr && drafter_->healthy());
  response->set_requests_running(loop_->running());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace dedit
