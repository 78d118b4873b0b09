// The target's end of the context stream (docs/ARCHITECTURE.md §3): committed
// tokens' features, converted to bf16, written in order on one long-lived
// Drafter.StreamContext call.
//
// The model thread only enqueues (OnContext/OnRelease never block on the
// network, and the features tensor is queued as it is: the copy to the host
// and the bf16 conversion run on the writer thread, so a device-to-host copy
// never stalls the model thread before Verify is answered); a writer thread
// owns the call. When the drafter is down the
// writer reconnects with backoff and chunks are dropped meanwhile: the
// drafter then lacks those sequences' context, their drafts fail, and the
// router decodes them target-only — speed lost, never correctness. A bounded
// queue (`max_queued_bytes`) keeps a stalled drafter from exhausting memory.
//
//   ContextStreamClient stream(channel, {.max_queued_bytes = 1 << 30},
//                              [](int64_t bytes) { counter.Increment(bytes);
//                              });
//   stream.Start();
//   TargetWorker worker(model, &stream, ...);
#ifndef DEDIT_TARGET_SERVICE_CONTEXT_STREAM_CLIENT_H_
#define DEDIT_TARGET_SERVICE_CONTEXT_STREAM_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "dedit/v1/services.grpc.pb.h"
#include "target_service/target_worker.h"

namespace dedit {

class ContextStreamClient : public ContextPublisher {
 public:
  struct Options {
    int64_t max_queued_bytes = int64_t{1} << 30;
    int reconnect_backoff_ms = 200;
  };
  using BytesObserver = std::function<void(int64_t bytes)>;

  ContextStreamClient(std::shared_ptr<grpc::Channel> channel, Options options,
                      BytesObserver on_bytes_sent);
  ~ContextStreamClient() override;  // Stop()s

  void Start();
  // Sends what is queued (bounded by `drain_ms`), ends the stream, joins.
  void Stop(int drain_ms = 1000) ABSL_LOCKS_EXCLUDED(mu_);

  // Thread-safe; never block on the network.
  absl::Status OnContext(SequenceId sequence, int64_t start,
                         const at::Tensor& features) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnRelease(SequenceId sequence) override ABSL_LOCKS_EXCLUDED(mu_);

  bool connected() const { return connected_.load(); }
  int64_t dropped_chunks() const { return dropped_chunks_.load(); }

 private:
  // A chunk waiting for the writer: its features are serialized there.
  struct Pending {
    v1::ContextChunk chunk;
    at::Tensor features;  // undefined for a release marker
    int64_t bytes = 0;    // bf16 bytes on the wire
  };
  void Enqueue(Pending pending) ABSL_LOCKS_EXCLUDED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes until the queue is drained and stopping, or the call breaks.
  void WriteLoop(grpc::ClientWriter<v1::ContextChunk>* writer)
      ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<v1::Drafter::Stub> stub_;
  Options options_;
  BytesObserver on_bytes_sent_;
  std::atomic<bool> connected_{false};
  std::atomic<int64_t> dropped_chunks_{0};

  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point stop_deadline_ ABSL_GUARDED_BY(mu_);
  // The writer thread's call while one is open; the lock keeps it alive for
  // Stop()'s TryCancel.
  grpc::ClientContext* current_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace dedit

#endif  // DEDIT_TARGET_SERVICE_CONTEXT_STREAM_CLIENT_H_
