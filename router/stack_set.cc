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
  loop_options.reroute = [this, name = address.name](RouterRequest& request,
                                                     const absl::Status&) {
    return Reroute(name, request);
  };
  stack->loop = std::make_unique<GenerationLoop>(
      RouterBackends{stack->verifier.get(), stack->verifier.get(),
                     stack->drafter.get(), stack->drafter.get()},
      tokenizer_, registry_, std::move(loop_options));
  stack->loop->Start();
  return stack;
}

void StackSet::Update(const std::vector<StackAddress>& stacks) {
  std::vector<std::unique_ptr<Stack>> gone;
  std::vector<StackAddress> added;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    for (auto it = stacks_.begin(); it != stacks_.end();) {
      if (std::find(stacks.begin(), stacks.end(), (*it)->address) ==
          stacks.end()) {
        gone.push_back(std::move(*it));
        it = stacks_.erase(it);
      } else {
        ++it;
      }
    }
    for (const StackAddress& a : stacks) {
      const bool known =
          std::any_of(stacks_.begin(), stacks_.end(),
                      [&](const auto& s) { return s->address.name == a.name; });
      if (!known) added.push_back(a);
    }
  }
  // New admissions stopped above; the loop ends its requests (rerouting
  // those without a token) on a thread of its own, since a round in flight
  // may take up to the target timeout.
  for (std::unique_ptr<Stack>& stack : gone) {
    Stack* s = stack.get();
    std::fprintf(stderr, "dedit-router: stack %s (%s) left\n",
                 s->address.name.c_str(), s->address.target_address.c_str());
    const absl::Duration drain = absl::Milliseconds(options_.stack_drain_ms);
    s->retirement = std::thread([s, drain] {
      s->loop->Retire(absl::UnavailableError(absl::StrCat(
                          "stack ", s->address.name, " went away")),
                      drain);
      // Its metric series go with the loop; the stack is unreachable
      // from here on (only Stop and JoinRetired see it, after the join).
      s->loop.reset();
      s->drafter.reset();
      s->verifier.reset();
      s->retired.store(true);
    });
    bool stopped = false;
    {
      absl::MutexLock lock(&mu_);
      stopped = stopping_;  // Stop() has taken retired_ already
      if (!stopped) retired_.push_back(std::move(stack));
    }
    if (stopped) stack->retirement.join();
  }
  for (const StackAddress& a : added) {
    // Its series and name must be free before a new incarnation uses them.
    JoinRetired(a.name);
    std::fprintf(
        stderr, "dedit-router: stack %s joined: target %s, drafter %s\n",
        a.name.c_str(), a.target_address.c_str(),
        a.drafter_address.empty() ? "(none)" : a.drafter_address.c_str());
    std::unique_ptr<Stack> stack = MakeStack(a);
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_) stacks_.push_back(std::move(stack));
    }
    if (stack != nullptr) {  // Stop() ran meanwhile: it never serves
      stack->loop->Stop();
      if (stack->drafter) stack->drafter->Stop();
    }
  }
  // Reap the retirements that have finished.
  std::vector<std::unique_ptr<Stack>> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->retired.load()) {
        finished.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& f : finished) f->retirement.join();
}

void StackSet::JoinRetired(const std::string& name) {
  std::vector<std::unique_ptr<Stack>> joined;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      if ((*it)->address.name == name) {
        joined.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : joined) {
    if (s->retirement.joinable()) s->retirement.join();
  }
}

void StackSet::Stop() {
  std::vector<std::unique_ptr<Stack>> stacks;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stacks.swap(stacks_);
    for (auto& s : retired_) stacks.push_back(std::move(s));
    retired_.clear();
  }
  for (auto& s : stacks) {
    if (s->retirement.joinable()) s->retirement.join();
    if (s->loop) s->loop->Stop();
    if (s->drafter) s->drafter->Stop();
  }
}

bool StackSet::SubmitLocked(RouterRequest& request) {
  if (request.pinned_loop != 0) {
    for (auto& s : stacks_) {
      if (s->loop->serial() == request.pinned_loop && s->loop->reachable() &&
          std::find(request.tried_stacks.begin(), request.tried_stacks.end(),
                    s->address.name) == request.tried_stacks.end()) {
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
    if (std::find(request.tried_stacks.begin(), request.tried_stacks.end(),
                  s->address.name) != request.tried_stacks.end()) {
      continue;
    }
    if (!s->loop->reachable()) continue;
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

bool StackSet::Reroute(const std::string& from, RouterRequest& request) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  request.tried_stacks.push_back(from);
  return SubmitLocked(request);
}

void StackSet::Cancel(std::weak_ptr<const GenerationSink> sink) {
  absl::MutexLock lock(&mu_);
  for (auto& s : stacks_) s->loop->Cancel(sink);
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
    if (s->loop->serial() == loop) s->loop->ReleaseKept(id);
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
