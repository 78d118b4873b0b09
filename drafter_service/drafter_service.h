// dedit.v1.Drafter over a DrafterWorker. StreamContext readers feed the
// worker; Draft/Release/Info are unary reactors answered by the model
// thread. A poisoned worker (common/model/model_thread.h) fails Draft and
// Release at once with its INTERNAL error; Info still answers, context is
// dropped.
//
// Readiness: the drafter can only draft for sequences whose context the
// target streams to it, so the named health service "dedit.v1.Drafter" is
// SERVING only while at least one context stream is attached (the router
// checks it before speculating again); the overall health ("") is SERVING
// from the warm-up on for liveness probes. Both are NOT_SERVING before the
// warm-up and after a sticky device error (drafter_server.cc).
#ifndef DEDIT_DRAFTER_SERVICE_DRAFTER_SERVICE_H_
#define DEDIT_DRAFTER_SERVICE_DRAFTER_SERVICE_H_

#include <atomic>
#include <functional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/serving/round_stream.h"
#include "dedit/v1/services.grpc.pb.h"
#include "drafter_service/drafter_worker.h"

namespace dedit {

class ContextStreamReader;

class DrafterServiceImpl final : public v1::Drafter::CallbackService {
 public:
  struct Identity {
    std::string model_name;
    std::string device;
  };
  // `on_streams_changed` gets the number of attached context streams; it is
  // called under the service's lock, so the counts arrive in order, and must
  // not block or call back into the service. `on_context_bytes` may be
  // empty.
  DrafterServiceImpl(DrafterWorker* worker, Identity identity,
                     std::function<void(int)> on_streams_changed,
                     std::function<void(int64_t)> on_context_bytes);
  ~DrafterServiceImpl() override;

  grpc::ServerReadReactor<v1::ContextChunk>* StreamContext(
      grpc::CallbackServerContext* context,
      v1::StreamContextSummary* summary) override;
  grpc::ServerUnaryReactor* Draft(grpc::CallbackServerContext* context,
                                  const v1::DraftRequest* request,
                                  v1::DraftResponse* response) override;
  // Draft calls on one long-lived stream (common/serving/round_stream.h).
  grpc::ServerBidiReactor<v1::DraftRequest, v1::DraftResponse>* Rounds(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Release(
      grpc::CallbackServerContext* context,
      const v1::DrafterReleaseRequest* request,
      v1::DrafterReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const v1::DrafterInfoRequest* request,
                                 v1::DrafterInfoResponse* response) override;

  // Ends every context stream (graceful shutdown: the target reconnects
  // elsewhere or later), and every round stream after its call in flight.
  void FinishStreams() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class ContextStreamReader;
  // One Draft call (unary or a Rounds message) from the router at `peer`
  // (the worker's fair-share key): `done` gets its status, once.
  void RunDraft(const v1::DraftRequest& request, v1::DraftResponse* response,
                const std::string& peer,
                std::function<void(absl::Status)> done);
  void Attach(ContextStreamReader* reader) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach(ContextStreamReader* reader) ABSL_LOCKS_EXCLUDED(mu_);

  DrafterWorker* worker_;
  Identity identity_;
  std::function<void(int)> on_streams_changed_;
  std::function<void(int64_t)> on_context_bytes_;
  absl::Mutex mu_;
  // Attached streams; a reader leaves (Detach) before it is deleted.
  std::set<ContextStreamReader*> readers_ ABSL_GUARDED_BY(mu_);
  // Ids of context streams (DrafterWorker::AddContext), from 1.
  std::atomic<uint64_t> next_stream_id_{1};
  RoundStreams rounds_;
};

}  // namespace dedit

#endif  // DEDIT_DRAFTER_SERVICE_DRAFTER_SERVICE_H_
