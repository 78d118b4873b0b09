#include "router/stack_set.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/serving/server_bootstrap.h"

namespace dedit {

StackSet::StackSet(const Tokenizer* tokenizer,
                   std::shared_ptr<prometheus::Registry> registry,
                   Options options)
    : tokenizer_(tokenizer),
      registry_(std::move(registry)),
      options_(std::move(options)) {
  auto& opened = prometheus::BuildCounter()
                     .Name("dedit_round_streams_opened_total")
                     .Help(
                         "Round streams (Target.Rounds, Drafter.Rounds) "
                         "the router opened, the first and every reopening "
                         "after a broken stream; all stacks")
                     .Register(*registry_);
  target_streams_opened_ = &opened.Add({{"service", "target"}});
  drafter_streams_opened_ = &opened.Add({{"service", "drafter"}});
}

StackSet::~StackSet() { Stop(); }

std::unique_ptr<StackSet::Stack> StackSet::MakeStack(
    const StackAddress& address) {
  // A nonce per stack incarnation: a stack that leaves and comes back gets
  // fresh wire ids, which can never meet a release still in flight.
  std::random_device random;
  uint32_t nonce = 0;
  while (nonce == 0) nonce = random();
  auto stack = std::make_unique<Stack>();
  stack->address = address;
  const grpc::ChannelArguments args = InternalChannelArguments();
  RemoteVerifier::Options verifier = options_.verifier;
  verifier.on_round_stream_open = [c = target_streams_opened_] {
    c->Increment();
  };
  stack->verifier = std::make_unique<RemoteVerifier>(
      options_.auth.Channel(address.target_address, args), verifier, nonce);
  if (!address.drafter_address.empty()) {
    RemoteDrafter::Options drafter = options_.drafter;
    drafter.on_round_stream_open = [c = drafter_streams_opened_] {
      c->Increment();
    };
    stack->drafter = std::make_unique<RemoteDrafter>(
        options_.auth.Channel(address.drafter_address, args), drafter, nonce);
    stack->drafter->Start();
  }
  GenerationLoop::Options loop_options = options_.loop;
  loop_options.stack_name = address.name;
  loop_options.reroute = [this, name = address.name](
                             RouterRequest& request,
                             const absl::Status& status) {
    return Reroute(name, request, status);
  };
  stack->loop = std::make_unique<GenerationLoop>(
      RouterBackends{stack->verifier.get(), stack->verifier.get(),
                     stack->drafter.get(), stack->drafter.get()},
      tokenizer_, registry_, std::move(loop_options));
  stack->loop->Start();
  return stack;
}

void StackSet::Update(const std::vector<StackAddress>& stacks) {
  std::vector<const Stack*> gone;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    desired_ = stacks;
    for (auto it = stacks_.begin(); it != stacks_.end();) {
      if (std::find(stacks.begin(), stacks.end(), (*it)->address) ==
          stacks.end()) {
        // New admissions stop here; the loop ends its requests (rerouting
        // those without a token) on its own thread, since a round in flight
        // may take up to the target timeout, and the reaper frees it.
        Stack* s = it->get();
        s->loop->BeginRetire(absl::UnavailableError(absl::StrCat(
                                 "stack ", s->address.name, " went away")),
                             absl::Milliseconds(options_.stack_drain_ms));
        gone.push_back(s);
        retired_.push_back(std::move(*it));
        it = stacks_.erase(it);
      } else {
        ++it;
      }
    }
    // This list supersedes the joins still queued from the last one.
    pending_.clear();
    for (const StackAddress& a : stacks) {
      if (!HasStackNamed(a.name) && joining_.count(a.name) == 0) {
        pending_.push_back(a);
      }
    }
    const size_t want =
        std::min(pending_.size(), static_cast<size_t>(options_.join_threads));
    while (joiners_.size() < want) {
      joiners_.emplace_back([this] { JoinLoop(); });
    }
    if (!reaper_.joinable() && !gone.empty()) {
      reaper_ = std::thread([this] { ReapLoop(); });
    }
    changed_.SignalAll();
    // Logged under the lock: the reaper frees a retired stack only under
    // it, after this returns.
    for (const Stack* s : gone) {
      std::fprintf(stderr, "dedit-router: stack %s (%s) left\n",
                   s->address.name.c_str(), s->address.target_address.c_str());
    }
  }
}

bool StackSet::HasStackNamed(const std::string& name) const {
  return std::any_of(stacks_.begin(), stacks_.end(),
                     [&](const auto& s) { return s->address.name == name; });
}

bool StackSet::RetiredNamed(const std::string& name) const {
  return std::any_of(retired_.begin(), retired_.end(),
                     [&](const auto& s) { return s->address.name == name; });
}

void StackSet::JoinLoop() {
  while (true) {
    StackAddress address;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && pending_.empty()) changed_.Wait(&mu_);
      if (stopping_) return;
      address = std::move(pending_.front());
      pending_.pop_front();
      joining_.insert(address.name);
      ++joins_started_;
      // A stack of the same name still draining: its series and name must
      // be free before a new incarnation uses them.
      while (!stopping_ && RetiredNamed(address.name)) changed_.Wait(&mu_);
      if (stopping_) {
        joining_.erase(address.name);
        return;
      }
    }
    std::fprintf(
        stderr, "dedit-router: stack %s joining: target %s, drafter %s\n",
        address.name.c_str(), address.target_address.c_str(),
        address.drafter_address.empty() ? "(none)"
                                        : address.drafter_address.c_str());
    FinishJoin(address, MakeStack(address));
  }
}

void StackSet::FinishJoin(const StackAddress& address,
                          std::unique_ptr<Stack> stack) {
  {
    absl::MutexLock lock(&mu_);
    joining_.erase(address.name);
    const bool wanted =
        std::find(desired_.begin(), desired_.end(), address) != desired_.end();
    if (!stopping_ && wanted && !HasStackNamed(address.name)) {
      stacks_.push_back(std::move(stack));
      return;
    }
    // The list changed while it joined: queue what it wants under that
    // name now (Update skipped the name while it was joining).
    if (!stopping_ && !wanted) {
      for (const StackAddress& a : desired_) {
        if (a.name == address.name && !HasStackNamed(a.name)) {
          pending_.push_back(a);
          changed_.SignalAll();
        }
      }
    }
  }
  std::fprintf(stderr, "dedit-router: stack %s left before it joined\n",
               address.name.c_str());
  stack->loop->Stop();
  if (stack->drafter) stack->drafter->Stop();
}

void StackSet::ReapLoop() {
  // Destroyed in reverse order: the loop before the backends it uses.
  struct Ended {
    std::unique_ptr<RemoteVerifier> verifier;
    std::unique_ptr<RemoteDrafter> drafter;
    std::unique_ptr<GenerationLoop> loop;
  };
  while (true) {
    std::vector<Ended> ended;
    {
      absl::MutexLock lock(&mu_);
      changed_.WaitWithTimeout(&mu_, absl::Milliseconds(50));
      if (stopping_) return;  // Stop() takes what is left
      for (auto& s : retired_) {
        if (s->loop != nullptr && s->loop->finished()) {
          ended.push_back(Ended{std::move(s->verifier), std::move(s->drafter),
                                std::move(s->loop)});
        }
      }
    }
    if (ended.empty()) continue;
    // Freed outside the lock (joining a loop that ended is immediate, but
    // its requests' sinks may call back into the set). The entries stay in
    // retired_ meanwhile, so their names are not joined again before the
    // loops' metric series are gone.
    ended.clear();
    absl::MutexLock lock(&mu_);
    retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                  [](const auto& s) { return !s->loop; }),
                   retired_.end());
    changed_.SignalAll();
  }
}

void StackSet::Stop() {
  std::vector<std::thread> joiners;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    pending_.clear();
    joiners.swap(joiners_);
    changed_.SignalAll();
  }
  // A join in progress finishes its probes, then stops its stack.
  for (std::thread& t : joiners) t.join();
  if (reaper_.joinable()) reaper_.join();
  if (resumer_.joinable()) resumer_.join();
  std::vector<Parked> parked;
  {
    absl::MutexLock lock(&mu_);
    parked.swap(parked_);
  }
  for (Parked& p : parked) {
    p.request.sink->Finish(absl::UnavailableError("router is shutting down"));
  }
  std::vector<std::unique_ptr<Stack>> stacks;
  {
    absl::MutexLock lock(&mu_);
    stacks.swap(stacks_);
    for (auto& s : retired_) stacks.push_back(std::move(s));
    retired_.clear();
  }
  for (auto& s : stacks) {
    if (s->loop) s->loop->Stop();
    if (s->drafter) s->drafter->Stop();
  }
}

int64_t StackSet::joins_started() const {
  absl::MutexLock lock(&mu_);
  return joins_started_;
}

bool StackSet::SubmitLocked(RouterRequest& request, bool any_stack) {
  auto tried = [&](const Stack* s) {
    return !any_stack &&
           std::find(request.tried_stacks.begin(), request.tried_stacks.end(),
                     s->address.name) != request.tried_stacks.end();
  };
  if (request.pinned_loop != 0) {
    for (auto& s : stacks_) {
      if (s->loop->serial() == request.pinned_loop && s->loop->reachable() &&
          !tried(s.get())) {
        s->loop->Submit(std::move(request));
        return true;
      }
    }
  }
  const size_t n = stacks_.size();
  Stack* best = nullptr;
  int best_load = 0;
  for (size_t i = 0; i < n; ++i) {
    Stack* s = stacks_[(round_robin_ + i) % n].get();
    if (tried(s) || !s->loop->reachable()) continue;
    const int load = s->loop->load();
    if (best == nullptr || load < best_load) {
      best = s;
      best_load = load;
    }
  }
  if (best == nullptr) return false;
  ++round_robin_;
  best->loop->Submit(std::move(request));
  return true;
}

void StackSet::Submit(RouterRequest request) {
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      refused = absl::UnavailableError("router is shutting down");
    } else if (SubmitLocked(request)) {
      return;
    } else {
      refused = absl::UnavailableError("no stack is reachable");
    }
  }
  CountRejected(refused);
  request.sink->Finish(refused);
}

bool StackSet::Reroute(const std::string& from, RouterRequest& request,
                       const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  if (std::find(request.tried_stacks.begin(), request.tried_stacks.end(),
                from) == request.tried_stacks.end()) {
    request.tried_stacks.push_back(from);
  }
  if (!absl::IsResourceExhausted(status) &&
      ++request.moves > options_.max_moves) {
    return false;
  }
  if (SubmitLocked(request)) return true;
  // A request that has streamed nothing ends as a fresh one would be
  // refused with no stack to take it (its client may retry elsewhere); a
  // stream that has tokens waits for a stack, since its client cannot.
  if (request.stream == nullptr || request.stream->emitted.empty()) {
    return false;
  }
  absl::Time give_up =
      absl::Now() + absl::Milliseconds(options_.resume_wait_ms);
  if (request.deadline != std::chrono::system_clock::time_point::max()) {
    give_up = std::min(give_up, absl::FromChrono(request.deadline));
  }
  // Offered again at the resumer's next tick, not at once: the stack that
  // just failed it is unreachable, or out of KV, for now.
  parked_.push_back(Parked{std::move(request), status, give_up});
  if (!resumer_.joinable()) resumer_ = std::thread([this] { ResumeLoop(); });
  return true;
}

void StackSet::ResumeLoop() {
  while (true) {
    std::vector<Parked> ended;
    {
      absl::MutexLock lock(&mu_);
      changed_.WaitWithTimeout(&mu_,
                               absl::Milliseconds(options_.resume_retry_ms));
      if (stopping_) return;  // Stop() ends what is left
      const absl::Time now = absl::Now();
      for (auto it = parked_.begin(); it != parked_.end();) {
        // Stacks that have not failed it first; then any that answers
        // again (one that failed it came back, or has KV room again).
        const bool gone = it->request.sink->client_gone();
        if (!gone && now < it->give_up && !SubmitLocked(it->request) &&
            !SubmitLocked(it->request, /*any_stack=*/true)) {
          ++it;
          continue;
        }
        if (gone || now >= it->give_up) ended.push_back(std::move(*it));
        it = parked_.erase(it);
      }
    }
    for (Parked& p : ended) {
      const absl::Status status =
          p.request.sink->client_gone()
              ? absl::CancelledError("client cancelled the request")
              : absl::UnavailableError(absl::StrCat(
                    "no stack took the request back in time; its stack "
                    "failed it with: ",
                    p.status.message()));
      CountRejected(status);
      p.request.sink->Finish(status);
    }
  }
}

void StackSet::Cancel(std::weak_ptr<const GenerationSink> sink) {
  std::vector<Parked> cancelled;
  {
    absl::MutexLock lock(&mu_);
    for (auto& s : stacks_) s->loop->Cancel(sink);
    const std::shared_ptr<const GenerationSink> target = sink.lock();
    for (auto it = parked_.begin(); target != nullptr && it != parked_.end();) {
      if (it->request.sink == target) {
        cancelled.push_back(std::move(*it));
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Parked& p : cancelled) {
    const absl::Status status =
        absl::CancelledError("client cancelled the request");
    CountRejected(status);
    p.request.sink->Finish(status);
  }
}

void StackSet::ReleaseKept(uint64_t loop, SequenceId id) {
  absl::MutexLock lock(&mu_);
  for (auto& s : stacks_) {
    if (s->loop->serial() == loop) {
      s->loop->ReleaseKept(id);
      return;
    }
  }
  // A retiring loop still runs until its drain ends.
  for (auto& s : retired_) {
    if (s->loop != nullptr && s->loop->serial() == loop) {
      s->loop->ReleaseKept(id);
    }
  }
}

void StackSet::CountRejected(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  // The totals are shared by every stack's metrics; any loop that has
  // them (its target answered once) counts.
  for (auto& s : stacks_) {
    if (s->loop->served_model().ready) {
      s->loop->CountRejected(status);
      return;
    }
  }
}

ServedModel StackSet::served_model() const {
  absl::MutexLock lock(&mu_);
  ServedModel first_ready;
  for (const auto& s : stacks_) {
    ServedModel m = s->loop->served_model();
    if (m.ready && s->loop->reachable()) return m;
    if (m.ready && !first_ready.ready) first_ready = std::move(m);
  }
  return first_ready;
}

int StackSet::running() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& s : stacks_) n += s->loop->running();
  return n;
}

std::vector<StackState> StackSet::Stacks() const {
  absl::MutexLock lock(&mu_);
  std::vector<StackState> out;
  for (const auto& s : stacks_) {
    StackState st;
    st.name = s->address.name;
    st.ready = s->loop->served_model().ready;
    st.reachable = s->loop->reachable();
    st.drafter_healthy = s->drafter != nullptr && s->drafter->healthy();
    st.load = s->loop->load();
    out.push_back(std::move(st));
  }
  return out;
}

const DrafterHealth* StackSet::SizingDrafter() const {
  const DrafterHealth* answered = nullptr;
  for (const auto& s : stacks_) {
    if (s->drafter == nullptr) continue;
    if (s->drafter->healthy()) return s->drafter.get();
    if (answered == nullptr && s->drafter->block_size() > 0) {
      answered = s->drafter.get();
    }
  }
  return answered;
}

bool StackSet::healthy() const {
  absl::MutexLock lock(&mu_);
  const DrafterHealth* d = SizingDrafter();
  return d != nullptr && d->healthy();
}

int StackSet::block_size() const {
  absl::MutexLock lock(&mu_);
  const DrafterHealth* d = SizingDrafter();
  return d != nullptr ? d->block_size() : 0;
}

int StackSet::num_passes() const {
  absl::MutexLock lock(&mu_);
  const DrafterHealth* d = SizingDrafter();
  return d != nullptr ? d->num_passes() : 0;
}

int StackSet::max_passes() const {
  absl::MutexLock lock(&mu_);
  const DrafterHealth* d = SizingDrafter();
  return d != nullptr ? d->max_passes() : 0;
}

}  // namespace dedit
