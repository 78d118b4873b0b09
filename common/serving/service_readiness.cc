#include "common/serving/service_readiness.h"

#include <utility>

namespace dedit {

ServiceReadiness::ServiceReadiness(std::string service_name, bool ready)
    : service_name_(std::move(service_name)), ready_(ready) {}

void ServiceReadiness::Set(bool ready) {
  absl::MutexLock lock(&mu_);
  ready_ = ready;
  PublishLocked();
}

void ServiceReadiness::SetWarmedUp() {
  absl::MutexLock lock(&mu_);
  warmed_up_ = true;
  PublishLocked();
}

void ServiceReadiness::SetPoisoned() {
  absl::MutexLock lock(&mu_);
  poisoned_ = true;
  PublishLocked();
}

bool ServiceReadiness::serving() const {
  absl::MutexLock lock(&mu_);
  return ServingLocked();
}

bool ServiceReadiness::live() const {
  absl::MutexLock lock(&mu_);
  return LiveLocked();
}

void ServiceReadiness::PublishTo(grpc::HealthCheckServiceInterface* health) {
  absl::MutexLock lock(&mu_);
  health_ = health;
  PublishLocked();
}

void ServiceReadiness::PublishLocked() {
  if (health_ == nullptr) return;
  health_->SetServingStatus("", LiveLocked());
  health_->SetServingStatus(service_name_, ServingLocked());
}

}  // namespace dedit
