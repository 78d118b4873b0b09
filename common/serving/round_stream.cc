#include "common/serving/round_stream.h"

namespace dedit {

absl::Status RoundStreamDrainingError() {
  return absl::UnavailableError(
      "the service is draining (shutting down): round stream closed");
}

void RoundStreams::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  // A stream's Drain never blocks on gRPC, and gRPC never runs OnDone
  // (which Detaches under this lock) inline in Finish.
  for (RoundStreamBase* stream : streams_) stream->Drain();
}

int RoundStreams::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

bool RoundStreams::Attach(RoundStreamBase* stream) {
  absl::MutexLock lock(&mu_);
  if (draining_) return false;
  streams_.insert(stream);
  return true;
}

void RoundStreams::Detach(RoundStreamBase* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

}  // namespace dedit
