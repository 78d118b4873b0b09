// The Drafter side of the round logic over dedit-drafter (gRPC), with the
// health tracking that decides whether new requests speculate.
//
// A failed Draft call (the drafter is down, slow past `draft_timeout_ms`,
// or answers garbage) returns an error: the engine decodes those requests
// target-only from then on. The drafter is then "unhealthy" and new
// requests are admitted target-only, until a background probe finds it
// SERVING again (grpc.health.v1, service "dedit.v1.Drafter": the drafter
// is ready only while the target's context stream is attached), after which
// new requests speculate again.
//
// An item the drafter could not draft (e.g. its context was lost when the
// drafter restarted) comes back as an empty DraftResult, which the engine
// treats as malformed: that request alone falls back.
//
//   RemoteDrafter drafter(channel, options, nonce);
//   drafter.Start();                  // health probes
//   if (drafter.healthy()) request.passes = K; else request.passes = 0;
//
// Draft/Release run on the engine thread; the DrafterHealth accessors are
// thread-safe.
#ifndef DEDIT_ROUTER_REMOTE_DRAFTER_H_
#define DEDIT_ROUTER_REMOTE_DRAFTER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/round_interfaces.h"
#include "common/serving/round_stream.h"
#include "dedit/v1/services.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "router/router_backends.h"

namespace dedit {

class RemoteDrafter : public Drafter, public DrafterHealth {
 public:
  struct Options {
    int64_t draft_timeout_ms = 2000;
    // Draft calls on one Drafter.Rounds stream instead of a unary call each.
    bool round_streams = true;
    // Runs each time a round stream is opened (may be empty).
    std::function<void()> on_round_stream_open;
    int64_t probe_interval_ms = 200;  // while unhealthy
    int64_t healthy_probe_interval_ms = 1000;
  };

  RemoteDrafter(std::shared_ptr<grpc::Channel> channel, Options options,
                uint32_t nonce);
  ~RemoteDrafter() override;  // Stop()s

  // Probes once (so healthy() is known on return), then keeps probing on
  // a background thread until Stop().
  void Start();
  void Stop();

  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) override;
  absl::Status Release(SequenceId sequence) override;

  // DrafterHealth (block_size() also serves the Drafter interface).
  int block_size() const override { return block_size_.load(); }
  int lookup_seed_ngram() const override { return lookup_seed_ngram_.load(); }
  bool healthy() const override { return healthy_.load(); }
  int num_passes() const override { return num_passes_.load(); }
  int max_passes() const override { return max_passes_.load(); }

 private:
  void ProbeLoop();
  bool Probe();  // one health check (+ Info when needed); true = ready
  void SetHealthy(bool healthy);

  std::unique_ptr<v1::Drafter::Stub> stub_;
  // Null with `round_streams` off.
  std::unique_ptr<RoundStreamClient<v1::DraftRequest, v1::DraftResponse>>
      rounds_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
  Options options_;
  uint32_t nonce_;
  // Read lock-free by the accessors. healthy_ is written under mu_ so that
  // the prober's wait sees a change.
  std::atomic<bool> healthy_{false};
  std::atomic<int> block_size_{0};
  std::atomic<int> lookup_seed_ngram_{0};
  std::atomic<int> num_passes_{0};
  std::atomic<int> max_passes_{0};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread prober_;
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_REMOTE_DRAFTER_H_
