#include "router/generation_loop.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dedit {
namespace {

double SecondsBetween(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kContextLimit:
      return v1::FINISH_REASON_CONTEXT_LIMIT;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    default:
      return v1::FINISH_REASON_UNSPECIFIED;
  }
}

void FillAcceptance(const AcceptanceSummary& s, v1::AcceptanceStats* out) {
  out->set_rounds(s.rounds);
  out->set_drafted_rounds(s.drafted_rounds);
  out->set_fallback_rounds(s.fallback_rounds);
  out->set_lookup_rounds(s.lookup_rounds);
  out->set_cut_rounds(s.cut_rounds);
  out->set_skipped_rounds(s.skipped_rounds);
  out->set_reused_rounds(s.reused_rounds);
  out->set_paused_rounds(s.paused_rounds);
  out->set_draft_tokens(s.draft_tokens);
  out->set_accepted_tokens(s.accepted_tokens);
  out->set_mean_acceptance_length(s.mean_acceptance_length());
  for (int64_t n : s.accepted_per_position) out->add_accepted_per_position(n);
  for (size_t k = 0; k < s.edit_outcomes.size(); ++k) {
    v1::EditOutcomes* e = out->add_edit_outcomes();
    e->set_pass(static_cast<int>(k + 1));
    e->set_extended(s.edit_outcomes[k][0]);
    e->set_unchanged(s.edit_outcomes[k][1]);
    e->set_shortened(s.edit_outcomes[k][2]);
  }
}

// Moves `end` back so that it does not split a UTF-8 character.
size_t CharBoundary(const std::string& text, size_t end) {
  while (end > 0 && end < text.size() &&
         (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
    --end;
  }
  return end;
}

}  // namespace

int64_t KvReservationTokens(int64_t prompt_tokens, int64_t max_new_tokens,
                            int window, int64_t max_context) {
  const int64_t whole_life =
      prompt_tokens + max_new_tokens + std::max(1, window);
  return max_context > 0 ? std::min(whole_life, max_context) : whole_life;
}

namespace {
std::atomic<uint64_t> next_loop_serial{1};
}  // namespace

GenerationLoop::GenerationLoop(RouterBackends backends,
                               const Tokenizer* tokenizer,
                               std::shared_ptr<prometheus::Registry> registry,
                               Options options)
    : backends_(backends),
      tokenizer_(tokenizer),
      registry_(std::move(registry)),
      options_(std::move(options)),
      seeds_(std::random_device{}()),
      serial_(next_loop_serial.fetch_add(1)) {}

GenerationLoop::~GenerationLoop() { Stop(); }

void GenerationLoop::Start() {
  thread_ = std::thread([this] {
    Run();
    finished_.store(true);
  });
}

void GenerationLoop::Stop() {
  Retire(absl::UnavailableError("router is shutting down"),
         absl::ZeroDuration());
}

void GenerationLoop::BeginRetire(const absl::Status& status,
                                 absl::Duration drain) {
  absl::MutexLock lock(&mu_);
  if (!stopping_) {
    stop_status_ = status;
    drain_until_ = absl::Now() + drain;
  }
  stopping_ = true;
}

void GenerationLoop::Retire(const absl::Status& status, absl::Duration drain) {
  BeginRetire(status, drain);
  if (thread_.joinable()) thread_.join();
  // Requests queued before a Start() that never came.
  FailQueued(status);
}

void GenerationLoop::Submit(RouterRequest request) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      submitted_.push_back(std::move(request));
      queued_.fetch_add(1);
      return;
    }
    refused = stop_status_;
  }
  request.sink->Finish(refused);
}

void GenerationLoop::Cancel(std::weak_ptr<const GenerationSink> sink) {
  absl::MutexLock lock(&mu_);
  cancelled_.push_back(std::move(sink));
}

void GenerationLoop::ReleaseKept(SequenceId id) {
  absl::MutexLock lock(&mu_);
  release_kept_.push_back(id);
}

void GenerationLoop::CountRejected(const absl::Status& status) {
  RouterMetrics* metrics = nullptr;
  {
    absl::MutexLock lock(&mu_);
    metrics = shared_metrics_;
  }
  if (metrics != nullptr) {
    metrics->OnRequestFinished(RouterMetrics::StatusLabel(status), 0, false);
  }
}

ServedModel GenerationLoop::served_model() const {
  absl::MutexLock lock(&mu_);
  return served_;
}

bool GenerationLoop::HasWork() const {
  return stopping_ || !submitted_.empty() || !cancelled_.empty() ||
         !release_kept_.empty();
}

void GenerationLoop::FailQueued(const absl::Status& status) {
  std::vector<RouterRequest> queued;
  {
    absl::MutexLock lock(&mu_);
    queued.swap(submitted_);
    queued_.fetch_sub(static_cast<int>(queued.size()));
    cancelled_.clear();
  }
  for (RouterRequest& r : queued) RerouteOrFinish(std::move(r), status);
}

void GenerationLoop::RerouteOrFinish(RouterRequest request,
                                     const absl::Status& status) {
  const bool retryable = status.code() == absl::StatusCode::kUnavailable ||
                         status.code() == absl::StatusCode::kResourceExhausted;
  if (retryable && options_.reroute && options_.reroute(request, status)) {
    return;
  }
  request.sink->Finish(status);
}

void GenerationLoop::MarkUnreachable() {
  reachable_.store(false);
  metrics_->OnStackReachable(false);
}

void GenerationLoop::SetLease(double sequence_lease_seconds) {
  keep_alive_period_ =
      sequence_lease_seconds > 0
          ? std::max<std::chrono::steady_clock::duration>(
                std::chrono::milliseconds(50),
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(sequence_lease_seconds / 3)))
          : std::chrono::steady_clock::duration::zero();
}

void GenerationLoop::KeepKeptAlive() {
  if (keep_alive_period_ == std::chrono::steady_clock::duration::zero()) {
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (now < next_keep_alive_) return;
  next_keep_alive_ = now + keep_alive_period_;
  const std::vector<SequenceId> kept = engine_->KeptSequences();
  if (!kept.empty()) backends_.target->KeepAlive(kept);
}

bool GenerationLoop::ProbeTarget() {
  absl::StatusOr<TargetInfo> info =
      backends_.target->FetchInfo(options_.target_info_retry_ms);
  if (!info.ok()) return false;
  SetLease(info->sequence_lease_seconds);
  reachable_.store(true);
  metrics_->OnStackReachable(true);
  return true;
}

bool GenerationLoop::ConnectTarget() {
  absl::StatusOr<TargetInfo> info =
      backends_.target->FetchInfo(options_.target_info_retry_ms);
  if (!info.ok()) return false;
  ServedModel served;
  served.ready = true;
  served.name =
      options_.model_name.empty() ? info->model_name : options_.model_name;
  served.vocab_size = info->vocab_size;
  served.max_context = info->max_context;
  served.eos_token_ids = info->eos_token_ids;
  metrics_ = std::make_unique<RouterMetrics>(*registry_, served.name,
                                             options_.stack_name);
  SpeculativeEngine::Options o;
  o.eos_token_ids = served.eos_token_ids;
  o.vocab_size = served.vocab_size;
  o.max_context = served.max_context;
  max_context_ = served.max_context;
  SetLease(info->sequence_lease_seconds);
  o.max_new_tokens_limit = options_.max_tokens_limit;
  o.max_passes = options_.max_passes;
  o.speculation = options_.speculation;
  o.on_round = [this](SequenceId, const RoundRecord& round) {
    const int block = backends_.drafter_health != nullptr
                          ? backends_.drafter_health->block_size()
                          : 1;
    metrics_->OnRound(round,
                      std::max(block, options_.speculation.ngram.max_window));
  };
  engine_ = std::make_unique<SpeculativeEngine>(backends_.verifier,
                                                backends_.drafter, o);
  reachable_.store(true);
  metrics_->OnStackReachable(true);
  absl::MutexLock lock(&mu_);
  served_ = served;
  shared_metrics_ = metrics_.get();
  return true;
}

void GenerationLoop::Run() {
  // Until the target has answered Info once, the engine cannot be built
  // (EOS ids, vocabulary, context limit): requests get UNAVAILABLE.
  while (!ConnectTarget()) {
    FailQueued(absl::UnavailableError("target service is not reachable"));
    bool stopping = false;
    absl::Status stop_status;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                           absl::Milliseconds(options_.target_info_retry_ms));
      stopping = stopping_;
      stop_status = stop_status_;
    }
    if (stopping) {
      FailQueued(stop_status);
      return;
    }
  }
  auto next_probe = std::chrono::steady_clock::now();
  while (true) {
    std::vector<RouterRequest> submitted;
    std::vector<std::weak_ptr<const GenerationSink>> cancel_requests;
    std::vector<SequenceId> release_kept;
    bool stopping = false;
    bool cut = false;  // stopping, and running requests may not finish
    {
      absl::MutexLock lock(&mu_);
      if (engine_->idle()) {
        const bool keep_alives =
            keep_alive_period_ != std::chrono::steady_clock::duration::zero() &&
            !engine_->KeptSequences().empty();
        if (reachable_.load() && keep_alives) {
          // Wake up to renew the kept sessions' leases.
          mu_.AwaitWithTimeout(
              absl::Condition(this, &GenerationLoop::HasWork),
              absl::FromChrono(std::max<std::chrono::steady_clock::duration>(
                  next_keep_alive_ - std::chrono::steady_clock::now(),
                  std::chrono::milliseconds(1))));
        } else if (reachable_.load()) {
          mu_.Await(absl::Condition(this, &GenerationLoop::HasWork));
        } else {
          // Wake up to probe the target again.
          mu_.AwaitWithTimeout(
              absl::Condition(this, &GenerationLoop::HasWork),
              absl::Milliseconds(options_.target_info_retry_ms));
        }
      }
      stopping = stopping_;
      cut = stopping_ && absl::Now() >= drain_until_;
      stop_status_for_loop_ = stop_status_;
      // In order, up to the round's prompt-token budget (Options); when
      // stopping, all (they are answered, not prefilled).
      size_t take = 0;
      int64_t prompt_tokens = 0;
      while (take < submitted_.size()) {
        const int64_t n =
            static_cast<int64_t>(submitted_[take].engine.prompt.size());
        if (!stopping && take > 0 &&
            n > options_.max_prefill_tokens_per_round - prompt_tokens) {
          break;
        }
        prompt_tokens += n;
        ++take;
      }
      if (take == submitted_.size()) {
        submitted.swap(submitted_);
      } else {
        submitted.assign(std::make_move_iterator(submitted_.begin()),
                         std::make_move_iterator(submitted_.begin() + take));
        submitted_.erase(submitted_.begin(), submitted_.begin() + take);
      }
      queued_.fetch_sub(static_cast<int>(submitted.size()));
      cancel_requests.swap(cancelled_);
      release_kept.swap(release_kept_);
    }
    for (SequenceId id : release_kept) (void)engine_->ReleaseKept(id);
    if (reachable_.load()) KeepKeptAlive();
    if (!reachable_.load() && !stopping &&
        std::chrono::steady_clock::now() >= next_probe) {
      next_probe = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(options_.target_info_retry_ms);
      ProbeTarget();
    }
    // Sinks still alive are held by their requests, so an address can only
    // match the request that asked to cancel.
    std::vector<std::shared_ptr<const GenerationSink>> cancelled;
    for (const auto& weak : cancel_requests) {
      if (auto sink = weak.lock()) cancelled.push_back(std::move(sink));
    }
    for (RouterRequest& r : submitted) {
      if (stopping) {
        RerouteOrFinish(std::move(r), stop_status_for_loop_);
      } else if (!reachable_.load()) {
        RerouteOrFinish(std::move(r), absl::UnavailableError(
                                          "target service is not reachable"));
      } else {
        Admit(std::move(r));
      }
    }
    const auto now_system = std::chrono::system_clock::now();
    for (auto& [id, a] : active_) {
      const bool cancel = std::find(cancelled.begin(), cancelled.end(),
                                    a.request.sink) != cancelled.end();
      if (cancel) a.client_cancelled = true;
      if (!cancel && now_system >= a.request.deadline) {
        a.deadline_exceeded = true;
      }
      if (cancel || a.deadline_exceeded || cut) to_cancel_.push_back(id);
    }
    for (SequenceId id : to_cancel_) (void)engine_->Cancel(id);
    to_cancel_.clear();
    if (!engine_->idle()) {
      const auto t0 = std::chrono::steady_clock::now();
      // A failed step has already finished its requests with the error
      // (e.g. UNAVAILABLE when the target is down); they complete below.
      const absl::Status step = engine_->Step();
      if (absl::IsUnavailable(step)) {
        MarkUnreachable();
        next_probe = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(options_.target_info_retry_ms);
      }
      metrics_->OnStep(engine_->last_step(),
                       SecondsBetween(t0, std::chrono::steady_clock::now()));
      for (SequenceId id : to_cancel_) (void)engine_->Cancel(id);
      to_cancel_.clear();
    }
    for (GenerationResult& result : engine_->TakeFinished()) {
      // A prompt-only round reports a dead target per prompt, not as the
      // step's status.
      if (result.finish == FinishReason::kError &&
          absl::IsUnavailable(result.status) && reachable_.load()) {
        MarkUnreachable();
        next_probe = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(options_.target_info_retry_ms);
      }
      Complete(result);
    }
    if (stopping && engine_->idle()) break;
  }
  // Sessions kept here end with the loop (their next turn goes elsewhere).
  engine_->ReleaseAllKept();
  FailQueued(stop_status_for_loop_);
}

void GenerationLoop::StartStream(RouterRequest& request) {
  if (request.stream != nullptr) return;
  auto stream = std::make_shared<StreamProgress>();
  if (tokenizer_ != nullptr) {
    stream->detokenizer = std::make_unique<StreamingDetokenizer>(tokenizer_);
  }
  for (const std::string& s : request.stop_strings) {
    stream->max_stop_bytes = std::max(stream->max_stop_bytes, s.size());
  }
  stream->last_token_time = request.arrival;
  request.stream = std::move(stream);
  // Drawn here, not on the target, so that the stream keeps its draws
  // wherever it moves (common/model/sampling.h).
  SamplingParams& sampling = request.engine.sampling;
  if (!sampling.has_seed) {
    sampling.seed = seeds_();
    sampling.has_seed = true;
  }
}

GenerationRequest GenerationLoop::EngineRequestFor(const RouterRequest& request,
                                                   bool* cache_lost) const {
  const StreamProgress& stream = *request.stream;
  GenerationRequest engine_request =
      stream.emitted.empty() ? request.engine
                             : ResumedEngineRequest(request.engine, stream);
  // A kept sequence lives in the loop that kept it; ids of other loops'
  // engines mean nothing here. A turn that moved mid-stream rebuilt its KV.
  *cache_lost = stream.cache_lost;
  if (request.pinned_loop != serial_ && engine_request.continue_sequence != 0) {
    engine_request.continue_sequence = 0;
    *cache_lost = true;
  }
  const DrafterHealth* drafter = backends_.drafter_health;
  const bool drafter_up = drafter != nullptr && drafter->healthy();
  if (engine_request.method == DraftMethod::kHybrid && !drafter_up) {
    // The lookup half needs no drafter: it goes on alone.
    engine_request.method = DraftMethod::kNgram;
    engine_request.passes = std::min(engine_request.passes, 1);
  }
  const int block_size = engine_request.method == DraftMethod::kNgram
                             ? options_.speculation.ngram.max_window
                             : (drafter_up ? drafter->block_size() : 0);
  if (!request.speculate || block_size < 2) {
    engine_request.passes = 0;  // target-only (W is then ignored)
    engine_request.window = 1;
  } else {
    // The request was validated against the block size known then; a
    // restarted drafter may offer less.
    engine_request.window = std::min(engine_request.window, block_size);
  }
  return engine_request;
}

void GenerationLoop::Admit(RouterRequest request) {
  if (request.sink->client_gone()) {
    metrics_->OnRequestFinished("cancelled", 0, false);
    request.sink->Finish(absl::CancelledError("client cancelled the request"));
    return;
  }
  StartStream(request);
  const bool moved = !request.stream->emitted.empty();
  bool cache_lost = false;
  GenerationRequest engine_request = EngineRequestFor(request, &cache_lost);
  const int prompt_tokens = static_cast<int>(engine_request.prompt.size());
  const int64_t reserve =
      KvReservationTokens(prompt_tokens, engine_request.max_new_tokens,
                          engine_request.window, max_context_);
  std::shared_ptr<GenerationSink> sink = request.sink;
  absl::StatusOr<SequenceId> id = engine_->Submit(
      std::move(engine_request),
      [this](SequenceId id, const std::vector<int32_t>& tokens) {
        OnTokens(id, tokens);
      });
  if (!id.ok()) {
    metrics_->OnRequestFinished(RouterMetrics::StatusLabel(id.status()), 0,
                                false);
    sink->Finish(id.status());
    return;
  }
  backends_.target->SetRequestLimits(*id, reserve, request.deadline);
  Active& a = active_[*id];
  a.reserve_tokens = reserve;
  a.cache_lost = cache_lost;
  a.reprefill_tokens = moved ? prompt_tokens : 0;
  a.request = std::move(request);
  running_.fetch_add(1);
  // A moved stream's prompt was counted where it was admitted first; its
  // re-prefill is counted apart (CountResumed).
  metrics_->OnRequestStarted(moved ? 0 : prompt_tokens, reserve);
}

void GenerationLoop::OnTokens(SequenceId id,
                              const std::vector<int32_t>& tokens) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  Active& a = it->second;
  StreamProgress& st = *a.request.stream;
  if (st.stopped_by_string) return;
  if (!st.move_reason.empty()) CountResumed(a);
  v1::GenerateResponse response;
  for (int32_t t : tokens) {
    response.add_token_ids(t);
    st.emitted.push_back(t);
    if (st.detokenizer != nullptr) {
      absl::StatusOr<std::string> piece = st.detokenizer->Push(t);
      if (piece.ok()) st.text += *piece;
    }
    if (!a.request.stop_strings.empty()) {
      // Only text that this token completed can hold a new match.
      const size_t from = st.sent_bytes > st.max_stop_bytes
                              ? st.sent_bytes - st.max_stop_bytes
                              : 0;
      size_t best = std::string::npos;
      for (const std::string& s : a.request.stop_strings) {
        const size_t pos = st.text.find(s, from);
        if (pos != std::string::npos && pos < best) {
          best = pos;
          st.stop_reason = s;
        }
      }
      if (best != std::string::npos) {
        st.text.resize(best);
        st.stopped_by_string = true;
        to_cancel_.push_back(id);
        break;
      }
    }
  }
  // Text that could still grow into a stop string is held back.
  size_t sendable = st.text.size();
  if (!st.stopped_by_string && st.max_stop_bytes > 1) {
    sendable = st.text.size() > st.max_stop_bytes - 1
                   ? st.text.size() - (st.max_stop_bytes - 1)
                   : 0;
    sendable = CharBoundary(st.text, sendable);
  }
  if (sendable > st.sent_bytes) {
    response.set_text(st.text.substr(st.sent_bytes, sendable - st.sent_bytes));
    st.sent_bytes = sendable;
  }
  const auto now = std::chrono::steady_clock::now();
  const int n = response.token_ids_size();
  if (!st.first_token_time) {
    st.first_token_time = now;
    metrics_->OnFirstToken(SecondsBetween(a.request.arrival, now));
    metrics_->OnTokens(n, n > 1 ? 0.0 : -1.0);
  } else {
    metrics_->OnTokens(n, SecondsBetween(st.last_token_time, now));
  }
  st.last_token_time = now;
  a.request.sink->Send(std::move(response));
}

void GenerationLoop::CountResumed(Active& a) {
  StreamProgress& st = *a.request.stream;
  metrics_->OnStreamResumed(
      st.move_reason, a.reprefill_tokens,
      SecondsBetween(st.left_at, std::chrono::steady_clock::now()));
  st.move_reason.clear();
}

bool GenerationLoop::MoveStream(Active& a, GenerationResult& result,
                                const absl::Status& status) {
  StreamProgress& st = *a.request.stream;
  // A stream cut at a stop string has all it needs; it ends here.
  if (st.stopped_by_string) return false;
  const bool retryable = status.code() == absl::StatusCode::kUnavailable ||
                         status.code() == absl::StatusCode::kResourceExhausted;
  if (!retryable || !options_.reroute) return false;
  const size_t rounds_before = st.rounds.size();
  st.rounds.insert(st.rounds.end(), result.rounds.begin(), result.rounds.end());
  const bool had_reason = !st.move_reason.empty();
  if (!st.emitted.empty() && !had_reason) {
    // The first stack it leaves since its last token: the stall starts.
    st.move_reason =
        result.finish == FinishReason::kError
            ? (absl::IsResourceExhausted(status) ? kMoveKvFull
                                                 : kMoveTargetFailed)
            : kMoveStackLeft;
    st.left_at = std::chrono::steady_clock::now();
  }
  if (!st.emitted.empty() && a.request.session_turn) st.cache_lost = true;
  if (options_.reroute(a.request, status)) return true;
  // Nobody took it: it ends here, as it was.
  st.rounds.resize(rounds_before);
  if (!had_reason) st.move_reason.clear();
  return false;
}

void GenerationLoop::Complete(GenerationResult& result) {
  auto it = active_.find(result.id);
  if (it == active_.end()) return;
  Active a = std::move(it->second);
  active_.erase(it);
  running_.fetch_sub(1);
  StreamProgress& st = *a.request.stream;
  const auto now = std::chrono::steady_clock::now();
  const double duration = SecondsBetween(a.request.arrival, now);

  absl::Status status;
  FinishReason reason = result.finish;
  if (result.finish == FinishReason::kError) {
    status = result.status.ok() ? absl::InternalError("generation failed")
                                : result.status;
  } else if (st.stopped_by_string) {
    reason = FinishReason::kStop;
  } else if (result.finish == FinishReason::kCancelled) {
    if (a.client_cancelled && a.request.session_turn) {
      // A session turn the client cancelled ends like any other turn.
    } else if (a.client_cancelled) {
      status = absl::CancelledError("client cancelled the request");
    } else if (a.deadline_exceeded) {
      status = absl::DeadlineExceededError("request deadline exceeded");
    } else {
      status = stop_status_for_loop_;
    }
  }
  if (!status.ok() && MoveStream(a, result, status)) {
    metrics_->OnRequestRerouted(a.reserve_tokens);
    return;
  }
  metrics_->OnRequestFinished(RouterMetrics::StatusLabel(status), duration,
                              true, a.reserve_tokens);
  if (!status.ok()) {
    a.request.sink->Finish(status);
    return;
  }
  if (a.request.on_turn_end) {
    TurnEnd end;
    end.loop = serial_;
    end.kept = result.kept ? result.id : 0;
    end.reused_tokens = result.reused_tokens;
    end.cache_lost = result.cache_lost || a.cache_lost;
    a.request.on_turn_end(end);
    metrics_->OnSessionTurn(result.reused_tokens, end.cache_lost);
  }
  v1::GenerateResponse last;
  if (st.detokenizer != nullptr && !st.stopped_by_string) {
    st.text += st.detokenizer->Flush();
  }
  if (st.text.size() > st.sent_bytes) {
    last.set_text(st.text.substr(st.sent_bytes));
  }
  last.set_finished(true);
  last.set_finish_reason(ToProto(reason));
  if (st.stopped_by_string) {
    last.set_stop_reason(st.stop_reason);
  } else if (result.stop_token >= 0) {
    last.set_stop_reason(absl::StrCat("token:", result.stop_token));
  }
  v1::Usage* usage = last.mutable_usage();
  // A moved stream's engine prompt held what it had emitted.
  usage->set_prompt_tokens(
      static_cast<int32_t>(a.request.engine.prompt.size()));
  usage->set_completion_tokens(static_cast<int32_t>(st.emitted.size()));
  if (a.request.session_turn) {
    usage->set_cached_prompt_tokens(static_cast<int32_t>(result.reused_tokens));
    usage->set_cache_lost(result.cache_lost || a.cache_lost);
  }
  usage->set_duration_seconds(duration);
  if (st.first_token_time) {
    usage->set_time_to_first_token_seconds(
        SecondsBetween(a.request.arrival, *st.first_token_time));
  }
  st.rounds.insert(st.rounds.end(), result.rounds.begin(), result.rounds.end());
  FillAcceptance(Summarize(st.rounds), last.mutable_acceptance());
  a.request.sink->Send(std::move(last));
  a.request.sink->Finish(absl::OkStatus());
}

}  // namespace dedit
