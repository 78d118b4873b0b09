// The grpc.health.v1 statuses of a model service: its named service (e.g.
// "dedit.v1.Drafter") and the overall status "" (what Kubernetes probes),
// following conditions that change on other threads (docs/ARCHITECTURE.md,
// "Health"):
//   - warmed up: the model thread ran its warm-up forward (SetWarmedUp,
//     which ServeUntilSignal calls once its warm_up hook returned OK);
//   - poisoned: a sticky device error (SetPoisoned; for good);
//   - ready: the service's own condition (Set), e.g. the drafter's "a
//     context stream is attached"; the target's is always true.
// Overall "" = warmed up and not poisoned (liveness: NOT_SERVING after a
// sticky error gets the pod restarted). Named = overall and ready. Both
// start NOT_SERVING. The conditions may change before the server exists
// and during the drain; while a health service is attached, it always
// shows the latest values.
//
//   ServiceReadiness readiness("dedit.v1.Drafter");
//   // any thread, e.g. when a stream attaches or detaches:
//   readiness.Set(streams > 0);
//   // the model thread, on a sticky device error:
//   readiness.SetPoisoned();
//   serve.readiness = &readiness;   // ServeUntilSignal publishes it
//
// Thread-safe.
#ifndef DEDIT_SERVING_SERVICE_READINESS_H_
#define DEDIT_SERVING_SERVICE_READINESS_H_

#include <grpcpp/health_check_service_interface.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dedit {

class ServiceReadiness {
 public:
  // `ready`: the service's own condition until Set() changes it.
  explicit ServiceReadiness(std::string service_name, bool ready = false);
  ServiceReadiness(const ServiceReadiness&) = delete;
  ServiceReadiness& operator=(const ServiceReadiness&) = delete;

  // Records the service's own condition and publishes the statuses when a
  // health service is attached.
  void Set(bool ready) ABSL_LOCKS_EXCLUDED(mu_);
  // The model ran its warm-up forward.
  void SetWarmedUp() ABSL_LOCKS_EXCLUDED(mu_);
  // A sticky device error: NOT_SERVING, overall and named, from now on.
  void SetPoisoned() ABSL_LOCKS_EXCLUDED(mu_);

  // The named service's status: warmed up, not poisoned, and ready.
  bool serving() const ABSL_LOCKS_EXCLUDED(mu_);
  // The overall status "": warmed up and not poisoned.
  bool live() const ABSL_LOCKS_EXCLUDED(mu_);

  // Attaches `health` and publishes the current statuses to it; nullptr
  // detaches (later changes are only recorded). Detach before the drain:
  // the server already reports NOT_SERVING for every name then, and
  // `health` dies with the server.
  void PublishTo(grpc::HealthCheckServiceInterface* health)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool LiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return warmed_up_ && !poisoned_;
  }
  bool ServingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return LiveLocked() && ready_;
  }
  // Publishes both statuses when attached.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string service_name_;
  // Held while publishing, an exception to "no lock across a call out":
  // it makes the last status set the last one published, and
  // SetServingStatus only updates the health service's own table, never
  // calling back into this class.
  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_);
  bool warmed_up_ ABSL_GUARDED_BY(mu_) = false;
  bool poisoned_ ABSL_GUARDED_BY(mu_) = false;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace dedit

#endif  // DEDIT_SERVING_SERVICE_READINESS_H_
