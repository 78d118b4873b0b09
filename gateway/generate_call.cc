#include "gateway/generate_call.h"

#include <utility>

namespace dedit {

GenerateCall::GenerateCall(v1::Generation::Stub* stub,
                           v1::GenerateRequest request,
                           std::chrono::system_clock::time_point deadline)
    : request_(std::move(request)) {
  context_.set_deadline(deadline);
  stub->async()->Generate(&context_, &request_, this);
  StartRead(&incoming_);
  StartCall();
}

GenerateCall::~GenerateCall() {
  context_.TryCancel();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
}

void GenerateCall::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone follows
  {
    absl::MutexLock lock(&mu_);
    ready_.push_back(std::move(incoming_));
  }
  incoming_.Clear();
  StartRead(&incoming_);
}

void GenerateCall::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = status;
  done_ = true;
}

GenerateCall::Event GenerateCall::Next(absl::Duration timeout,
                                       v1::GenerateResponse* message) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !ready_.empty() || done_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
    return Event::kTimeout;
  }
  if (ready_.empty()) return Event::kFinished;
  *message = std::move(ready_.front());
  ready_.pop_front();
  for (; !ready_.empty(); ready_.pop_front()) {
    const v1::GenerateResponse& next = ready_.front();
    message->mutable_token_ids()->MergeFrom(next.token_ids());
    message->mutable_text()->append(next.text());
    if (next.finished()) {
      message->set_finished(true);
      message->set_finish_reason(next.finish_reason());
      *message->mutable_usage() = next.usage();
      *message->mutable_acceptance() = next.acceptance();
      message->set_stop_reason(next.stop_reason());
    }
  }
  return Event::kMessage;
}

grpc::Status GenerateCall::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace dedit
