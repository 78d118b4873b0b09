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
// Draft/Release run on the engine thread; healthy()/block_size() and the
// info accessors are thread-safe.
#ifndef DEDIT_ROUTER_REMOTE_DRAFTER_H_
#define DEDIT_ROUTER_REMOTE_DRAFTER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "dedit/v1/services.grpc.pb.h"
#include "engine/round_interfaces.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace dedit {

class RemoteDrafter : public Drafter {
 public:
  struct Options {
    int64_t draft_timeout_ms = 2000;
    int64_t probe_interval_ms = 200;  // while unhealthy
    int64_t healthy_probe_interval_ms = 1000;
  };

  RemoteDrafter(std::shared_ptr<grpc::Channel> channel, Options options,
                uint32_t nonce);
  ~RemoteDrafter() override;  // Stop()s

  void Start();
  void Stop();

  absl::StatusOr<std::vector<DraftResult>> Draft(
      const std::vector<DraftRequest>& requests) override;
  absl::Status Release(SequenceId sequence) override;
  // Largest W; 0 until the drafter has been reached once.
  int block_size() const override { return block_size_.load(); }

  bool healthy() const { return healthy_.load(); }
  int num_passes() const { return num_passes_.load(); }  // checkpoint's K
  int max_passes() const { return max_passes_.load(); }

 private:
  void ProbeLoop();
  bool Probe();  // one health check (+ Info when needed); true = ready
  void MarkUnhealthy();

  std::unique_ptr<v1::Drafter::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
  Options options_;
  uint32_t nonce_;
  std::atomic<bool> healthy_{false};
  std::atomic<int> block_size_{0};
  std::atomic<int> num_passes_{0};
  std::atomic<int> max_passes_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // GUARDED_BY(mu_)
  std::thread prober_;
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_REMOTE_DRAFTER_H_
