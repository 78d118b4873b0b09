#include "drafter_service/drafter_worker.h"

#include <ATen/Functions.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/spin_wait.h"
#include "common/base/status.h"
#include "common/engine/ngram_drafter.h"
#include "common/model/cpu/cpu_threads.h"
#include "common/model/torch_status.h"

namespace dedit {
namespace {

absl::Status ShuttingDown() {
  return absl::UnavailableError("drafter is shutting down");
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

DrafterWorker::DrafterWorker(std::unique_ptr<DEditDrafter> drafter,
                             BatchObserver observer,
                             DrafterWorkerOptions options)
    : ModelThread(options.cpu_threads),
      drafter_(std::move(drafter)),
      observer_(std::move(observer)),
      options_(options) {}

DrafterWorker::~DrafterWorker() { Stop(); }

absl::Status DrafterWorker::WarmUp() {
  // The worker runs this before it takes any work, so no client sequence
  // exists yet (AddSequence would refuse an existing id).
  constexpr SequenceId kWarmUpSequence = std::numeric_limits<SequenceId>::max();
  constexpr int64_t kContextTokens = 4;
  RETURN_IF_ERROR(drafter_->AddSequence(kWarmUpSequence));
  absl::Status status = GuardTorch([&] {
    return drafter_->AppendContext(
        kWarmUpSequence, 0,
        at::zeros({kContextTokens, drafter_->feature_width()}));
  });
  if (status.ok()) {
    DraftRequest request;
    request.sequence = kWarmUpSequence;
    request.start = kContextTokens;
    request.bonus = 0;
    request.window = drafter_->config().block_size;
    request.passes = 1;
    // The tokens come back to the host: an asynchronous device error shows
    // here, not in the first client's draft.
    absl::StatusOr<std::vector<DraftResult>> drafted = RunDraft({request});
    status = drafted.status();
    if (drafted.ok() && drafted->size() != 1) {
      status = absl::InternalError("the warm-up draft returned no result");
    }
  }
  const absl::Status removed = drafter_->RemoveSequence(kWarmUpSequence);
  RETURN_IF_ERROR(status);
  return removed;
}

absl::StatusOr<std::vector<DraftResult>> DrafterWorker::RunDraft(
    const std::vector<DraftRequest>& batch) {
  if (options_.before_forward_for_test) {
    absl::Status injected = options_.before_forward_for_test();
    if (!injected.ok()) {
      NoteModelError(injected);
      return injected;
    }
  }
  absl::StatusOr<std::vector<DraftResult>> drafted = drafter_->Draft(batch);
  if (!drafted.ok()) NoteModelError(drafted.status());
  return drafted;
}

void DrafterWorker::AddContext(SequenceId sequence, int64_t start,
                               at::Tensor features, uint64_t stream) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !PoisonedLocked().ok()) return;
  new_context_.push_back(
      {sequence, start, std::move(features), false, stream, false});
}

void DrafterWorker::ReleaseFromStream(SequenceId sequence) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !PoisonedLocked().ok()) return;
  new_context_.push_back({sequence, 0, at::Tensor(), true, 0, false});
}

void DrafterWorker::EndStream(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || !PoisonedLocked().ok()) return;
  new_context_.push_back({0, 0, at::Tensor(), false, stream, true});
}

void DrafterWorker::Draft(std::vector<DraftRequest> requests, DraftDone done,
                          std::string caller) {
  DraftJob job;
  job.caller = std::move(caller);
  job.arrived = std::chrono::steady_clock::now();
  job.context_deadline =
      job.arrived + std::chrono::milliseconds(options_.context_wait_ms);
  job.state.resize(requests.size());
  job.requests = std::move(requests);
  job.done = std::move(done);
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = PoisonedLocked();
    if (refused.ok() && stopping_) refused = ShuttingDown();
    if (refused.ok()) {
      new_drafts_.push_back(std::move(job));
      return;
    }
  }
  job.done(
      std::vector<absl::StatusOr<DraftResult>>(job.requests.size(), refused));
}

bool DrafterWorker::HasQueuedWork() const {
  return !new_context_.empty() || !new_drafts_.empty() ||
         !new_releases_.empty();
}

bool DrafterWorker::TakeWork(Inbox& inbox) {
  // Computed before locking: waiting_ is model-thread state, and the
  // conditions below may be evaluated on whichever thread unlocks mu_.
  std::optional<std::chrono::steady_clock::time_point> next_deadline;
  for (const DraftJob& j : waiting_) {
    if (!next_deadline || j.context_deadline < *next_deadline) {
      next_deadline = j.context_deadline;
    }
  }
  // Idle sequences are parked when they fall due.
  if (auto park = NextParking();
      park && (!next_deadline || *park < *next_deadline)) {
    next_deadline = park;
  }
  // Ready items left over from a full forward run next, after a look at
  // the queues.
  if (!ready_.empty()) next_deadline = std::chrono::steady_clock::now();
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || HasQueuedWork();
  };
  if (ready_.empty()) {
    SpinUntilReady(mu_, absl::Microseconds(options_.idle_spin_us), has_work);
  }
  absl::MutexLock lock(&mu_);
  if (next_deadline) {
    mu_.AwaitWithTimeout(
        absl::Condition(&has_work),
        absl::FromChrono(*next_deadline - std::chrono::steady_clock::now()));
  } else {
    mu_.Await(absl::Condition(&has_work));
  }
  if (!stopping_ && !new_drafts_.empty() && options_.max_batch_wait_us > 0) {
    // Draft RPCs from several routers (or a round split in two) share one
    // batched call if they arrive within the wait.
    const size_t seen = new_drafts_.size();
    auto more = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || new_drafts_.size() > seen;
    };
    mu_.AwaitWithTimeout(absl::Condition(&more),
                         absl::Microseconds(options_.max_batch_wait_us));
  }
  if (stopping_) return false;
  inbox.context.swap(new_context_);
  inbox.drafts.swap(new_drafts_);
  inbox.releases.swap(new_releases_);
  return true;
}

void DrafterWorker::Run() {
  Inbox inbox;
  while (TakeWork(inbox)) {
    ContextQueue queue;
    for (ContextEvent& e : inbox.context) ApplyContext(e, queue);
    FlushContext(queue);
    ApplyReleases(inbox.releases);
    for (DraftJob& job : inbox.drafts) waiting_.push_back(std::move(job));
    inbox = Inbox();
    const absl::Status poisoned = this->poisoned();
    if (!poisoned.ok()) {
      // No draft runs again (common/model/model_thread.h).
      FailAll(inbox, poisoned);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (Resolve(*it, now)) {
        MakeReady(std::move(*it), now);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    if (!ready_.empty()) RunFairBatch();
    ParkIdle(std::chrono::steady_clock::now());
    PublishSnapshot();
  }
  // Shutting down: answer everything still waiting, outside the lock.
  {
    absl::MutexLock lock(&mu_);
    inbox.drafts.swap(new_drafts_);
    inbox.releases.swap(new_releases_);
  }
  FailAll(inbox, ShuttingDown());
}

void DrafterWorker::FailAll(Inbox& inbox, const absl::Status& status) {
  for (ReleaseJob& job : inbox.releases) {
    if (job.done) job.done(0);
  }
  for (DraftJob& job : waiting_) inbox.drafts.push_back(std::move(job));
  waiting_.clear();
  for (DraftJob& job : ready_) inbox.drafts.push_back(std::move(job));
  ready_.clear();
  for (DraftJob& job : inbox.drafts) {
    job.done(
        std::vector<absl::StatusOr<DraftResult>>(job.requests.size(), status));
  }
}

void DrafterWorker::ApplyReleases(std::vector<ReleaseJob>& jobs) {
  for (ReleaseJob& job : jobs) {
    int released = 0;
    for (SequenceId id : job.sequences) {
      if (drafter_->HasSequence(id)) ++released;
      RemoveSequence(id);
    }
    if (job.done) job.done(released);
  }
}

std::optional<std::chrono::steady_clock::time_point>
DrafterWorker::NextParking() const {
  if (options_.park_idle_ms <= 0 || last_used_.empty()) return std::nullopt;
  auto oldest = last_used_.begin()->second;
  for (const auto& [id, t] : last_used_) oldest = std::min(oldest, t);
  return oldest + std::chrono::milliseconds(options_.park_idle_ms);
}

void DrafterWorker::ParkIdle(std::chrono::steady_clock::time_point now) {
  if (options_.park_idle_ms <= 0) return;
  const auto idle = std::chrono::milliseconds(options_.park_idle_ms);
  for (auto it = last_used_.begin(); it != last_used_.end();) {
    if (now - it->second < idle) {
      ++it;
      continue;
    }
    if (drafter_->HasSequence(it->first)) {
      NoteModelError(drafter_->ParkSequence(it->first));
    }
    it = last_used_.erase(it);
  }
}

void DrafterWorker::RemoveSequence(SequenceId id) {
  broken_.erase(id);
  owner_.erase(id);
  last_used_.erase(id);
  if (drafter_->HasSequence(id)) (void)drafter_->RemoveSequence(id);
}

void DrafterWorker::ApplyContext(ContextEvent& e, ContextQueue& queue) {
  if (!poisoned().ok()) return;  // the device is not used again
  if (e.end_stream) {
    FlushContext(queue);
    std::vector<SequenceId> orphans;
    for (const auto& [id, owner] : owner_) {
      if (owner == e.stream) orphans.push_back(id);
    }
    for (SequenceId id : orphans) RemoveSequence(id);
    orphaned_contexts_ += static_cast<int64_t>(orphans.size());
    return;
  }
  const std::optional<int64_t> queued = queue.End(e.sequence);
  const bool continues = !e.release && queued == e.start;
  // Anything but an append right after the queued ones changes what the
  // queue would extend: apply the queue first.
  if (queued.has_value() && !continues) FlushContext(queue);
  if (e.release) {
    RemoveSequence(e.sequence);
    return;
  }
  last_used_[e.sequence] = std::chrono::steady_clock::now();
  if (!continues) {
    if (e.start == 0) {
      // A prompt's first chunk (re)creates the sequence.
      RemoveSequence(e.sequence);
      owner_[e.sequence] = e.stream;
      if (!drafter_->AddSequence(e.sequence).ok()) return;
    } else if (owner_[e.sequence] = e.stream;
               !drafter_->HasSequence(e.sequence)) {
      // Its earlier context was lost (e.g. this drafter restarted).
      broken_.insert(e.sequence);
      return;
    }
    // A chunk that starts inside the context continues a kept sequence (a
    // session's next turn keeps that prefix on the target and re-prefills
    // the rest): the context is cut back to match. One past it is a gap.
    auto length = drafter_->ContextLength(e.sequence);
    if (!length.ok() || e.start > *length) {
      BreakSequence(e.sequence);
      return;
    }
    if (!drafter_->TruncateContext(e.sequence, e.start).ok()) {
      BreakSequence(e.sequence);
      return;
    }
  } else {
    owner_[e.sequence] = e.stream;
  }
  DEditDrafter::ContextChunk chunk{e.sequence, e.start, std::move(e.features)};
  const absl::Status checked = drafter_->CheckContextChunk(chunk, e.start);
  if (!checked.ok()) {
    // Too long for the drafter, or malformed: this sequence alone is lost.
    BreakSequence(e.sequence);
    return;
  }
  queue.Push(std::move(chunk));
}

void DrafterWorker::FlushContext(ContextQueue& queue) {
  std::vector<SequenceId> sequences;
  const absl::Status status = queue.Flush(*drafter_, &sequences);
  if (!status.ok()) {
    // A device error (the chunks were checked as they were queued): every
    // sequence in the queue lacks context now.
    NoteModelError(status);
    for (SequenceId id : sequences) BreakSequence(id);
  }
}

void DrafterWorker::BreakSequence(SequenceId id) {
  if (drafter_->HasSequence(id)) (void)drafter_->RemoveSequence(id);
  broken_.insert(id);
}

absl::Status DrafterWorker::CheckRequest(const DraftRequest& r) const {
  const DrafterConfig& c = drafter_->config();
  if (r.window < 2 || r.window > c.block_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("window ", r.window, " outside [2, ", c.block_size, "]"));
  }
  if (r.passes < 1 || r.passes > options_.max_passes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "passes ", r.passes, " outside [1, ", options_.max_passes, "]"));
  }
  if (r.bonus < 0 || r.bonus >= c.layers.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bonus token ", r.bonus, " outside the vocabulary"));
  }
  return CheckDraftSeed(r, c.layers.vocab_size);
}

bool DrafterWorker::Resolve(DraftJob& job,
                            std::chrono::steady_clock::time_point now) {
  if (!job.first_look) job.first_look = now;
  bool all = true;
  for (size_t i = 0; i < job.requests.size(); ++i) {
    if (job.state[i].has_value()) continue;
    const DraftRequest& r = job.requests[i];
    absl::Status check = CheckRequest(r);
    if (!check.ok()) {
      job.state[i] = check;
      continue;
    }
    if (broken_.count(r.sequence) > 0) {
      job.state[i] = absl::DataLossError(absl::StrCat(
          "context of sequence ", r.sequence, " was lost; draft unavailable"));
      continue;
    }
    const int64_t have = drafter_->HasSequence(r.sequence)
                             ? drafter_->ContextLength(r.sequence).value_or(0)
                             : -1;
    if (have == r.start) {
      job.state[i] = absl::OkStatus();
    } else if (have > r.start && now >= job.context_deadline) {
      // Waited: a session's next turn cuts the context back, and its chunk
      // may still be on the stream.
      job.state[i] = absl::FailedPreconditionError(
          absl::StrCat("sequence ", r.sequence, " has ", have,
                       " context tokens, the draft starts at ", r.start));
    } else if (have > r.start) {
      all = false;
    } else if (now >= job.context_deadline) {
      job.state[i] = absl::UnavailableError(absl::StrCat(
          "context of sequence ", r.sequence, " up to position ", r.start,
          " has not arrived (have ", std::max<int64_t>(have, 0), ")"));
    } else {
      all = false;
    }
  }
  return all;
}

void DrafterWorker::MakeReady(DraftJob job,
                              std::chrono::steady_clock::time_point now) {
  // Resolve looked at the job before it was ready.
  job.waits = {
      std::chrono::duration<double>(*job.first_look - job.arrived).count(),
      std::chrono::duration<double>(now - *job.first_look).count()};
  job.results.resize(job.requests.size());
  job.undrafted = 0;
  for (size_t i = 0; i < job.requests.size(); ++i) {
    if (job.state[i]->ok()) {
      ++job.undrafted;
    } else {
      job.results[i] = *job.state[i];
    }
  }
  ready_.push_back(std::move(job));
}

void DrafterWorker::RunFairBatch() {
  // Each caller's undrafted items, oldest job first; callers in order of
  // their oldest job.
  struct Slot {
    DraftJob* job;
    size_t item;
  };
  std::vector<std::string> callers;
  std::unordered_map<std::string, std::deque<Slot>> items;
  for (DraftJob& job : ready_) {
    auto [it, added] = items.try_emplace(job.caller);
    if (added) callers.push_back(job.caller);
    for (size_t i = 0; i < job.requests.size(); ++i) {
      if (job.state[i]->ok() && !job.results[i].has_value()) {
        it->second.push_back({&job, i});
      }
    }
  }
  // Round-robin, one item per caller per turn, starting with a different
  // caller each forward.
  const size_t limit = options_.max_batch_sequences > 0
                           ? static_cast<size_t>(options_.max_batch_sequences)
                           : std::numeric_limits<size_t>::max();
  std::vector<Slot> chosen;
  const size_t n = callers.size();
  const size_t first = n > 0 ? next_caller_ % n : 0;
  for (bool took = true; took && chosen.size() < limit;) {
    took = false;
    for (size_t k = 0; k < n && chosen.size() < limit; ++k) {
      std::deque<Slot>& queue = items[callers[(first + k) % n]];
      if (queue.empty()) continue;
      chosen.push_back(queue.front());
      queue.pop_front();
      took = true;
    }
  }
  ++next_caller_;

  std::vector<DraftRequest> batch;
  int max_passes = 0;
  DrafterBatchStats stats;
  const auto now = std::chrono::steady_clock::now();
  for (const Slot& slot : chosen) {
    batch.push_back(slot.job->requests[slot.item]);
    if (drafter_->HasSequence(batch.back().sequence)) {
      last_used_[batch.back().sequence] = now;
    }
    max_passes = std::max(max_passes, batch.back().passes);
    DraftJob& job = *slot.job;
    if (job.waits) {
      stats.queue_wait_seconds.push_back(job.waits->first);
      stats.context_wait_seconds.push_back(job.waits->second);
      job.waits.reset();
    }
  }
  if (!batch.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<DraftResult>> drafted = RunDraft(batch);
    if (observer_) {
      stats.sequences = static_cast<int>(batch.size());
      stats.max_passes = max_passes;
      stats.seconds = SecondsSince(t0);
      stats.context_tokens = drafter_->context_tokens();
      observer_(stats);
    }
    for (size_t k = 0; k < chosen.size(); ++k) {
      DraftJob& job = *chosen[k].job;
      if (drafted.ok()) {
        job.results[chosen[k].item] = std::move((*drafted)[k]);
      } else {
        job.results[chosen[k].item] = drafted.status();
      }
      --job.undrafted;
    }
  }
  // Answer the jobs that are complete, in arrival order.
  for (auto it = ready_.begin(); it != ready_.end();) {
    if (it->undrafted > 0) {
      ++it;
      continue;
    }
    std::vector<absl::StatusOr<DraftResult>> results;
    results.reserve(it->results.size());
    for (auto& r : it->results) results.push_back(std::move(*r));
    DraftDone done = std::move(it->done);
    it = ready_.erase(it);
    done(std::move(results));
  }
}

void DrafterWorker::PublishSnapshot() {
  Snapshot s;
  s.num_sequences = static_cast<int>(drafter_->num_sequences());
  s.context_tokens = drafter_->context_tokens();
  s.kv_bytes_in_use = drafter_->context_used_bytes();
  s.kv_bytes_held = drafter_->context_bytes();
  s.orphaned_contexts = orphaned_contexts_;
  snapshot_.Set(s);
  if (snapshot_listener_) snapshot_listener_(s);
}

}  // namespace dedit
