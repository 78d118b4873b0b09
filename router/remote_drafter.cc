#include "router/remote_drafter.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/serving/fire_and_forget.h"
#include "proto/grpc_status.h"
#include "router/remote_verifier.h"

namespace dedit {
namespace {

constexpr char kReadinessService[] = "dedit.v1.Drafter";

std::chrono::system_clock::time_point In(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

}  // namespace

RemoteDrafter::RemoteDrafter(std::shared_ptr<grpc::Channel> channel,
                             Options options, uint32_t nonce)
    : stub_(v1::Drafter::NewStub(channel)),
      health_stub_(grpc::health::v1::Health::NewStub(channel)),
      options_(options),
      nonce_(nonce) {
  if (options_.round_streams) {
    rounds_ = std::make_unique<
        RoundStreamClient<v1::DraftRequest, v1::DraftResponse>>(
        [stub = stub_.get()](grpc::ClientContext* context,
                             grpc::CompletionQueue* cq) {
          return stub->PrepareAsyncRounds(context, cq);
        },
        options_.on_round_stream_open);
  }
}

RemoteDrafter::~RemoteDrafter() { Stop(); }

void RemoteDrafter::Start() {
  Probe();
  prober_ = std::thread([this] { ProbeLoop(); });
}

void RemoteDrafter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (prober_.joinable()) prober_.join();
}

void RemoteDrafter::SetHealthy(bool healthy) {
  // Under mu_: releasing it wakes a prober waiting for a health change.
  absl::MutexLock lock(&mu_);
  healthy_.store(healthy);
}

bool RemoteDrafter::Probe() {
  grpc::ClientContext context;
  context.set_deadline(In(500));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(kReadinessService);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = health_stub_->Check(&context, request, &response);
  bool ready =
      status.ok() &&
      response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  if (ready) {
    // Refresh the drafter's limits (a restarted drafter may differ).
    grpc::ClientContext info_context;
    info_context.set_deadline(In(500));
    v1::DrafterInfoResponse info;
    ready = stub_->Info(&info_context, v1::DrafterInfoRequest(), &info).ok();
    if (ready) {
      block_size_.store(info.block_size());
      lookup_seed_ngram_.store(info.lookup_seed_ngram());
      num_passes_.store(info.num_passes());
      max_passes_.store(info.max_passes());
    }
  }
  SetHealthy(ready);
  return ready;
}

void RemoteDrafter::ProbeLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      const bool was_healthy = healthy_.load();
      auto stop_or_change = [this,
                             was_healthy]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || healthy_.load() != was_healthy;
      };
      const bool woken = mu_.AwaitWithTimeout(
          absl::Condition(&stop_or_change),
          absl::Milliseconds(was_healthy ? options_.healthy_probe_interval_ms
                                         : options_.probe_interval_ms));
      if (stopping_) return;
      // A failed Draft call made the drafter unhealthy: wait the shorter
      // unhealthy interval from now, then probe (an immediate probe would
      // readmit a drafter that is up but too slow).
      if (woken) continue;
    }
    Probe();
  }
}

absl::StatusOr<std::vector<DraftResult>> RemoteDrafter::Draft(
    const std::vector<DraftRequest>& requests) {
  if (!healthy_.load()) {
    return absl::UnavailableError("drafter is not ready");
  }
  v1::DraftRequest request;
  for (const DraftRequest& r : requests) {
    v1::DraftItem* item = request.add_items();
    item->set_sequence(WireSequenceId(nonce_, r.sequence));
    item->set_start(r.start);
    item->set_bonus(r.bonus);
    item->set_window(r.window);
    item->set_passes(r.passes);
    item->mutable_seed()->Add(r.seed.begin(), r.seed.end());
  }
  v1::DraftResponse response;
  absl::Status status;
  if (rounds_ != nullptr) {
    status = rounds_->Call(request, &response, In(options_.draft_timeout_ms));
  } else {
    grpc::ClientContext context;
    context.set_deadline(In(options_.draft_timeout_ms));
    status = FromGrpcStatus(stub_->Draft(&context, request, &response));
  }
  if (!status.ok()) {
    SetHealthy(false);
    return Annotate(status, "drafter Draft");
  }
  if (response.results_size() != static_cast<int>(requests.size())) {
    SetHealthy(false);
    return absl::InternalError("drafter returned a wrong result count");
  }
  std::vector<DraftResult> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const v1::DraftOutput& out = response.results(static_cast<int>(i));
    if (out.code() != 0) continue;  // empty result → that request falls back
    for (const v1::DraftPassTokens& p : out.passes()) {
      DraftPass pass;
      pass.tokens.assign(p.tokens().begin(), p.tokens().end());
      pass.confidences.assign(p.confidences().begin(), p.confidences().end());
      results[i].passes.push_back(std::move(pass));
    }
  }
  return results;
}

absl::Status RemoteDrafter::Release(SequenceId sequence) {
  v1::DrafterReleaseRequest request;
  request.add_sequences(WireSequenceId(nonce_, sequence));
  FireAndForget(stub_->async(), &v1::Drafter::Stub::async::Release,
                std::move(request));
  return absl::OkStatus();
}

}  // namespace dedit
