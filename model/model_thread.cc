#include "model/model_thread.h"

#include <utility>

#include "model/cpu_threads.h"

namespace dedit {

ModelThread::~ModelThread() { Stop(); }

void ModelThread::Start() {
  thread_ = std::thread([this] {
    ModelThreadScope scope(cpu_threads_);
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

void ModelThread::Release(std::vector<SequenceId> sequences,
                          SequenceReleaseDone done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      new_releases_.push_back({std::move(sequences), std::move(done)});
      return;
    }
  }
  if (done) done(0);
}

}  // namespace dedit
