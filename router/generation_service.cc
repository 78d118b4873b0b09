#include "router/generation_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/grpc_status.h"

namespace dedit {
namespace {

class GenerateReactor;

// The loop's handle on one stream. Outlives the reactor (the loop may still
// hold it after the client left); writes after that are dropped. One write
// in flight at a time; messages queued meanwhile are merged, so a slow
// client receives fewer, larger messages instead of stalling the loop.
//
// Decisions are made under mu_, the reactor is called after releasing it
// (gRPC may run a reaction such as OnWriteDone on the calling thread). The
// reactor stays alive until our own Finish: gRPC calls OnDone only after it.
class StreamSink : public GenerationSink {
 public:
  explicit StreamSink(GenerateReactor* reactor) : reactor_(reactor) {}

  void Send(v1::GenerateResponse response) override;
  void Finish(const absl::Status& status) override;
  void OnWriteDone(bool ok);
  bool client_gone() const override { return client_gone_.load(); }
  void MarkClientGone() { client_gone_.store(true); }
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  // What to do with the reactor once mu_ is released.
  struct NextCall {
    GenerateReactor* reactor = nullptr;           // null → nothing
    const v1::GenerateResponse* write = nullptr;  // StartWrite, else Finish
    grpc::Status status;
  };
  // The Finish call if it is due now (nothing in flight, not yet finished).
  NextCall TakeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Perform(const NextCall& call);

  std::atomic<bool> client_gone_{false};
  absl::Mutex mu_;
  GenerateReactor* reactor_ ABSL_GUARDED_BY(mu_);  // null once done
  // Front is in flight while writing_; its address stays valid (only the
  // back is merged into, and std::deque keeps references on push_back).
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

class GenerateReactor : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit GenerateReactor(StackSet* stacks) : stacks_(stacks) {
    sink_ = std::make_shared<StreamSink>(this);
  }
  std::shared_ptr<StreamSink> sink() { return sink_; }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  void OnCancel() override {
    // Flag first: a request moving between stacks sees it at admission.
    sink_->MarkClientGone();
    stacks_->Cancel(sink_);
  }
  void OnDone() override {
    sink_->Detach();
    delete this;
  }

 private:
  StackSet* stacks_;
  std::shared_ptr<StreamSink> sink_;
};

void StreamSink::Perform(const NextCall& call) {
  if (call.reactor == nullptr) return;
  if (call.write != nullptr) {
    call.reactor->StartWrite(call.write);
  } else {
    call.reactor->Finish(call.status);
  }
}

StreamSink::NextCall StreamSink::TakeFinishLocked() {
  NextCall call;
  if (finished_ || !finish_requested_ || writing_ || reactor_ == nullptr) {
    return call;
  }
  finished_ = true;
  call.reactor = reactor_;
  call.status = final_status_;
  return call;
}

void StreamSink::Send(v1::GenerateResponse response) {
  NextCall call;
  {
    absl::MutexLock lock(&mu_);
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
    if (writing_) return;
    writing_ = true;
    call.reactor = reactor_;
    call.write = &queue_.front();
  }
  Perform(call);
}

void StreamSink::Finish(const absl::Status& status) {
  NextCall call;
  {
    absl::MutexLock lock(&mu_);
    if (finish_requested_) return;
    finish_requested_ = true;
    final_status_ = ToGrpcStatus(status);
    call = TakeFinishLocked();
  }
  Perform(call);
}

void StreamSink::OnWriteDone(bool ok) {
  NextCall call;
  {
    absl::MutexLock lock(&mu_);
    if (!queue_.empty()) queue_.pop_front();
    if (!ok) queue_.clear();  // the client is gone; OnCancel follows
    if (!queue_.empty() && reactor_ != nullptr) {
      call.reactor = reactor_;
      call.write = &queue_.front();
    } else {
      writing_ = false;
      call = TakeFinishLocked();
    }
  }
  Perform(call);
}

}  // namespace

RequestLimits GenerationServiceImpl::CurrentLimits() const {
  RequestLimits limits;
  limits.model = stacks_->served_model();
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
  limits.default_method = defaults_.default_method;
  limits.ngram_default_window = defaults_.ngram_default_window;
  limits.ngram_max_window = defaults_.ngram_max_window;
  limits.max_prompt_bytes = bytes_per_token_ * limits.model.max_context;
  limits.max_stop_strings = defaults_.max_stop_strings;
  limits.max_stop_string_bytes = defaults_.max_stop_string_bytes;
  limits.chat_special_tokens_in_content =
      defaults_.chat_special_tokens_in_content;
  return limits;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationServiceImpl::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(stacks_);
  const RequestLimits limits = CurrentLimits();
  if (!limits.model.ready) {
    reactor->sink()->Finish(
        absl::UnavailableError("target service is not reachable"));
    return reactor;
  }
  absl::StatusOr<RouterRequest> built =
      BuildRouterRequest(*request, limits, tokenizer_);
  if (!built.ok()) {
    stacks_->CountRejected(built.status());
    reactor->sink()->Finish(built.status());
    return reactor;
  }
  built->arrival = std::chrono::steady_clock::now();
  built->deadline = context->deadline();
  built->sink = reactor->sink();
  stacks_->Submit(std::move(*built));
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
  switch (limits.default_method) {
    case DraftMethod::kModel:
      card->set_default_method(v1::SPECULATIVE_METHOD_MODEL);
      break;
    case DraftMethod::kNgram:
      card->set_default_method(v1::SPECULATIVE_METHOD_NGRAM);
      break;
    case DraftMethod::kHybrid:
      card->set_default_method(v1::SPECULATIVE_METHOD_HYBRID);
      break;
  }
  card->set_ngram_max_window(limits.ngram_max_window);
}

grpc::ServerUnaryReactor* GenerationServiceImpl::ListModels(
    grpc::CallbackServerContext* context, const v1::ListModelsRequest*,
    v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (stacks_->served_model().ready) FillCard(response->add_models());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationServiceImpl::Info(
    grpc::CallbackServerContext* context, const v1::RouterInfoRequest*,
    v1::RouterInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FillCard(response->mutable_model());
  response->set_drafter_healthy(drafter_ != nullptr && drafter_->healthy());
  response->set_requests_running(stacks_->running());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace dedit
