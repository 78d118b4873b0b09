#include "target_service/target_worker.h"

#include <ATen/Functions.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/spin_wait.h"
#include "common/base/status.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/torch_status.h"
#include "common/model/verify_commit.h"

namespace dedit {
namespace {

absl::Status CheckTokenIds(const std::vector<int32_t>& ids, int vocab,
                           const char* what) {
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " token id ", t, " is outside the vocabulary [0, ",
                       vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ShuttingDown() {
  return absl::UnavailableError("target is shutting down");
}

}  // namespace

// ---------------------------------------------------------------------------
// TargetBatcher

TargetBatcher::TargetBatcher(std::unique_ptr<Qwen3Model> model,
                             ContextPublisher* publisher,
                             TargetForwardObserver observer,
                             TargetWorkerOptions options)
    : model_(std::move(model)),
      publisher_(publisher),
      observer_(std::move(observer)),
      options_(options) {}

absl::Status TargetBatcher::WarmUp() {
  // The worker runs this before it takes any work, so no client sequence
  // exists yet (AddSequence would refuse an existing id).
  constexpr SequenceId kWarmUpSequence = std::numeric_limits<SequenceId>::max();
  const Qwen3Config& config = model_->config();
  const int n = static_cast<int>(
      std::clamp<int64_t>(config.max_position_embeddings - 1, 1, 4));
  TargetSegment segment{kWarmUpSequence, {}, 0, {n - 1}};
  for (int i = 0; i < n; ++i) segment.tokens.push_back(i % config.vocab_size);
  RETURN_IF_ERROR(model_->AddSequence(kWarmUpSequence));
  absl::StatusOr<TargetForwardResult> forward = Forward({segment});
  absl::Status status = forward.status();
  if (status.ok()) {
    // Back on the host: an asynchronous device error shows here, not in
    // the first client's forward.
    absl::StatusOr<bool> finite = GuardTorch(
        [&] { return at::isfinite(forward->logits.cpu()).all().item<bool>(); });
    status = finite.status();
    if (finite.ok() && !*finite) {
      status =
          absl::InternalError("the warm-up forward gave non-finite logits");
    }
  }
  const absl::Status removed = model_->RemoveSequence(kWarmUpSequence);
  RETURN_IF_ERROR(status);
  return removed;
}

absl::StatusOr<TargetForwardResult> TargetBatcher::Forward(
    const std::vector<TargetSegment>& segments) {
  if (options_.before_forward_for_test) {
    RETURN_IF_ERROR(options_.before_forward_for_test());
  }
  return model_->Forward(segments);
}

void TargetBatcher::Step(std::vector<TargetReleaseJob> releases,
                         std::vector<TargetPrefillJob> prefills,
                         std::vector<TargetVerifyJob> verifies,
                         std::vector<TargetKeepAliveJob> keep_alives,
                         absl::Time now) {
  step_time_ = now;
  // A verify renews its sequences' leases before any expires: a round that
  // arrives just in time keeps its sequence.
  for (const TargetVerifyJob& job : verifies) {
    for (const VerifyWork& v : job.items) {
      auto it = sequences_.find(v.sequence);
      if (it != sequences_.end()) it->second.lease_renewed = now;
    }
  }
  RenewLeases(std::move(keep_alives), now);
  ExpireLeases(now);
  ApplyReleases(std::move(releases));
  AdmitPrefills(std::move(prefills));
  TargetForwardPlan plan = PlanForward(std::move(verifies));
  const absl::StatusOr<TargetForwardResult> forward = RunPlan(plan);
  CommitPlan(std::move(plan), forward);
}

void TargetBatcher::RenewLeases(std::vector<TargetKeepAliveJob> jobs,
                                absl::Time now) {
  for (TargetKeepAliveJob& job : jobs) {
    std::vector<SequenceId> missing;
    for (SequenceId id : job.sequences) {
      auto it = sequences_.find(id);
      if (it == sequences_.end()) {
        missing.push_back(id);
      } else {
        it->second.lease_renewed = now;
      }
    }
    if (job.done) job.done(std::move(missing));
  }
}

int TargetBatcher::ExpireLeases(absl::Time now) {
  if (options_.sequence_lease <= absl::ZeroDuration()) return 0;
  std::vector<SequenceId> expired;
  for (const auto& [id, state] : sequences_) {
    if (now - state.lease_renewed >= options_.sequence_lease &&
        FindPrefill(id) == prefilling_.end()) {
      expired.push_back(id);
    }
  }
  // Sorted, so that the drafter hears the releases in a stable order.
  std::sort(expired.begin(), expired.end());
  for (SequenceId id : expired) DropSequence(id);
  expired_sequences_ += static_cast<int64_t>(expired.size());
  return static_cast<int>(expired.size());
}

void TargetBatcher::ApplyReleases(std::vector<TargetReleaseJob> jobs) {
  for (TargetReleaseJob& job : jobs) {
    int released = 0;
    for (SequenceId id : job.sequences) {
      if (sequences_.count(id) == 0) continue;
      ++released;
      // A prompt still being prefilled is abandoned.
      auto it = FindPrefill(id);
      if (it != prefilling_.end()) {
        const PrefillProgress p = *it;
        prefilling_.erase(it);
        std::shared_ptr<PrefillCall> call =
            FinishPrefill(p, absl::CancelledError(absl::StrCat(
                                 "sequence ", id, " was released")));
        if (call != nullptr) Answer(*call);
      }
      DropSequence(id);
    }
    if (job.done) job.done(released);
  }
}

absl::Status TargetBatcher::CheckPrompt(const TargetPrefillItem& item) const {
  const Qwen3Config& config = model_->config();
  const PrefillWork& w = item.work;
  RETURN_IF_ERROR(ValidateSamplingParams(w.sampling));
  if (w.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  RETURN_IF_ERROR(CheckTokenIds(w.prompt, config.vocab_size, "prompt"));
  if (w.start < 0 || w.start >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("start ", w.start, " is outside [0, ",
                     config.max_position_embeddings, ")"));
  }
  const int64_t prompt_len = w.start + static_cast<int64_t>(w.prompt.size());
  if (prompt_len >= config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", prompt_len, " tokens does not fit the context of ",
        config.max_position_embeddings));
  }
  // A sequence never holds more than the context, so a larger reservation
  // is a caller's error; bounding it here also keeps the reserved total
  // far from overflow.
  if (item.reserve_tokens < 0 ||
      item.reserve_tokens > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_tokens ", item.reserve_tokens, " is outside [0, ",
        config.max_position_embeddings, "], the context a sequence can hold"));
  }
  if (w.start == 0) {
    if (sequences_.count(w.sequence) > 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("sequence ", w.sequence, " exists"));
    }
    return absl::OkStatus();
  }
  // A continuation of a kept sequence.
  if (sequences_.count(w.sequence) == 0) {
    return absl::NotFoundError(absl::StrCat(
        "sequence ", w.sequence, " to continue does not exist (any more)"));
  }
  if (FindPrefill(w.sequence) != prefilling_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", w.sequence, " is still prefilling"));
  }
  ASSIGN_OR_RETURN(int64_t length, model_->Length(w.sequence));
  if (w.start > length) {
    return absl::InvalidArgumentError(
        absl::StrCat("start ", w.start, " exceeds the ", length,
                     " tokens cached for sequence ", w.sequence));
  }
  return absl::OkStatus();
}

bool TargetBatcher::MakeRoom(int64_t need, SequenceId keep) {
  if (need <= options_.kv_capacity_tokens - reserved_tokens_) return true;
  std::vector<std::pair<uint64_t, SequenceId>> idle;
  int64_t evictable = 0;
  for (const auto& [id, s] : sequences_) {
    if (!s.idle || id == keep) continue;
    idle.emplace_back(s.idle_since, id);
    evictable += s.reserved_tokens;
  }
  if (need > options_.kv_capacity_tokens - reserved_tokens_ + evictable) {
    return false;
  }
  std::sort(idle.begin(), idle.end());
  for (const auto& [since, id] : idle) {
    if (need <= options_.kv_capacity_tokens - reserved_tokens_) break;
    DropSequence(id);
    ++evicted_;
  }
  return need <= options_.kv_capacity_tokens - reserved_tokens_;
}

absl::Status TargetBatcher::AdmitItem(const TargetPrefillItem& item,
                                      int64_t reserve) {
  const PrefillWork& w = item.work;
  auto existing = sequences_.find(w.sequence);
  const int64_t held = w.start > 0 && existing != sequences_.end()
                           ? existing->second.reserved_tokens
                           : 0;
  // Written so that no sum can overflow: 0 <= reserved_tokens_ <=
  // capacity always holds, and `reserve` was bounded by CheckPrompt.
  if (!MakeRoom(reserve - held, w.sequence)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: ", reserved_tokens_, " of ",
                     options_.kv_capacity_tokens,
                     " tokens reserved, this request needs ", reserve - held));
  }
  if (w.start == 0) {
    RETURN_IF_ERROR(model_->AddSequence(w.sequence));
  } else {
    RETURN_IF_ERROR(model_->Truncate(w.sequence, w.start));
  }
  SequenceState& s = sequences_[w.sequence];
  if (w.start == 0) s.context = w.context;
  s.sampler = std::make_unique<TokenSampler>(w.sampling);
  reserved_tokens_ += reserve - s.reserved_tokens;
  s.reserved_tokens = reserve;
  s.idle = false;
  s.lease_renewed = step_time_;
  return absl::OkStatus();
}

void TargetBatcher::ApplyKeepIdle(std::vector<TargetKeepIdleJob> jobs,
                                  absl::Time now) {
  for (TargetKeepIdleJob& job : jobs) {
    std::vector<SequenceId> missing;
    for (SequenceId id : job.sequences) {
      auto it = sequences_.find(id);
      if (it == sequences_.end()) {
        missing.push_back(id);
        continue;
      }
      if (FindPrefill(id) != prefilling_.end()) continue;
      SequenceState& s = it->second;
      s.lease_renewed = now;  // naming a sequence renews its lease
      const int64_t cached = model_->Length(id).value_or(0);
      reserved_tokens_ += cached - s.reserved_tokens;
      s.reserved_tokens = cached;
      if (!s.idle) s.idle_since = ++idle_tick_;
      s.idle = true;
      // Between turns its KV leaves the pool's slots for a copy of its own
      // tokens (common/model/kv_pool.h), so idle sessions cost what they
      // hold, not a slab each; its next forward brings it back.
      (void)model_->ParkSequence(id);
    }
    if (job.done) job.done(std::move(missing));
  }
}

void TargetBatcher::AdmitPrefills(std::vector<TargetPrefillJob> jobs) {
  for (TargetPrefillJob& job : jobs) {
    auto call = std::make_shared<PrefillCall>();
    call->job = std::move(job);
    const size_t n = call->job.items.size();
    call->results.assign(n, absl::UnknownError("not run"));
    call->remaining = static_cast<int>(n);
    for (size_t i = 0; i < n; ++i) {
      const TargetPrefillItem& item = call->job.items[i];
      const int64_t reserve = std::max(
          item.reserve_tokens,
          item.work.start + static_cast<int64_t>(item.work.prompt.size()) + 1);
      absl::Status status = CheckPrompt(item);
      if (status.ok()) status = AdmitItem(item, reserve);
      if (!status.ok()) {
        call->results[i] = status;
        --call->remaining;
        continue;
      }
      prefilling_.push_back({call, i, item.work.start});
    }
    if (call->remaining == 0) Answer(*call);
  }
}

absl::Status TargetBatcher::CheckVerify(const TargetVerifyJob& job) const {
  const Qwen3Config& config = model_->config();
  std::unordered_set<SequenceId> seen;
  for (const VerifyWork& v : job.items) {
    if (sequences_.count(v.sequence) == 0) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", v.sequence));
    }
    if (!seen.insert(v.sequence).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", v.sequence, " verified twice"));
    }
    if (FindPrefill(v.sequence) != prefilling_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", v.sequence, " is still prefilling"));
    }
    if (v.block.empty()) {
      return absl::InvalidArgumentError("empty verify block");
    }
    RETURN_IF_ERROR(CheckTokenIds(v.block, config.vocab_size, "block"));
    ASSIGN_OR_RETURN(int64_t length, model_->Length(v.sequence));
    if (v.start != length) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", v.sequence, " has ", length,
                       " committed tokens, the block starts at ", v.start));
    }
    if (v.start + static_cast<int64_t>(v.block.size()) >
        config.max_position_embeddings) {
      return absl::InvalidArgumentError("verify block exceeds the context");
    }
  }
  return absl::OkStatus();
}

TargetForwardPlan TargetBatcher::PlanForward(
    std::vector<TargetVerifyJob> verifies) {
  TargetForwardPlan plan;
  // Verify blocks first: they are the decode latency of running requests.
  PlanVerifyBlocks(std::move(verifies), plan);
  PlanPrefillChunks(plan);
  return plan;
}

void TargetBatcher::PlanVerifyBlocks(std::vector<TargetVerifyJob> verifies,
                                     TargetForwardPlan& plan) const {
  std::unordered_set<SequenceId> in_forward;
  for (TargetVerifyJob& job : verifies) {
    absl::Status status = CheckVerify(job);
    for (const VerifyWork& v : job.items) {
      if (status.ok() && in_forward.count(v.sequence) > 0) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "sequence ", v.sequence, " verified by two calls at once"));
      }
    }
    if (!status.ok()) {
      plan.refused.emplace_back(std::move(job), std::move(status));
      continue;
    }
    for (const VerifyWork& v : job.items) {
      in_forward.insert(v.sequence);
      TargetSegment s{v.sequence, v.block, v.start, {}};
      for (size_t j = 0; j < v.block.size(); ++j) {
        s.logit_rows.push_back(static_cast<int>(j));
      }
      plan.tokens += static_cast<int>(v.block.size());
      plan.segments.push_back(std::move(s));
    }
    plan.verifies.push_back(std::move(job));
  }
}

void TargetBatcher::PlanPrefillChunks(TargetForwardPlan& plan) const {
  // What the verify blocks left of the budget; a forward without them
  // always makes progress (at least one token).
  int budget = std::max(0, options_.max_batch_tokens - plan.tokens);
  if (plan.segments.empty()) budget = std::max(1, options_.max_batch_tokens);
  for (const PrefillProgress& p : prefilling_) {
    if (budget <= 0) break;
    // Positions: a continuation's prompt starts at w.start, and
    // done_tokens counts from position 0.
    const PrefillWork& w = p.work();
    const int64_t total = w.start + static_cast<int64_t>(w.prompt.size());
    TargetForwardPlan::Chunk chunk;
    chunk.sequence = w.sequence;
    chunk.start = p.done_tokens;
    chunk.length = std::min<int64_t>(total - p.done_tokens, budget);
    chunk.last = chunk.start + chunk.length == total;
    const auto first = w.prompt.begin() + (chunk.start - w.start);
    TargetSegment s{w.sequence,
                    std::vector<int32_t>(first, first + chunk.length),
                    chunk.start,
                    {}};
    if (chunk.last) s.logit_rows.push_back(static_cast<int>(chunk.length) - 1);
    budget -= static_cast<int>(chunk.length);
    plan.tokens += static_cast<int>(chunk.length);
    plan.chunks.push_back(chunk);
    plan.segments.push_back(std::move(s));
  }
}

absl::StatusOr<TargetForwardResult> TargetBatcher::RunPlan(
    const TargetForwardPlan& plan) {
  if (plan.segments.empty()) return TargetForwardResult();
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<TargetForwardResult> forward = Forward(plan.segments);
  if (observer_) {
    TargetForwardStats stats;
    stats.segments = static_cast<int>(plan.segments.size());
    stats.tokens = plan.tokens;
    stats.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    stats.cached_tokens = model_->cached_tokens();
    stats.kv_capacity_tokens = options_.kv_capacity_tokens;
    observer_(stats);
  }
  return forward;
}

ContextPublisher* TargetBatcher::PublisherFor(SequenceId id) const {
  auto it = sequences_.find(id);
  return it != sequences_.end() && it->second.context ? publisher_ : nullptr;
}

absl::StatusOr<std::vector<VerifyOutcome>> TargetBatcher::CommitVerifyCall(
    const TargetVerifyJob& job, size_t first_segment,
    const TargetForwardResult& out) {
  std::vector<VerifyOutcome> outcomes;
  outcomes.reserve(job.items.size());
  for (size_t i = 0; i < job.items.size(); ++i) {
    const VerifyWork& v = job.items[i];
    ASSIGN_OR_RETURN(VerifyOutcome outcome,
                     CommitVerifyBlock(out, first_segment + i, v,
                                       *sequences_.at(v.sequence).sampler,
                                       *model_, PublisherFor(v.sequence)));
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

void TargetBatcher::CommitPlan(
    TargetForwardPlan plan,
    const absl::StatusOr<TargetForwardResult>& forward) {
  for (auto& [job, status] : plan.refused) job.done(std::move(status));
  // Commit (and so publish) everything first, answer after.
  std::vector<absl::StatusOr<std::vector<VerifyOutcome>>> verified;
  size_t segment = 0;
  for (const TargetVerifyJob& job : plan.verifies) {
    verified.push_back(forward.ok() ? CommitVerifyCall(job, segment, *forward)
                                    : forward.status());
    segment += job.items.size();
  }
  std::vector<std::shared_ptr<PrefillCall>> completed;
  for (const TargetForwardPlan::Chunk& chunk : plan.chunks) {
    const size_t chunk_segment = segment++;
    auto it = FindPrefill(chunk.sequence);
    if (it == prefilling_.end()) continue;  // only if the REQUIRES was broken
    const absl::StatusOr<std::optional<int32_t>> first =
        forward.ok()
            ? CommitPrefillChunk(*forward, chunk_segment, chunk.sequence,
                                 chunk.start, chunk.length, chunk.last,
                                 *sequences_.at(chunk.sequence).sampler,
                                 PublisherFor(chunk.sequence))
            : forward.status();
    it->done_tokens += chunk.length;
    if (first.ok() && !first->has_value()) continue;  // more chunks to come
    const PrefillProgress p = *it;
    prefilling_.erase(it);
    std::shared_ptr<PrefillCall> call = first.ok()
                                            ? FinishPrefill(p, **first)
                                            : FinishPrefill(p, first.status());
    if (call != nullptr) completed.push_back(std::move(call));
  }
  for (size_t j = 0; j < plan.verifies.size(); ++j) {
    plan.verifies[j].done(std::move(verified[j]));
  }
  for (const std::shared_ptr<PrefillCall>& call : completed) Answer(*call);
}

void TargetBatcher::CancelPrefills(const absl::Status& status) {
  std::deque<PrefillProgress> cancelled;
  cancelled.swap(prefilling_);
  for (const PrefillProgress& p : cancelled) {
    std::shared_ptr<PrefillCall> call = FinishPrefill(p, status);
    if (call != nullptr) Answer(*call);
  }
}

std::deque<TargetBatcher::PrefillProgress>::iterator TargetBatcher::FindPrefill(
    SequenceId id) {
  return std::find_if(
      prefilling_.begin(), prefilling_.end(),
      [id](const PrefillProgress& p) { return p.work().sequence == id; });
}

std::deque<TargetBatcher::PrefillProgress>::const_iterator
TargetBatcher::FindPrefill(SequenceId id) const {
  return std::find_if(
      prefilling_.begin(), prefilling_.end(),
      [id](const PrefillProgress& p) { return p.work().sequence == id; });
}

std::shared_ptr<TargetBatcher::PrefillCall> TargetBatcher::FinishPrefill(
    const PrefillProgress& p, absl::StatusOr<int32_t> result) {
  if (!result.ok()) {
    DropSequence(p.work().sequence);
  } else if (auto it = sequences_.find(p.work().sequence);
             it != sequences_.end()) {
    // The lease starts when the prompt is in (a long prompt may take
    // several forwards, during which it cannot expire).
    it->second.lease_renewed = step_time_;
  }
  p.call->results[p.item] = std::move(result);
  return --p.call->remaining == 0 ? p.call : nullptr;
}

void TargetBatcher::Answer(PrefillCall& call) {
  call.job.done(std::move(call.results));
}

void TargetBatcher::DropSequence(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  reserved_tokens_ -= it->second.reserved_tokens;
  const bool context = it->second.context;
  sequences_.erase(it);
  (void)model_->RemoveSequence(id);
  // The drafter holds nothing for a sequence it was never fed.
  if (publisher_ != nullptr && context) publisher_->OnRelease(id);
}

TargetWorkerSnapshot TargetBatcher::snapshot() const {
  TargetWorkerSnapshot s;
  s.num_sequences = static_cast<int>(sequences_.size());
  s.cached_tokens = model_->cached_tokens();
  s.kv_bytes_in_use = model_->cache_used_bytes();
  s.kv_bytes_held = model_->cache_bytes();
  s.reserved_tokens = reserved_tokens_;
  s.kv_capacity_tokens = options_.kv_capacity_tokens;
  for (const auto& [id, state] : sequences_) {
    if (!state.idle) continue;
    ++s.idle_sequences;
    s.idle_cached_tokens += model_->Length(id).value_or(0);
  }
  s.evicted_sequences = evicted_;
  s.expired_sequences = expired_sequences_;
  return s;
}

// ---------------------------------------------------------------------------
// TargetWorker

TargetWorker::TargetWorker(std::unique_ptr<Qwen3Model> model,
                           ContextPublisher* publisher,
                           ForwardObserver observer,
                           TargetWorkerOptions options)
    : ModelThread(options.cpu_threads),
      batcher_(std::move(model), publisher, std::move(observer), options),
      options_(options) {
  snapshot_.Set(batcher_.snapshot());
}

TargetWorker::~TargetWorker() { Stop(); }

absl::Status TargetWorker::RefusalLocked() const {
  RETURN_IF_ERROR(PoisonedLocked());
  return stopping_ ? ShuttingDown() : absl::OkStatus();
}

TargetWorker::PrefillDone TargetWorker::NotingErrors(PrefillDone done) {
  return [this, done = std::move(done)](
             std::vector<absl::StatusOr<int32_t>> results) {
    for (const absl::StatusOr<int32_t>& r : results) {
      if (!r.ok()) NoteModelError(r.status());
    }
    done(std::move(results));
  };
}

TargetWorker::VerifyDone TargetWorker::NotingErrors(VerifyDone done) {
  return [this, done = std::move(done)](
             absl::StatusOr<std::vector<VerifyOutcome>> result) {
    if (!result.ok()) NoteModelError(result.status());
    done(std::move(result));
  };
}

void TargetWorker::Enqueue(std::optional<TargetPrefillJob> prefill,
                           std::optional<TargetVerifyJob> verify) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = RefusalLocked();
    if (refused.ok()) {
      if (prefill) new_prefills_.push_back(std::move(*prefill));
      if (verify) new_verifies_.push_back(std::move(*verify));
      return;
    }
  }
  if (prefill) {
    prefill->done(
        std::vector<absl::StatusOr<int32_t>>(prefill->items.size(), refused));
  }
  if (verify) verify->done(refused);
}

void TargetWorker::Prefill(std::vector<TargetPrefillItem> items,
                           PrefillDone done, bool with_verify) {
  Enqueue(TargetPrefillJob{std::move(items), NotingErrors(std::move(done)),
                           with_verify},
          std::nullopt);
}

void TargetWorker::Verify(std::vector<VerifyWork> items, VerifyDone done,
                          bool with_prefill) {
  Enqueue(std::nullopt,
          TargetVerifyJob{std::move(items), NotingErrors(std::move(done)),
                          with_prefill});
}

void TargetWorker::KeepIdle(std::vector<SequenceId> sequences,
                            TargetKeepIdleDone done) {
  {
    absl::MutexLock lock(&mu_);
    if (RefusalLocked().ok()) {
      new_idles_.push_back({std::move(sequences), std::move(done)});
      return;
    }
  }
  if (done) done(std::move(sequences));
}

void TargetWorker::Step(std::vector<TargetPrefillItem> prefills,
                        PrefillDone prefill_done,
                        std::vector<VerifyWork> verifies,
                        VerifyDone verify_done) {
  std::optional<TargetPrefillJob> prefill;
  std::optional<TargetVerifyJob> verify;
  if (!prefills.empty()) {
    prefill = TargetPrefillJob{std::move(prefills),
                               NotingErrors(std::move(prefill_done)), false};
  }
  if (!verifies.empty()) {
    verify = TargetVerifyJob{std::move(verifies),
                             NotingErrors(std::move(verify_done)), false};
  }
  Enqueue(std::move(prefill), std::move(verify));
}

void TargetWorker::KeepAlive(std::vector<SequenceId> sequences,
                             KeepAliveDone done) {
  {
    absl::MutexLock lock(&mu_);
    if (RefusalLocked().ok()) {
      new_keep_alives_.push_back({std::move(sequences), std::move(done)});
      return;
    }
  }
  done(std::move(sequences));
}

bool TargetWorker::CompanionMissing() const {
  for (const TargetPrefillJob& job : new_prefills_) {
    if (job.with_verify && new_verifies_.empty()) return true;
  }
  for (const TargetVerifyJob& job : new_verifies_) {
    if (job.with_prefill && new_prefills_.empty()) return true;
  }
  return false;
}

bool TargetWorker::HasQueuedWork() const {
  return !new_prefills_.empty() || !new_verifies_.empty() ||
         !new_releases_.empty() || !new_idles_.empty() ||
         !new_keep_alives_.empty();
}

bool TargetWorker::TakeWork(Inbox& inbox) {
  // Read before locking: only this thread changes it, and the conditions
  // below may be evaluated on whichever thread unlocks mu_.
  const bool prefilling = batcher_.has_prefills();
  auto ready = [this, prefilling]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || prefilling || HasQueuedWork();
  };
  if (!prefilling) {
    SpinUntilReady(mu_, absl::Microseconds(options_.idle_spin_us), ready);
  }
  absl::MutexLock lock(&mu_);
  if (options_.sequence_lease > absl::ZeroDuration()) {
    // Wake up now and then to expire leases even when no call comes: at
    // most a quarter of the lease late, and at most 1 s.
    mu_.AwaitWithTimeout(absl::Condition(&ready),
                         std::clamp(options_.sequence_lease / 4,
                                    absl::Milliseconds(5), absl::Seconds(1)));
  } else {
    mu_.Await(absl::Condition(&ready));
  }
  if (!stopping_ && options_.max_batch_wait_us > 0 && CompanionMissing()) {
    // A round's Prefill and Verify are two RPCs; let them share a forward.
    auto arrived = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !CompanionMissing();
    };
    mu_.AwaitWithTimeout(absl::Condition(&arrived),
                         absl::Microseconds(options_.max_batch_wait_us));
  }
  if (stopping_) return false;
  inbox.releases.swap(new_releases_);
  inbox.idles.swap(new_idles_);
  inbox.prefills.swap(new_prefills_);
  inbox.verifies.swap(new_verifies_);
  inbox.keep_alives.swap(new_keep_alives_);
  return true;
}

void TargetWorker::Run() {
  Inbox inbox;
  while (TakeWork(inbox)) {
    const absl::Status poisoned = this->poisoned();
    if (poisoned.ok()) {
      // Releases free room first; idle marks before admission, so that a
      // prompt may evict them.
      const absl::Time now = absl::Now();
      batcher_.ApplyReleases(std::move(inbox.releases));
      batcher_.ApplyKeepIdle(std::move(inbox.idles), now);
      inbox.releases.clear();
      batcher_.Step(std::move(inbox.releases), std::move(inbox.prefills),
                    std::move(inbox.verifies), std::move(inbox.keep_alives),
                    now);
    } else {
      // No forward runs again (common/model/model_thread.h).
      FailInbox(inbox, poisoned);
      batcher_.CancelPrefills(poisoned);
    }
    inbox = Inbox();
    PublishSnapshot();
  }
  // Shutting down: answer everything still waiting.
  {
    absl::MutexLock lock(&mu_);
    inbox.releases.swap(new_releases_);
    inbox.idles.swap(new_idles_);
    inbox.prefills.swap(new_prefills_);
    inbox.verifies.swap(new_verifies_);
    inbox.keep_alives.swap(new_keep_alives_);
  }
  FailInbox(inbox, ShuttingDown());
  batcher_.CancelPrefills(ShuttingDown());
  PublishSnapshot();
}

void TargetWorker::FailInbox(Inbox& inbox, const absl::Status& status) {
  for (TargetPrefillJob& job : inbox.prefills) {
    job.done(std::vector<absl::StatusOr<int32_t>>(job.items.size(), status));
  }
  for (TargetVerifyJob& job : inbox.verifies) job.done(status);
  for (TargetReleaseJob& job : inbox.releases) {
    if (job.done) job.done(0);
  }
  for (TargetKeepIdleJob& job : inbox.idles) {
    if (job.done) job.done(std::move(job.sequences));
  }
  for (TargetKeepAliveJob& job : inbox.keep_alives) {
    if (job.done) job.done(std::move(job.sequences));
  }
}

void TargetWorker::PublishSnapshot() {
  const Snapshot s = batcher_.snapshot();
  snapshot_.Set(s);
  if (snapshot_listener_) snapshot_listener_(s);
}

}  // namespace dedit
