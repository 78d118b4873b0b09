// One dedit.v1.Generation/Generate call to the router, read on gRPC's
// callback threads into a queue that a generation thread drains with a
// timeout. The timeout is what lets a streaming handler write SSE
// heartbeats while the router is quiet (and check that its client is still
// there), and Cancel() is how a disconnect reaches the router, which then
// releases the sequence on the target and the drafter.
//
//   GenerateCall call(stub, request, deadline);
//   v1::GenerateResponse message;
//   while (call.Next(absl::Seconds(1), &message) != Event::kFinished) ...
//   call.status();
//
// Thread-safe. The destructor cancels a call still running and waits for
// gRPC's OnDone, so the object may be dropped at any point.
#ifndef DEDIT_GATEWAY_GENERATE_CALL_H_
#define DEDIT_GATEWAY_GENERATE_CALL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dedit/v1/services.grpc.pb.h"

namespace dedit {

class GenerateCall final
    : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  enum class Event {
    kMessage,   // *message holds every message received since the last one
    kTimeout,   // nothing arrived within the timeout
    kFinished,  // the call ended (messages all taken); see status()
  };

  // Starts the call at once.
  GenerateCall(v1::Generation::Stub* stub, v1::GenerateRequest request,
               std::chrono::system_clock::time_point deadline);
  ~GenerateCall() override;
  GenerateCall(const GenerateCall&) = delete;
  GenerateCall& operator=(const GenerateCall&) = delete;

  // Waits up to `timeout` (absl::InfiniteDuration() for no limit). Messages
  // queued meanwhile are merged into one (token ids and text appended, the
  // final fields kept), so a slow reader gets fewer, larger deltas.
  Event Next(absl::Duration timeout, v1::GenerateResponse* message);
  // The call's status; OK until it finished.
  grpc::Status status() const;
  // Cancels the call (the router sees CANCELLED); Next then finishes.
  void Cancel() { context_.TryCancel(); }

 private:
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  grpc::ClientContext context_;
  const v1::GenerateRequest request_;
  v1::GenerateResponse incoming_;  // written only by gRPC between reads

  mutable absl::Mutex mu_;
  std::deque<v1::GenerateResponse> ready_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dedit

#endif  // DEDIT_GATEWAY_GENERATE_CALL_H_
