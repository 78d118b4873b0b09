#include "gateway/openai_server.h"

#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/serving/server_bootstrap.h"
#include "common/serving/shutdown_signals.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gateway/generate_call.h"
#include "gateway/http_metrics.h"
#include "gateway/http_server.h"
#include "gateway/openai_request.h"
#include "gateway/openai_response.h"

namespace dedit {
namespace {

// How often a non-streamed request checks that its client is still there.
constexpr int kDisconnectCheckMs = 100;
// Deadline of a ListModels call (/health, /v1/models, the model card).
constexpr auto kListModelsTimeout = std::chrono::seconds(5);

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

HttpResponse ErrorResponse(const ApiError& error) {
  HttpResponse response;
  response.status = error.http_status;
  if (error.http_status == 429 || error.http_status == 503) {
    response.headers.emplace_back("Retry-After", "1");
  }
  response.body = error.Body();
  return response;
}

HttpResponse JsonResponse(const json& body) {
  HttpResponse response;
  response.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return response;
}

ApiError ServerError(int status, std::string message, std::string type,
                     std::string code) {
  ApiError e;
  e.http_status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

// The HTTP server's own refusals (limits, framing, connection counts) in
// OpenAI's error shape.
HttpResponse Refusal(int status, const std::string& message) {
  switch (status) {
    case 429:
      return ErrorResponse(ServerError(status, message, "rate_limit_error",
                                       "too_many_connections"));
    case 503:
      return ErrorResponse(ServerError(status, message,
                                       "service_unavailable_error",
                                       "too_many_connections"));
    case 408:
      return ErrorResponse(
          ServerError(status, message, "timeout_error", "request_timeout"));
    case 500:
      return ErrorResponse(
          ServerError(status, message, "server_error", "internal"));
    default:
      return ErrorResponse(
          ServerError(status, message, "invalid_request_error", ""));
  }
}

class OpenAiFront {
 public:
  OpenAiFront(const OpenAiServerOptions& options, const InternalAuth& auth)
      : options_(options),
        stub_(v1::Generation::NewStub(
            auth.Channel(options.router_address, grpc::ChannelArguments()))),
        registry_(std::make_shared<prometheus::Registry>()),
        metrics_(*registry_),
        created_(std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count()),
        server_(options.http, Callbacks()),
        generations_(options.max_concurrent_generations) {}

  absl::Status Serve();

 private:
  // A completion request in flight: its router call, registered so that
  // the drain can cancel it.
  class Generation {
   public:
    Generation(OpenAiFront* front, bool stream, const v1::GenerateRequest& r)
        : front_(front),
          stream_(stream),
          call_(front->stub_.get(), r,
                std::chrono::system_clock::now() +
                    std::chrono::milliseconds(
                        front->options_.request_timeout_ms)) {
      front_->Register(&call_, stream_);
    }
    ~Generation() { front_->Unregister(&call_, stream_); }
    GenerateCall& call() { return call_; }

   private:
    OpenAiFront* const front_;
    const bool stream_;
    GenerateCall call_;
  };

  HttpServer::Callbacks Callbacks();
  // Runs `handle`; an exception (a bug: requests are validated) answers
  // 500 and is logged, instead of ending the thread and the process.
  template <typename Handle>
  void Guarded(HttpExchange& exchange, Handle handle);
  // On an io thread: routes a request. Never blocks.
  void Handle(std::shared_ptr<HttpExchange> exchange);
  // On an io thread: the drain and slot checks, then the generation pool.
  void AdmitGeneration(Endpoint endpoint,
                       std::shared_ptr<HttpExchange> exchange);
  // On a generation pool thread, holding a slot.
  void RunGeneration(Endpoint endpoint, HttpExchange& exchange);
  void Stream(GenerateCall& call, OpenAiResponse& response,
              const v1::GenerateResponse& first, HttpExchange& exchange);
  void HandleModels(std::shared_ptr<HttpExchange> exchange);
  void HandleHealth(std::shared_ptr<HttpExchange> exchange);

  // The router's model (cached after the first answer; asked again while
  // unknown). UNAVAILABLE while the router has none. Blocks up to 5 s.
  absl::StatusOr<v1::ModelCard> Model(bool refresh);
  // The same question without blocking: `done` runs on a gRPC thread.
  void AskModel(std::function<void(absl::StatusOr<v1::ModelCard>)> done);
  absl::StatusOr<v1::ModelCard> CardFrom(const grpc::Status& status,
                                         const v1::ListModelsResponse& models);

  // Takes a slot; false when --max_concurrent_generations are running.
  bool TryAcquireSlot();
  void ReleaseSlot() { running_.fetch_sub(1); }
  void Register(GenerateCall* call, bool stream);
  void Unregister(GenerateCall* call, bool stream);
  void CancelAll();
  void Drain();

  const OpenAiServerOptions options_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::shared_ptr<prometheus::Registry> registry_;
  HttpMetrics metrics_;
  const int64_t created_;
  std::atomic<int> running_{0};
  std::atomic<bool> draining_{false};

  absl::Mutex mu_;
  std::optional<v1::ModelCard> model_ ABSL_GUARDED_BY(mu_);
  std::set<GenerateCall*> calls_ ABSL_GUARDED_BY(mu_);
  int model_calls_ ABSL_GUARDED_BY(mu_) = 0;  // AskModel calls in flight

  // Destroyed in reverse: the pool's threads are joined before the server
  // (whose connections they write to) stops.
  HttpServer server_;
  boost::asio::thread_pool generations_;
};

HttpServer::Callbacks OpenAiFront::Callbacks() {
  HttpServer::Callbacks callbacks;
  callbacks.handle = [this](std::shared_ptr<HttpExchange> exchange) {
    // A copy goes to Handle: this one keeps the exchange for the guard.
    Guarded(*exchange, [&] { Handle(exchange); });
  };
  callbacks.refusal = Refusal;
  callbacks.on_response = [this](const std::string& path, int status,
                                 std::optional<double> seconds) {
    metrics_.OnResponse(HttpMetrics::RouteLabel(path), status, seconds);
  };
  return callbacks;
}

template <typename Handle>
void OpenAiFront::Guarded(HttpExchange& exchange, Handle handle) {
  try {
    handle();
  } catch (const std::exception& e) {
    std::cerr << "dedit-openai: internal error on " << exchange.request().method
              << " " << exchange.request().path << ": " << e.what() << "\n";
    exchange.Respond(ErrorResponse(
        ServerError(500, "internal error", "server_error", "internal")));
  }
}

bool OpenAiFront::TryAcquireSlot() {
  if (running_.fetch_add(1) >= options_.max_concurrent_generations) {
    running_.fetch_sub(1);
    return false;
  }
  return true;
}

void OpenAiFront::Register(GenerateCall* call, bool stream) {
  metrics_.OnGenerationStarted(stream);
  absl::MutexLock lock(&mu_);
  calls_.insert(call);
}

void OpenAiFront::Unregister(GenerateCall* call, bool stream) {
  metrics_.OnGenerationFinished(stream);
  absl::MutexLock lock(&mu_);
  calls_.erase(call);
}

void OpenAiFront::CancelAll() {
  absl::MutexLock lock(&mu_);
  for (GenerateCall* call : calls_) call->Cancel();
}

absl::StatusOr<v1::ModelCard> OpenAiFront::CardFrom(
    const grpc::Status& status, const v1::ListModelsResponse& models) {
  if (!status.ok()) {
    // The detail (the router's address, the socket error) is the
    // operator's, in the log; a client learns only that it is down.
    std::cerr << "dedit-openai: router unreachable: " << status.error_message()
              << "\n";
    return absl::UnavailableError("the model server is unavailable");
  }
  if (models.models_size() == 0) {
    return absl::UnavailableError("the router serves no model yet");
  }
  absl::MutexLock lock(&mu_);
  model_ = models.models(0);
  return *model_;
}

absl::StatusOr<v1::ModelCard> OpenAiFront::Model(bool refresh) {
  if (!refresh) {
    absl::MutexLock lock(&mu_);
    if (model_) return *model_;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kListModelsTimeout);
  v1::ListModelsResponse models;
  const grpc::Status status = stub_->ListModels(&context, {}, &models);
  return CardFrom(status, models);
}

void OpenAiFront::AskModel(
    std::function<void(absl::StatusOr<v1::ModelCard>)> done) {
  struct Call {
    grpc::ClientContext context;
    v1::ListModelsRequest request;
    v1::ListModelsResponse response;
    std::function<void(absl::StatusOr<v1::ModelCard>)> done;
  };
  auto call = std::make_shared<Call>();
  call->done = std::move(done);
  call->context.set_deadline(std::chrono::system_clock::now() +
                             kListModelsTimeout);
  {
    absl::MutexLock lock(&mu_);
    ++model_calls_;
  }
  stub_->async()->ListModels(&call->context, &call->request, &call->response,
                             [this, call](grpc::Status status) {
                               call->done(CardFrom(status, call->response));
                               absl::MutexLock lock(&mu_);
                               --model_calls_;
                             });
}

void OpenAiFront::Handle(std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& request = exchange->request();
  const std::string& path = request.path;
  auto wrong_method = [&](const char* allowed) {
    ApiError e = ServerError(
        405, absl::StrCat(request.method, " is not allowed on ", path),
        "invalid_request_error", "");
    HttpResponse response = ErrorResponse(e);
    response.headers.emplace_back("Allow", allowed);
    exchange->Respond(std::move(response));
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (request.method != "POST") return wrong_method("POST");
    return AdmitGeneration(path == "/v1/completions"
                               ? Endpoint::kCompletions
                               : Endpoint::kChatCompletions,
                           std::move(exchange));
  }
  if (path == "/v1/models" || path == "/health" || path == "/metrics") {
    if (request.method != "GET") return wrong_method("GET");
    if (path == "/v1/models") return HandleModels(std::move(exchange));
    if (path == "/health") return HandleHealth(std::move(exchange));
    // Serialized here, on the io thread: it takes microseconds and needs
    // no pool, so nothing can queue ahead of it.
    HttpResponse metrics;
    metrics.content_type = "text/plain; version=0.0.4";
    metrics.body = prometheus::TextSerializer().Serialize(registry_->Collect());
    return exchange->Respond(std::move(metrics));
  }
  ApiError e =
      ServerError(404, absl::StrCat("no route for ", request.method, " ", path),
                  "not_found_error", "");
  exchange->Respond(ErrorResponse(e));
}

void OpenAiFront::AdmitGeneration(Endpoint endpoint,
                                  std::shared_ptr<HttpExchange> exchange) {
  if (draining_) {
    return exchange->Respond(
        ErrorResponse(ServerError(503, "the server is shutting down",
                                  "service_unavailable_error", "draining")));
  }
  if (!TryAcquireSlot()) {
    return exchange->Respond(ErrorResponse(ServerError(
        429,
        absl::StrCat("too many concurrent requests (at most ",
                     options_.max_concurrent_generations, "); retry later"),
        "rate_limit_error", "too_many_concurrent_requests")));
  }
  // The pool has a thread per slot, so the task starts at once.
  boost::asio::post(
      generations_, [this, endpoint, exchange = std::move(exchange)] {
        Guarded(*exchange, [&] { RunGeneration(endpoint, *exchange); });
        ReleaseSlot();
      });
}

void OpenAiFront::RunGeneration(Endpoint endpoint, HttpExchange& exchange) {
  absl::StatusOr<v1::ModelCard> card = Model(/*refresh=*/false);
  if (!card.ok()) {
    return exchange.Respond(
        ErrorResponse(ServerError(503, std::string(card.status().message()),
                                  "service_unavailable_error", "unavailable")));
  }
  ServedModel served;
  served.name = card->name();
  served.max_tokens_limit = card->max_tokens_limit();
  served.default_chat_max_tokens = options_.default_chat_max_tokens;
  OpenAiRequest request;
  const std::string& body = exchange.request().body;
  std::optional<ApiError> error =
      ParseOpenAiRequest(endpoint, body, served, &request);
  if (error && error->code == "model_not_found") {
    // The router may have been restarted with another model.
    card = Model(/*refresh=*/true);
    if (card.ok() && card->name() != served.name) {
      served.name = card->name();
      request = OpenAiRequest();
      error = ParseOpenAiRequest(endpoint, body, served, &request);
    }
  }
  if (error) return exchange.Respond(ErrorResponse(*error));

  Generation generation(this, request.stream, request.generate);
  GenerateCall& call = generation.call();
  OpenAiResponse response(endpoint, request.model, request.include_usage);
  // Nothing is sent before the router's first answer: a request it refuses
  // gets the right HTTP status, not a 200 stream carrying an error.
  v1::GenerateResponse message;
  if (call.Next(absl::InfiniteDuration(), &message) ==
      GenerateCall::Event::kFinished) {
    const grpc::Status status = call.status();
    return exchange.Respond(ErrorResponse(
        status.ok() ? ServerError(500, "the router sent no response",
                                  "server_error", "internal")
                    : ApiErrorFromGrpc(status, endpoint)));
  }
  if (request.stream) return Stream(call, response, message, exchange);
  // One body at the end: the client's connection is checked while waiting,
  // and a client that went away cancels the router call (freeing the
  // sequence), as a failed write does for a stream.
  response.Append(message);
  while (true) {
    const GenerateCall::Event event =
        call.Next(absl::Milliseconds(kDisconnectCheckMs), &message);
    if (event == GenerateCall::Event::kFinished) break;
    if (event == GenerateCall::Event::kMessage) response.Append(message);
    if (exchange.ClientGone()) {
      call.Cancel();
      metrics_.OnClientDisconnect();
      HttpResponse gone;
      gone.status = 499;  // nginx's "client closed request", for metrics
      return exchange.Respond(std::move(gone));  // nobody reads it
    }
  }
  const grpc::Status status = call.status();
  if (!status.ok()) {
    return exchange.Respond(ErrorResponse(ApiErrorFromGrpc(status, endpoint)));
  }
  HttpResponse done;
  done.body = response.Body();
  exchange.Respond(std::move(done));
}

void OpenAiFront::Stream(GenerateCall& call, OpenAiResponse& response,
                         const v1::GenerateResponse& first,
                         HttpExchange& exchange) {
  HttpResponse head;
  head.content_type = "text/event-stream";
  head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
  const absl::Duration heartbeat =
      absl::Milliseconds(options_.sse_heartbeat_ms);
  // A write fails once the client is gone or stopped reading for
  // --write_timeout_s; the heartbeat makes one happen while the router is
  // quiet. A message whose text is held back (a possible stop string, an
  // incomplete UTF-8 sequence) writes nothing.
  bool ok = exchange.StartStream(head) &&
            exchange.Write(response.StreamEvents(first));
  bool finished = false;
  while (ok && !finished) {
    v1::GenerateResponse message;
    switch (call.Next(heartbeat, &message)) {
      case GenerateCall::Event::kMessage:
        ok = exchange.Write(response.StreamEvents(message));
        break;
      case GenerateCall::Event::kTimeout:
        ok = exchange.Write(": keep-alive\n\n");
        break;
      case GenerateCall::Event::kFinished:
        finished = true;
        break;
    }
    ok = ok && !exchange.ClientGone();
  }
  if (finished) {
    const grpc::Status status = call.status();
    exchange.Write(status.ok() ? response.StreamEnd()
                               : OpenAiResponse::StreamError(ApiErrorFromGrpc(
                                     status, Endpoint::kCompletions)));
  } else {
    call.Cancel();  // the Generation's end waits for the call's
    metrics_.OnClientDisconnect();
  }
  exchange.EndStream();
}

void OpenAiFront::HandleModels(std::shared_ptr<HttpExchange> exchange) {
  // While the router is down or serves nothing, 503: an empty list would
  // tell a client that no model exists.
  AskModel([this, exchange](absl::StatusOr<v1::ModelCard> card) {
    if (!card.ok()) {
      return exchange->Respond(ErrorResponse(
          ServerError(503, std::string(card.status().message()),
                      "service_unavailable_error", "unavailable")));
    }
    json data = json::array();
    data.push_back({{"id", card->name()},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "dedit"},
                    {"root", card->name()},
                    {"max_model_len", card->max_context()}});
    exchange->Respond(JsonResponse({{"object", "list"}, {"data", data}}));
  });
}

void OpenAiFront::HandleHealth(std::shared_ptr<HttpExchange> exchange) {
  if (draining_) {
    return exchange->Respond(ErrorResponse(ServerError(
        503, "shutting down", "service_unavailable_error", "draining")));
  }
  AskModel([exchange](absl::StatusOr<v1::ModelCard> card) {
    if (!card.ok()) {
      return exchange->Respond(ErrorResponse(
          ServerError(503, std::string(card.status().message()),
                      "service_unavailable_error", "unavailable")));
    }
    exchange->Respond(
        JsonResponse({{"status", "ok"}, {"model", card->name()}}));
  });
}

void OpenAiFront::Drain() {
  draining_ = true;
  auto wait_idle = [&](int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (running_.load() > 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return running_.load() == 0;
  };
  if (!wait_idle(options_.drain_timeout_ms)) {
    CancelAll();  // streams end with an error event, then [DONE]
    wait_idle(5000);
  }
}

absl::Status OpenAiFront::Serve() {
  absl::StatusOr<int> port = server_.Start();
  if (!port.ok()) return port.status();
  // The API and /metrics share the port; there is no gRPC port.
  absl::Status ready = WriteReadyFile(options_.ready_file, 0, *port);
  if (ready.ok()) {
    std::fprintf(stderr,
                 "dedit-openai: router %s, HTTP port %d (%d io threads, at "
                 "most %d concurrent generations)\n",
                 options_.router_address.c_str(), *port,
                 options_.http.io_threads, options_.max_concurrent_generations);
    const int signal = WaitForShutdownSignal();
    std::fprintf(stderr, "dedit-openai: signal %d, draining\n", signal);
    Drain();
  }
  // Closing the connections fails the writes of any generation still
  // running, so the pool's threads end; the model calls end by their
  // deadline at the latest.
  server_.CloseConnections();
  CancelAll();
  generations_.join();
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return model_calls_ == 0;
    };
    mu_.Await(absl::Condition(&idle));
  }
  server_.Stop();
  return ready;
}

}  // namespace

absl::Status ValidateOpenAiServerOptions(const OpenAiServerOptions& o) {
  if (o.max_concurrent_generations < 1) {
    return absl::InvalidArgumentError(
        "--max_concurrent_generations must be >= 1");
  }
  if (o.max_concurrent_generations > 4096) {
    // One pool thread each.
    return absl::InvalidArgumentError(
        "--max_concurrent_generations must be <= 4096");
  }
  if (absl::Status s = ValidateHttpServerOptions(o.http); !s.ok()) return s;
  if (o.sse_heartbeat_ms < 10 || o.request_timeout_ms < 1 ||
      o.default_chat_max_tokens < 1) {
    return absl::InvalidArgumentError(
        "--sse_heartbeat_ms >= 10, --request_timeout_ms >= 1 and "
        "--default_chat_max_tokens >= 1 are required");
  }
  return absl::OkStatus();
}

absl::Status RunOpenAiServer(const OpenAiServerOptions& options) {
  if (absl::Status s = ValidateOpenAiServerOptions(options); !s.ok()) return s;
  absl::StatusOr<InternalAuth> auth = InternalAuth::Load(options.router_auth);
  if (!auth.ok()) return auth.status();
  OpenAiFront front(options, *auth);
  return front.Serve();
}

}  // namespace dedit
