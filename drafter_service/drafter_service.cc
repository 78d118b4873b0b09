#include "drafter_service/drafter_service.h"

#include <ATen/Functions.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/torch_status.h"
#include "common/serving/model_service_reactors.h"
#include "proto/grpc_status.h"
#include "proto/tensor_wire.h"

namespace dedit {
namespace {

// A CPU tensor owning a copy of the wire bytes.
absl::StatusOr<at::Tensor> ToTensor(const v1::Tensor& wire) {
  absl::StatusOr<WireTensorView> view = ViewWireTensor(wire);
  if (!view.ok()) return view.status();
  if (view->shape.size() != 2) {
    return absl::InvalidArgumentError("context features must be [n, width]");
  }
  const at::ScalarType dtype =
      view->dtype == WireDtype::kBFloat16  ? at::kBFloat16
      : view->dtype == WireDtype::kFloat16 ? at::kHalf
                                           : at::kFloat;
  return GuardTorch([&] {
    return at::from_blob(const_cast<void*>(view->data), view->shape,
                         at::TensorOptions().dtype(dtype))
        .clone();
  });
}

}  // namespace

// Reads context chunks until the target ends the stream; never blocks
// (AddContext only enqueues).
class ContextStreamReader : public grpc::ServerReadReactor<v1::ContextChunk> {
 public:
  ContextStreamReader(DrafterServiceImpl* service,
                      v1::StreamContextSummary* summary)
      : service_(service),
        summary_(summary),
        stream_id_(service->next_stream_id_.fetch_add(1)) {
    service_->Attach(this);
    StartSendInitialMetadata();
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    summary_->set_chunks(summary_->chunks() + 1);
    summary_->set_bytes(summary_->bytes() + chunk_.features().data().size());
    if (chunk_.release()) {
      service_->worker_->ReleaseFromStream(chunk_.sequence());
    } else if (chunk_.has_features()) {
      // Refused before the rows are copied: a sequence never holds more
      // context than the model's positions.
      const int64_t rows =
          chunk_.features().shape_size() > 0 ? chunk_.features().shape(0) : 0;
      const int64_t limit = service_->worker_->max_context_tokens();
      if (chunk_.start() < 0 || rows < 0 || rows > limit - chunk_.start()) {
        FinishOnce(ToGrpcStatus(absl::OutOfRangeError(
            absl::StrCat("context chunk of sequence ", chunk_.sequence(),
                         " has start ", chunk_.start(), " and ", rows,
                         " rows, past the drafter's max context of ", limit,
                         " positions"))));
        return;
      }
      absl::StatusOr<at::Tensor> features = ToTensor(chunk_.features());
      if (!features.ok()) {
        FinishOnce(ToGrpcStatus(features.status()));
        return;
      }
      if (service_->on_context_bytes_) {
        service_->on_context_bytes_(
            static_cast<int64_t>(chunk_.features().data().size()));
      }
      service_->worker_->AddContext(chunk_.sequence(), chunk_.start(),
                                    std::move(*features), stream_id_);
    }  // else: the target's liveness probe (an empty chunk)
    StartRead(&chunk_);
  }

  void OnDone() override {
    // What this stream fed is dropped (DrafterWorker::EndStream).
    service_->worker_->EndStream(stream_id_);
    service_->Detach(this);
    delete this;
  }

  // The first call finishes the stream; later ones do nothing.
  void FinishOnce(grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(std::move(status));
  }

 private:
  DrafterServiceImpl* service_;
  v1::StreamContextSummary* summary_;
  const uint64_t stream_id_;
  v1::ContextChunk chunk_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

DrafterServiceImpl::DrafterServiceImpl(
    DrafterWorker* worker, Identity identity,
    std::function<void(int)> on_streams_changed,
    std::function<void(int64_t)> on_context_bytes)
    : worker_(worker),
      identity_(std::move(identity)),
      on_streams_changed_(std::move(on_streams_changed)),
      on_context_bytes_(std::move(on_context_bytes)) {}

DrafterServiceImpl::~DrafterServiceImpl() = default;

void DrafterServiceImpl::Attach(ContextStreamReader* reader) {
  absl::MutexLock lock(&mu_);
  readers_.insert(reader);
  if (on_streams_changed_)
    on_streams_changed_(static_cast<int>(readers_.size()));
}

void DrafterServiceImpl::Detach(ContextStreamReader* reader) {
  absl::MutexLock lock(&mu_);
  readers_.erase(reader);
  if (on_streams_changed_)
    on_streams_changed_(static_cast<int>(readers_.size()));
}

void DrafterServiceImpl::FinishStreams() {
  rounds_.Drain();
  // Under the lock: a reader deletes itself after Detach, so only the lock
  // keeps each one alive here. FinishOnce never blocks, and gRPC never runs
  // a read reactor's OnDone (which takes the lock) inline in Finish.
  absl::MutexLock lock(&mu_);
  for (ContextStreamReader* r : readers_) r->FinishOnce(grpc::Status::OK);
}

grpc::ServerReadReactor<v1::ContextChunk>* DrafterServiceImpl::StreamContext(
    grpc::CallbackServerContext*, v1::StreamContextSummary* summary) {
  return new ContextStreamReader(this, summary);
}

void DrafterServiceImpl::RunDraft(const v1::DraftRequest& request,
                                  v1::DraftResponse* response,
                                  const std::string& peer,
                                  std::function<void(absl::Status)> done) {
  const absl::Status poisoned = worker_->poisoned();
  if (!poisoned.ok()) {
    done(poisoned);
    return;
  }
  std::vector<DraftRequest> requests;
  requests.reserve(request.items_size());
  for (const v1::DraftItem& d : request.items()) {
    requests.push_back(
        {d.sequence(), d.start(), d.bonus(), d.window(), d.passes()});
    // Bounded by the request size; CheckRequest holds it to window - 1.
    requests.back().seed.assign(d.seed().begin(), d.seed().end());
  }
  worker_->Draft(
      std::move(requests),
      [response, done = std::move(done)](
          std::vector<absl::StatusOr<DraftResult>> results) {
        for (absl::StatusOr<DraftResult>& r : results) {
          v1::DraftOutput* out = response->add_results();
          if (!r.ok()) {
            out->set_code(static_cast<int>(r.status().code()));
            out->set_message(std::string(r.status().message()));
            continue;
          }
          for (const DraftPass& pass : r->passes) {
            v1::DraftPassTokens* p = out->add_passes();
            p->mutable_tokens()->Add(pass.tokens.begin(), pass.tokens.end());
            p->mutable_confidences()->Add(pass.confidences.begin(),
                                          pass.confidences.end());
          }
        }
        done(absl::OkStatus());
      },
      // Fair share per caller: a router's connection (DrafterWorker).
      peer);
}

grpc::ServerUnaryReactor* DrafterServiceImpl::Draft(
    grpc::CallbackServerContext* context, const v1::DraftRequest* request,
    v1::DraftResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  RunDraft(*request, response, context->peer(), [reactor](absl::Status status) {
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::DraftRequest, v1::DraftResponse>*
DrafterServiceImpl::Rounds(grpc::CallbackServerContext* context) {
  return new RoundStreamReactor<v1::DraftRequest, v1::DraftResponse>(
      &rounds_,
      [this, peer = context->peer()](const v1::DraftRequest& request,
                                     v1::DraftResponse* response,
                                     std::function<void(absl::Status)> done) {
        RunDraft(request, response, peer, std::move(done));
      });
}

grpc::ServerUnaryReactor* DrafterServiceImpl::Release(
    grpc::CallbackServerContext* context,
    const v1::DrafterReleaseRequest* request,
    v1::DrafterReleaseResponse* response) {
  return ReleaseReactor(context, worker_, *request, response);
}

grpc::ServerUnaryReactor* DrafterServiceImpl::Info(
    grpc::CallbackServerContext* context, const v1::DrafterInfoRequest*,
    v1::DrafterInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const DrafterConfig& c = worker_->config();
  response->set_model_name(identity_.model_name);
  response->set_block_size(c.block_size);
  response->set_num_passes(c.num_passes);
  response->set_lookup_seed_ngram(c.lookup_seed_ngram);
  response->set_max_passes(worker_->options().max_passes);
  response->set_feature_width(static_cast<int>(c.target_layer_ids.size()) *
                              c.layers.hidden_size);
  response->set_vocab_size(c.layers.vocab_size);
  response->set_device(identity_.device);
  const DrafterWorker::Snapshot s = worker_->snapshot();
  response->set_num_sequences(s.num_sequences);
  response->set_context_tokens(s.context_tokens);
  response->set_kv_bytes_in_use(s.kv_bytes_in_use);
  response->set_kv_bytes_held(s.kv_bytes_held);
  {
    absl::MutexLock lock(&mu_);
    response->set_context_streams(static_cast<int>(readers_.size()));
  }
  response->set_round_streams(rounds_.size());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace dedit
