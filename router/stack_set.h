// The router's stacks (scale-out): one stack is one dedit-target plus the
// dedit-drafter it streams context to (in Kubernetes, one pod with two
// containers). The router keeps one set of backends per stack, a
// RemoteVerifier, a RemoteDrafter and its own GenerationLoop, so a sequence
// is pinned to the stack that admitted it by construction: its KV cache and
// its drafter context live there and nowhere else.
//
// Admission picks the least loaded stack (requests running or queued in its
// loop) among those whose target answers, ties broken round-robin. A stack
// whose target stops answering (a failed round, UNAVAILABLE) takes no new
// requests until its loop's Info probe answers again; a stack that leaves
// discovery (Update) is retired: its running requests may finish for
// Options::stack_drain_ms (a pod being replaced), then leave it (a dead one
// fails them at once). Other stacks are untouched.
//
// Failover: a request its stack fails (UNAVAILABLE; or RESOURCE_EXHAUSTED,
// no KV room) moves, with its stream's progress (router/stream_progress.h),
// to the least loaded reachable stack that has not failed it; that stack
// prefills the prompt and every token already streamed and continues from
// the next one, so the client sees one unbroken stream. When no such stack
// takes a request that has streamed tokens, it waits (is parked) and is
// offered every
// Options::resume_retry_ms to any reachable stack, one that failed it
// included once it answers again (a restarted target; a survivor that
// has KV room again), until its deadline or Options::resume_wait_ms after
// it was parked, whichever is first: then it ends UNAVAILABLE. A request
// that stacks failed (UNAVAILABLE) more than Options::max_moves times ends
// with its last error (a stack that answers Info but fails every round
// must not hold it forever); KV refusals, where it queues, do not count.
// A request that has streamed nothing ends with its stack's error
// (UNAVAILABLE, RESOURCE_EXHAUSTED) when no other stack takes it, as a
// fresh one is refused at once when no stack is reachable: its client can
// still retry elsewhere.
//
//   StackSet stacks(tokenizer, registry, options);
//   stacks.Update({{"a", "10.0.0.5:50051", "10.0.0.5:50052"}});
//   stacks.Submit(std::move(request));   // from a reactor; never blocks
//   stacks.Stop();                       // router shutdown
//
// Joining a stack takes time (its drafter's first health probe may wait out
// its deadline), so Update never joins: it queues the new stacks for a pool
// of Options::join_threads threads and returns. A later Update supersedes
// the joins still queued, and a join that finishes after its stack left the
// list is stopped at once. A stack that left is retired in place (its loop
// drains on its own thread) and reaped by one reaper thread, so the threads
// are bounded whatever the list holds: join_threads + 1, plus each stack's
// own (its loop, its drafter's prober), and stacks are bounded by discovery
// (--max_stacks).
//
// Thread-safe; no method blocks on a join or a drain except Stop().
#ifndef DEDIT_ROUTER_STACK_SET_H_
#define DEDIT_ROUTER_STACK_SET_H_

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/serving/internal_auth.h"
#include "router/generation_loop.h"
#include "router/remote_drafter.h"
#include "router/remote_verifier.h"
#include "router/router_backends.h"

namespace dedit {

// Where one stack's services answer.
struct StackAddress {
  std::string name;             // the `stack` metric label; unique
  std::string target_address;   // host:port
  std::string drafter_address;  // empty → the stack decodes target-only
  bool operator==(const StackAddress& o) const {
    return name == o.name && target_address == o.target_address &&
           drafter_address == o.drafter_address;
  }
};

// One stack as admission sees it (for Info, logs and tests).
struct StackState {
  std::string name;
  bool ready = false;      // its target answered Info at least once
  bool reachable = false;  // takes new requests
  bool drafter_healthy = false;
  int load = 0;  // running + queued in its loop
};

class StackSet : public DrafterHealth {
 public:
  struct Options {
    GenerationLoop::Options loop;  // stack_name and reroute are set here
    RemoteVerifier::Options verifier;
    RemoteDrafter::Options drafter;
    // How long a stack that left discovery may finish its running requests
    // (a pod being replaced drains; a dead one fails them at once).
    int64_t stack_drain_ms = 30000;
    // Stacks joined at once (--stack_join_threads).
    int join_threads = 8;
    // Failover (see above): how long a request that lost its stack waits
    // for another (--resume_wait_ms; its deadline may end it sooner), how
    // often it is offered to the stacks meanwhile, and how many times one
    // request may move.
    int64_t resume_wait_ms = 60000;
    int64_t resume_retry_ms = 100;
    int max_moves = 8;
    // How the channels to every target and drafter authenticate
    // (common/serving/internal_auth.h); default: plaintext.
    InternalAuth auth;
  };

  // `tokenizer` may be null; it and `registry` are shared by every stack.
  StackSet(const Tokenizer* tokenizer,
           std::shared_ptr<prometheus::Registry> registry, Options options);
  ~StackSet() override;  // Stop()s

  // Makes the stacks exactly `stacks`: new names get backends and a loop,
  // names that are gone (or whose addresses changed) are retired. Returns
  // at once: new stacks join on the pool (and take requests once joined);
  // joins still queued from an earlier Update are dropped. Ignored after
  // Stop().
  void Update(const std::vector<StackAddress>& stacks);
  // Router shutdown: queued joins are dropped, every loop stops (requests
  // end UNAVAILABLE, none is rerouted), probes stop. Waits for the joins in
  // progress (each at most its probes' deadlines) and for retiring stacks'
  // drains (at most Options::stack_drain_ms). Idempotent.
  void Stop();
  // Joins begun since construction (for tests: superseded joins never
  // begin).
  int64_t joins_started() const;

  // Admits a request on the least loaded reachable stack; UNAVAILABLE when
  // there is none.
  void Submit(RouterRequest request);
  // The client behind `sink` went away; told to every stack (a request may
  // be moving between them) and to the parked requests.
  void Cancel(std::weak_ptr<const GenerationSink> sink);
  void CountRejected(const absl::Status& status);
  // Sessions: a turn whose request.pinned_loop names a loop still serving
  // and reachable goes there (its kept sequence lives there); otherwise it
  // is admitted as above (and re-prefills). ReleaseKept releases a kept
  // sequence in the loop `loop` (GenerationLoop::serial()); nothing when
  // that loop is gone (it released its kept sequences when it stopped).
  void ReleaseKept(uint64_t loop, SequenceId id);

  // The model of the first ready stack (every stack serves the same one).
  ServedModel served_model() const;
  int running() const;
  std::vector<StackState> Stacks() const;

  // DrafterHealth over the stacks, for request defaults and limits:
  // healthy when any drafter is; the sizes of a healthy drafter (else of
  // any drafter that answered). A stack offering a smaller window clamps it
  // at admission (GenerationLoop::Admit).
  bool healthy() const override;
  int block_size() const override;
  int num_passes() const override;
  int max_passes() const override;

 private:
  struct Stack {
    StackAddress address;
    std::unique_ptr<RemoteVerifier> verifier;
    std::unique_ptr<RemoteDrafter> drafter;  // null → target-only
    std::unique_ptr<GenerationLoop> loop;    // null once reaped
  };

  std::unique_ptr<Stack> MakeStack(const StackAddress& address);
  // A join-pool thread: joins queued stacks until Stop().
  void JoinLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps a joined stack when the list still wants it; else stops it.
  void FinishJoin(const StackAddress& address, std::unique_ptr<Stack> stack)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The reaper thread: frees retired stacks whose loops have ended.
  void ReapLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasStackNamed(const std::string& name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool RetiredNamed(const std::string& name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Picks and submits under mu_ (a stack is never retired mid-Submit).
  // False when no reachable stack outside `request.tried_stacks` exists
  // (with `any_stack`, when no reachable stack exists).
  bool SubmitLocked(RouterRequest& request, bool any_stack = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GenerationLoop::Options::reroute of the stack `from`.
  bool Reroute(const std::string& from, RouterRequest& request,
               const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // The resumer thread: offers parked requests to the stacks, ends those
  // whose wait is over or whose client left.
  void ResumeLoop() ABSL_LOCKS_EXCLUDED(mu_);
  const DrafterHealth* SizingDrafter() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const Tokenizer* tokenizer_;
  std::shared_ptr<prometheus::Registry> registry_;
  Options options_;
  // dedit_round_streams_opened_total{service="target"|"drafter"}, over
  // all stacks: a rate above the stacks' count means streams keep breaking.
  prometheus::Counter* target_streams_opened_;
  prometheus::Counter* drafter_streams_opened_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Stack>> stacks_ ABSL_GUARDED_BY(mu_);
  // Stacks that left discovery, draining until their loops end; a name
  // here is not joined again until the reaper has freed its series.
  std::vector<std::unique_ptr<Stack>> retired_ ABSL_GUARDED_BY(mu_);
  uint64_t round_robin_ ABSL_GUARDED_BY(mu_) = 0;
  // The last Update's list; the joins it queued (pending_) and the names
  // being joined now (joining_).
  std::vector<StackAddress> desired_ ABSL_GUARDED_BY(mu_);
  std::deque<StackAddress> pending_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> joining_ ABSL_GUARDED_BY(mu_);
  int64_t joins_started_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled when pending_ grows, retired_ shrinks or stopping_ is set.
  absl::CondVar changed_;
  std::vector<std::thread> joiners_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
  // Requests that lost their stack and wait for one (failover).
  struct Parked {
    RouterRequest request;
    absl::Status status;  // why its last stack failed it
    absl::Time give_up;
  };
  std::vector<Parked> parked_ ABSL_GUARDED_BY(mu_);
  std::thread resumer_;  // started with the first parked request
};

}  // namespace dedit

#endif  // DEDIT_ROUTER_STACK_SET_H_
