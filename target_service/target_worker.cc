#include "target_service/target_worker.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>
#include <utility>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"
#include "model/cpu_threads.h"
#include "base/status.h"
#include "model/torch_status.h"

namespace dedit {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status CheckTokenIds(const std::vector<int32_t>& ids, int vocab,
                           const char* what) {
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

TargetWorker::TargetWorker(std::unique_ptr<Qwen3Model> model,
                           ContextPublisher* publisher,
                           ForwardObserver observer,
                           TargetWorkerOptions options)
    : model_(std::move(model)),
      publisher_(publisher),
      observer_(std::move(observer)),
      options_(options) {
  snapshot_.kv_capacity_tokens = options_.kv_capacity_tokens;
}

TargetWorker::~TargetWorker() { Stop(); }

void TargetWorker::Start() {
  thread_ = std::thread([this] { Run(); });
}

void TargetWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TargetWorker::Prefill(std::vector<TargetPrefillItem> items,
                           PrefillDone done, bool with_verify) {
  auto job = std::make_shared<PrefillJob>();
  job->items = std::move(items);
  job->with_verify = with_verify;
  job->done = std::move(done);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      new_prefills_.push_back(std::move(job));
      job = nullptr;
    }
  }
  if (job != nullptr) {
    job->done(std::vector<absl::StatusOr<int32_t>>(
        job->items.size(), absl::UnavailableError("target is shutting down")));
    return;
  }
  cv_.notify_all();
}

void TargetWorker::Verify(std::vector<VerifyWork> items, VerifyDone done,
                          bool with_prefill) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      new_verifies_.push_back({std::move(items), std::move(done), with_prefill});
      done = nullptr;
    }
  }
  if (done) {
    done(absl::UnavailableError("target is shutting down"));
    return;
  }
  cv_.notify_all();
}

void TargetWorker::Release(std::vector<SequenceId> sequences,
                           ReleaseDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      new_releases_.push_back({std::move(sequences), std::move(done)});
      done = nullptr;
    }
  }
  if (done) {
    done(0);
    return;
  }
  cv_.notify_all();
}

TargetWorker::Snapshot TargetWorker::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

bool TargetWorker::CompanionMissing() const {
  for (const auto& job : new_prefills_) {
    if (job->with_verify && new_verifies_.empty()) return true;
  }
  for (const VerifyJob& job : new_verifies_) {
    if (job.with_prefill && new_prefills_.empty()) return true;
  }
  return false;
}

bool TargetWorker::HasQueuedWork() const {
  return !new_prefills_.empty() || !new_verifies_.empty() ||
         !new_releases_.empty();
}

void TargetWorker::Run() {
  SetCpuThreads(options_.cpu_threads);
  c10::InferenceMode inference_mode;
  while (true) {
    std::vector<std::shared_ptr<PrefillJob>> prefills;
    std::vector<VerifyJob> verifies;
    std::vector<ReleaseJob> releases;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || HasQueuedWork() || !prefilling_.empty();
      });
      if (stopping_) break;
      if (CompanionMissing() && options_.max_batch_wait_us > 0) {
        // A round's Prefill and Verify are two RPCs; let them share a
        // forward.
        const auto deadline =
            std::chrono::steady_clock::now() +
            std::chrono::microseconds(options_.max_batch_wait_us);
        cv_.wait_until(lock, deadline,
                       [&] { return stopping_ || !CompanionMissing(); });
        if (stopping_) break;
      }
      prefills.swap(new_prefills_);
      verifies.swap(new_verifies_);
      releases.swap(new_releases_);
    }
    ApplyReleases(releases);
    AdmitPrefills(prefills);
    RunForward(verifies);
    PublishSnapshot();
  }
  // Shutting down: answer everything still waiting.
  std::vector<std::shared_ptr<PrefillJob>> prefills;
  std::vector<VerifyJob> verifies;
  std::vector<ReleaseJob> releases;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefills.swap(new_prefills_);
    verifies.swap(new_verifies_);
    releases.swap(new_releases_);
  }
  const absl::Status down = absl::UnavailableError("target is shutting down");
  for (auto& job : prefills) {
    job->done(std::vector<absl::StatusOr<int32_t>>(job->items.size(), down));
  }
  for (PrefillProgress& p : prefilling_) FinishPrefill(p, down);
  prefilling_.clear();
  for (VerifyJob& job : verifies) job.done(down);
  for (ReleaseJob& job : releases) job.done(0);
}

void TargetWorker::DropSequence(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  reserved_tokens_ -= it->second.reserved_tokens;
  sequences_.erase(it);
  (void)model_->RemoveSequence(id);
  if (publisher_ != nullptr) publisher_->OnRelease(id);
}

void TargetWorker::ApplyReleases(std::vector<ReleaseJob>& jobs) {
  for (ReleaseJob& job : jobs) {
    int released = 0;
    for (SequenceId id : job.sequences) {
      if (sequences_.count(id) == 0) continue;
      ++released;
      // A prompt still being prefilled is abandoned.
      for (auto it = prefilling_.begin(); it != prefilling_.end(); ++it) {
        if (it->job->items[it->item].work.sequence == id) {
          PrefillProgress p = *it;
          prefilling_.erase(it);
          FinishPrefill(p, absl::CancelledError(
                               absl::StrCat("sequence ", id, " was released")));
          break;
        }
      }
      DropSequence(id);
    }
    if (job.done) job.done(released);
  }
}

void TargetWorker::FinishPrefill(PrefillProgress& p,
                                 absl::StatusOr<int32_t> result) {
  if (!result.ok()) DropSequence(p.job->items[p.item].work.sequence);
  p.job->results[p.item] = std::move(result);
  if (--p.job->remaining == 0) p.job->done(std::move(p.job->results));
}

void TargetWorker::AdmitPrefills(
    std::vector<std::shared_ptr<PrefillJob>>& jobs) {
  const Qwen3Config& config = model_->config();
  for (auto& job : jobs) {
    const size_t n = job->items.size();
    job->results.assign(n, absl::UnknownError("not run"));
    job->remaining = static_cast<int>(n);
    std::vector<size_t> admitted;
    for (size_t i = 0; i < n; ++i) {
      const TargetPrefillItem& item = job->items[i];
      const PrefillWork& w = item.work;
      const int64_t prompt_len = static_cast<int64_t>(w.prompt.size());
      const int64_t reserve = std::max(item.reserve_tokens, prompt_len + 1);
      absl::Status status = ValidateSamplingParams(w.sampling);
      if (status.ok() && w.prompt.empty()) {
        status = absl::InvalidArgumentError("prompt is empty");
      }
      if (status.ok()) {
        status = CheckTokenIds(w.prompt, config.vocab_size, "prompt");
      }
      if (status.ok() && prompt_len >= config.max_position_embeddings) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "prompt of ", prompt_len, " tokens does not fit the context of ",
            config.max_position_embeddings));
      }
      if (status.ok() && sequences_.count(w.sequence) > 0) {
        status = absl::AlreadyExistsError(
            absl::StrCat("sequence ", w.sequence, " exists"));
      }
      if (status.ok() &&
          reserved_tokens_ + reserve > options_.kv_capacity_tokens) {
        status = absl::ResourceExhaustedError(absl::StrCat(
            "KV cache full: ", reserved_tokens_, " of ",
            options_.kv_capacity_tokens, " tokens reserved, this request needs ",
            reserve));
      }
      if (status.ok()) status = model_->AddSequence(w.sequence);
      if (!status.ok()) {
        job->results[i] = status;
        --job->remaining;
        continue;
      }
      SequenceState& s = sequences_[w.sequence];
      s.sampler = std::make_unique<TokenSampler>(w.sampling);
      s.reserved_tokens = reserve;
      reserved_tokens_ += reserve;
      prefilling_.push_back({job, i, 0});
    }
    if (job->remaining == 0) job->done(std::move(job->results));
  }
}

absl::Status TargetWorker::CheckVerify(const VerifyJob& job) const {
  const Qwen3Config& config = model_->config();
  std::unordered_set<SequenceId> seen;
  for (const VerifyWork& v : job.items) {
    auto it = sequences_.find(v.sequence);
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown sequence ", v.sequence));
    }
    if (!seen.insert(v.sequence).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", v.sequence, " verified twice"));
    }
    for (const PrefillProgress& p : prefilling_) {
      if (p.job->items[p.item].work.sequence == v.sequence) {
        return absl::FailedPreconditionError(
            absl::StrCat("sequence ", v.sequence, " is still prefilling"));
      }
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

void TargetWorker::RunForward(std::vector<VerifyJob>& verify_jobs) {
  // Verify blocks first: they are the decode latency of running requests.
  std::vector<VerifyJob*> verifying;
  std::unordered_set<SequenceId> in_forward;
  std::vector<TargetSegment> segments;
  int tokens = 0;
  for (VerifyJob& job : verify_jobs) {
    absl::Status status = CheckVerify(job);
    for (const VerifyWork& v : job.items) {
      if (status.ok() && in_forward.count(v.sequence) > 0) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "sequence ", v.sequence, " verified by two calls at once"));
      }
    }
    if (!status.ok()) {
      job.done(status);
      continue;
    }
    for (const VerifyWork& v : job.items) {
      in_forward.insert(v.sequence);
      TargetSegment s{v.sequence, v.block, v.start, {}};
      for (size_t j = 0; j < v.block.size(); ++j) {
        s.logit_rows.push_back(static_cast<int>(j));
      }
      tokens += static_cast<int>(v.block.size());
      segments.push_back(std::move(s));
    }
    verifying.push_back(&job);
  }
  const size_t num_verify_segments = segments.size();
  // Prefill chunks fill the rest of the token budget, oldest prompt first.
  int budget = std::max(0, options_.max_batch_tokens - tokens);
  if (segments.empty()) budget = std::max(1, options_.max_batch_tokens);
  std::vector<std::pair<size_t, int64_t>> chunks;  // prefilling_ index, size
  for (size_t i = 0; i < prefilling_.size() && budget > 0; ++i) {
    PrefillProgress& p = prefilling_[i];
    const PrefillWork& w = p.job->items[p.item].work;
    const int64_t total = static_cast<int64_t>(w.prompt.size());
    const int64_t chunk = std::min<int64_t>(total - p.done_tokens, budget);
    TargetSegment s{w.sequence,
                    std::vector<int32_t>(w.prompt.begin() + p.done_tokens,
                                         w.prompt.begin() + p.done_tokens + chunk),
                    p.done_tokens,
                    {}};
    if (p.done_tokens + chunk == total) {
      s.logit_rows.push_back(static_cast<int>(chunk) - 1);
    }
    budget -= static_cast<int>(chunk);
    tokens += static_cast<int>(chunk);
    chunks.emplace_back(i, chunk);
    segments.push_back(std::move(s));
  }
  if (segments.empty()) return;

  const double t0 = NowSeconds();
  auto forward = model_->Forward(segments);
  const double seconds = NowSeconds() - t0;
  if (observer_) {
    TargetForwardStats stats;
    stats.segments = static_cast<int>(segments.size());
    stats.tokens = tokens;
    stats.seconds = seconds;
    stats.cached_tokens = model_->cached_tokens();
    stats.kv_capacity_tokens = options_.kv_capacity_tokens;
    observer_(stats);
  }
  if (!forward.ok()) {
    for (VerifyJob* job : verifying) job->done(forward.status());
    std::vector<size_t> failed;
    for (auto& [index, chunk] : chunks) failed.push_back(index);
    for (auto it = failed.rbegin(); it != failed.rend(); ++it) {
      PrefillProgress p = prefilling_[*it];
      prefilling_.erase(prefilling_.begin() + *it);
      FinishPrefill(p, forward.status());
    }
    return;
  }
  const TargetForwardResult& out = *forward;
  const bool has_features = publisher_ != nullptr && out.features.defined();

  // Verify: accept, truncate to the committed length, publish the
  // committed rows' features.
  std::vector<absl::StatusOr<std::vector<VerifyOutcome>>> answers;
  size_t seg = 0;
  for (VerifyJob* job : verifying) {
    std::vector<VerifyOutcome> outcomes;
    absl::Status status;
    for (const VerifyWork& v : job->items) {
      const size_t i = seg++;
      if (!status.ok()) continue;
      const int64_t rows = static_cast<int64_t>(v.block.size());
      auto choices = GuardTorch([&] {
        return sequences_.at(v.sequence)
            .sampler->Choose(out.logits.narrow(0, out.logit_offsets[i], rows));
      });
      if (!choices.ok()) {
        status = choices.status();
        continue;
      }
      VerifyOutcome outcome;
      const std::vector<int32_t> draft(v.block.begin() + 1, v.block.end());
      outcome.accepted = AcceptedPrefixLength(draft, *choices);
      outcome.target_tokens = std::move(*choices);
      const int64_t committed = outcome.accepted + 1;
      status = model_->Truncate(v.sequence, v.start + committed);
      if (status.ok() && has_features) {
        status = publisher_->OnContext(
            v.sequence, v.start,
            out.features.narrow(0, out.token_offsets[i], committed));
      }
      outcomes.push_back(std::move(outcome));
    }
    if (status.ok()) {
      answers.emplace_back(std::move(outcomes));
    } else {
      answers.emplace_back(status);
    }
  }
  // Prefill chunks: publish features, sample the first token at the end.
  std::vector<size_t> completed;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const size_t i = num_verify_segments + c;
    PrefillProgress& p = prefilling_[chunks[c].first];
    const int64_t chunk = chunks[c].second;
    const PrefillWork& w = p.job->items[p.item].work;
    absl::Status status;
    if (has_features) {
      status = publisher_->OnContext(
          w.sequence, p.done_tokens,
          out.features.narrow(0, out.token_offsets[i], chunk));
    }
    p.done_tokens += chunk;
    if (!status.ok()) {
      completed.push_back(chunks[c].first);
      FinishPrefill(p, status);
      continue;
    }
    if (p.done_tokens == static_cast<int64_t>(w.prompt.size())) {
      auto choice = GuardTorch([&] {
        return sequences_.at(w.sequence)
            .sampler->Choose(out.logits.narrow(0, out.logit_offsets[i], 1));
      });
      completed.push_back(chunks[c].first);
      if (choice.ok()) {
        FinishPrefill(p, (*choice)[0]);
      } else {
        FinishPrefill(p, choice.status());
      }
    }
  }
  std::sort(completed.rbegin(), completed.rend());
  for (size_t index : completed) {
    prefilling_.erase(prefilling_.begin() + index);
  }
  for (size_t j = 0; j < verifying.size(); ++j) {
    verifying[j]->done(std::move(answers[j]));
  }
}

void TargetWorker::PublishSnapshot() {
  Snapshot s;
  s.num_sequences = static_cast<int>(sequences_.size());
  s.cached_tokens = model_->cached_tokens();
  s.reserved_tokens = reserved_tokens_;
  s.kv_capacity_tokens = options_.kv_capacity_tokens;
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = s;
}

}  // namespace dedit
