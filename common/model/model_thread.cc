#include "common/model/model_thread.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/torch_status.h"

namespace dedit {

ModelThread::~ModelThread() { Stop(); }

void ModelThread::Start() {
  {
    absl::MutexLock lock(&mu_);
    started_ = true;
  }
  thread_ = std::thread([this] {
    ModelThreadScope scope(cpu_threads_);
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    absl::Status warm_up =
        stopping ? absl::UnavailableError("stopped before the warm-up")
                 : WarmUp();
    if (!warm_up.ok() && !stopping) {
      Poison(absl::InternalError(
          absl::StrCat("warm-up forward failed: ", warm_up.message())));
    }
    {
      absl::MutexLock lock(&mu_);
      warm_up_ = std::move(warm_up);
    }
    Run();
  });
}

void ModelThread::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status ModelThread::AwaitWarmUp() const {
  absl::MutexLock lock(&mu_);
  if (!started_) {
    return absl::FailedPreconditionError("the model thread was not started");
  }
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return warm_up_.has_value();
  };
  mu_.Await(absl::Condition(&done));
  return *warm_up_;
}

bool ModelThread::warmed_up() const {
  absl::MutexLock lock(&mu_);
  return warm_up_.has_value() && warm_up_->ok();
}

absl::Status ModelThread::poisoned() const {
  absl::MutexLock lock(&mu_);
  return poison_;
}

void ModelThread::Release(std::vector<SequenceId> sequences,
                          SequenceReleaseDone done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && poison_.ok()) {
      new_releases_.push_back({std::move(sequences), std::move(done)});
      return;
    }
  }
  if (done) done(0);
}

void ModelThread::NoteModelError(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInternal ||
      !IsStickyDeviceError(status.message())) {
    return;
  }
  Poison(absl::InternalError(
      absl::StrCat("model worker poisoned by a sticky device error, the "
                   "process must be restarted: ",
                   status.message())));
}

void ModelThread::Poison(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!poison_.ok()) return;  // the first error is the one that counts
    poison_ = absl::InternalError(status.message());
    status = poison_;
  }
  if (poison_listener_) poison_listener_(status);
}

}  // namespace dedit
