// Generation.Session end to end: real dedit-target,
// dedit-drafter and dedit-router processes on loopback. Every turn of a
// session equals a fresh Generate over the session's history (and the
// target's greedy decoding), while the target prefills only the new tokens.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/in_process.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "tests/services/service_cluster.h"
#include "tests/services/stream_client.h"

namespace dedit {
namespace {

using testing::Generate;
using testing::Generated;
using ::testing::HasSubstr;
using testing::IdsRequest;
using testing::RandomPrompt;
using testing::ServiceCluster;
using testing::SessionClient;
using testing::TokensTurn;
using testing::WaitFor;

class SessionsTest : public ::testing::Test {
 protected:
  void StartCluster(ServiceCluster::Options options = {}) {
    cluster_ = std::make_unique<ServiceCluster>(options);
    const absl::Status started = cluster_->Start();
    ASSERT_TRUE(started.ok()) << started;
    stub_ = v1::Generation::NewStub(cluster_->RouterChannel());
    ASSERT_TRUE(
        testing::WaitForRouterReady(stub_.get(), options.with_drafter, 20000));
  }
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    if (reference_ == nullptr) {
      InProcessStack::Options o;
      o.target_dir = cluster_->target_dir();
      o.drafter_dir = cluster_->drafter_dir();
      auto stack = InProcessStack::Load(o);
      EXPECT_TRUE(stack.ok()) << stack.status();
      reference_ = std::move(*stack);
    }
    return testing::GreedyReference(reference_->target(), prompt, n);
  }
  v1::TargetInfoResponse TargetInfo() {
    auto stub = v1::Target::NewStub(cluster_->TargetChannel());
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TargetInfoResponse info;
    EXPECT_TRUE(stub->Info(&c, {}, &info).ok());
    return info;
  }
  int DrafterSequences() {
    auto stub = v1::Drafter::NewStub(cluster_->DrafterChannel());
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DrafterInfoResponse info;
    EXPECT_TRUE(stub->Info(&c, {}, &info).ok());
    return info.num_sequences();
  }
  double RouterMetric(const std::string& name) {
    auto text = ServiceCluster::Scrape(cluster_->router()->metrics_port());
    EXPECT_TRUE(text.ok()) << text.status();
    return ServiceCluster::MetricValue(text.value_or(""), name);
  }
  bool ServicesEmpty() {
    return TargetInfo().num_sequences() == 0 &&
           TargetInfo().reserved_tokens() == 0 &&
           (cluster_->drafter() == nullptr || DrafterSequences() == 0);
  }

  std::unique_ptr<ServiceCluster> cluster_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<InProcessStack> reference_;
};

v1::SessionOpen SpeculativeOpen(bool speculate) {
  v1::SessionOpen open;
  open.set_ignore_eos(true);
  open.set_window(8);
  open.set_passes(2);
  open.set_disable_speculation(!speculate);
  return open;
}

// The headline: five turns, each equal token for token to a fresh Generate
// over the whole history and to the target's greedy decoding, with and
// without speculation; from turn 2 on the target prefills only the new
// tokens; closing the session empties both services.
TEST_F(SessionsTest, FiveTurnsEqualFreshGenerateWithAndWithoutSpeculation) {
  StartCluster();
  constexpr int kNew = 12;
  for (bool speculate : {true, false}) {
    SCOPED_TRACE(speculate ? "speculative" : "target-only");
    SessionClient session(stub_.get());
    v1::SessionOpened opened;
    ASSERT_TRUE(session.Open(SpeculativeOpen(speculate), &opened));
    EXPECT_FALSE(opened.session_id().empty());
    std::vector<int32_t> history;
    int64_t saved = 0, prefilled = 0, fresh_prefill = 0;
    for (int turn = 1; turn <= 5; ++turn) {
      SCOPED_TRACE(turn);
      const std::vector<int32_t> input =
          RandomPrompt(6 + 3 * turn, 120, 100 * turn + speculate);
      const Generated g = session.Turn(TokensTurn(input, kNew));
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      ASSERT_TRUE(g.last.finished());
      EXPECT_EQ(session.last_turn(), turn);
      history.insert(history.end(), input.begin(), input.end());

      v1::GenerateRequest fresh_request = IdsRequest(history, kNew, 8, 2);
      fresh_request.set_disable_speculation(!speculate);
      const Generated fresh = Generate(stub_.get(), fresh_request);
      ASSERT_TRUE(fresh.status.ok()) << fresh.status.error_message();
      EXPECT_EQ(g.tokens, fresh.tokens);
      EXPECT_EQ(g.tokens, Greedy(history, kNew));

      const v1::Usage& usage = g.last.usage();
      EXPECT_EQ(usage.prompt_tokens(), static_cast<int>(history.size()));
      EXPECT_FALSE(usage.cache_lost());
      const int64_t before =
          static_cast<int64_t>(history.size() - input.size());
      if (turn == 1) {
        EXPECT_EQ(usage.cached_prompt_tokens(), 0);
      } else {
        // Everything before this turn's input is cached but, at most, the
        // previous answer's last token (no KV yet when it ended).
        EXPECT_GE(usage.cached_prompt_tokens(), before - 1);
        EXPECT_LE(usage.cached_prompt_tokens(), before);
      }
      saved += usage.cached_prompt_tokens();
      prefilled += usage.prompt_tokens() - usage.cached_prompt_tokens();
      fresh_prefill += usage.prompt_tokens();
      EXPECT_EQ(g.last.finish_reason(), v1::FINISH_REASON_LENGTH);
      if (speculate) {
        EXPECT_GT(g.last.acceptance().drafted_rounds(), 0);
      }
      history.insert(history.end(), g.tokens.begin(), g.tokens.end());
      // Between turns the sequence is kept idle on the target.
      EXPECT_TRUE(
          WaitFor([&] { return TargetInfo().idle_sequences() == 1; }, 5000));
    }
    std::printf(
        "[ sessions ] %s: 5 turns, prompt tokens %lld, prefilled %lld "
        "(fresh Generate calls: %lld), saved %lld\n",
        speculate ? "speculative" : "target-only",
        static_cast<long long>(fresh_prefill),
        static_cast<long long>(prefilled),
        static_cast<long long>(fresh_prefill), static_cast<long long>(saved));
    EXPECT_GT(saved, prefilled);
    EXPECT_TRUE(session.Close().ok());
    EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 5000));
  }
  EXPECT_EQ(RouterMetric("dedit_session_turns_total"), 10);
  EXPECT_GT(RouterMetric("dedit_session_prefill_tokens_saved_total"), 0);
  EXPECT_EQ(RouterMetric("dedit_sessions_open"), 0);
}

// Chat sessions: the history is the conversation, each answer as an
// assistant message with the streamed text; a turn equals Generate over
// those messages even though re-encoding the text may differ from the
// tokens cached (the common prefix is reused, the rest re-prefilled).
TEST_F(SessionsTest, ChatTurnsEqualGenerateOverTheConversation) {
  StartCluster();
  SessionClient session(stub_.get());
  v1::SessionOpen open = SpeculativeOpen(true);
  ASSERT_TRUE(session.Open(open));
  v1::ChatMessages conversation;
  const char* questions[] = {"hello there", "why is the sky blue?",
                             "and the sea?"};
  for (int turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE(turn);
    v1::SessionTurn t;
    v1::ChatMessage* m = t.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(questions[turn]);
    t.set_max_tokens(10);
    const Generated g = session.Turn(t);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    *conversation.add_messages() = *m;
    v1::GenerateRequest fresh;
    *fresh.mutable_chat() = conversation;
    fresh.set_max_tokens(10);
    fresh.set_ignore_eos(true);
    fresh.set_window(8);
    fresh.set_passes(2);
    const Generated f = Generate(stub_.get(), fresh);
    ASSERT_TRUE(f.status.ok()) << f.status.error_message();
    EXPECT_EQ(g.tokens, f.tokens);
    EXPECT_EQ(g.text, f.text);
    EXPECT_EQ(g.last.usage().prompt_tokens(), f.last.usage().prompt_tokens());
    if (turn > 0) EXPECT_GT(g.last.usage().cached_prompt_tokens(), 0);
    v1::ChatMessage* answer = conversation.add_messages();
    answer->set_role("assistant");
    answer->set_content(g.text);
  }
  EXPECT_TRUE(session.Close().ok());
  EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 5000));
}

// Cancel mid-turn: the turn ends with FINISH_REASON_CANCELLED after a
// greedy prefix; the next turn continues from what was streamed.
TEST_F(SessionsTest, CancelMidTurnThenTheNextTurnContinues) {
  StartCluster();
  SessionClient session(stub_.get());
  ASSERT_TRUE(session.Open(SpeculativeOpen(true)));
  const std::vector<int32_t> prompt = RandomPrompt(10, 120, 5);
  bool cancelled = false;
  const Generated g =
      session.Turn(TokensTurn(prompt, 1500), [&](const Generated& so_far) {
        if (!cancelled && so_far.messages >= 3) {
          cancelled = true;
          EXPECT_TRUE(session.Cancel());
        }
      });
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.last.finish_reason(), v1::FINISH_REASON_CANCELLED);
  ASSERT_GT(g.tokens.size(), 0u);
  ASSERT_LT(g.tokens.size(), 1500u);
  EXPECT_EQ(g.tokens, Greedy(prompt, static_cast<int>(g.tokens.size())));

  std::vector<int32_t> history = prompt;
  history.insert(history.end(), g.tokens.begin(), g.tokens.end());
  const std::vector<int32_t> input = RandomPrompt(7, 120, 6);
  history.insert(history.end(), input.begin(), input.end());
  const Generated next = session.Turn(TokensTurn(input, 12));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.tokens, Greedy(history, 12));
  EXPECT_GT(next.last.usage().cached_prompt_tokens(), 0);
  EXPECT_TRUE(session.Close().ok());
  EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 5000));
}

// A client that goes quiet: its session ends DEADLINE_EXCEEDED within the
// idle timeout and both services are empty again.
TEST_F(SessionsTest, QuietClientsSessionEndsAtTheIdleTimeout) {
  ServiceCluster::Options options;
  options.router_flags = {"--session_idle_timeout_s=1"};
  StartCluster(options);
  SessionClient quiet(stub_.get());
  ASSERT_TRUE(quiet.Open(SpeculativeOpen(true)));
  ASSERT_TRUE(
      quiet.Turn(TokensTurn(RandomPrompt(12, 120, 1), 8)).last.finished());
  const auto t0 = std::chrono::steady_clock::now();
  v1::SessionResponse r;
  EXPECT_FALSE(quiet.Read(&r));
  const grpc::Status status = quiet.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("idle"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 3000));
  EXPECT_TRUE(
      WaitFor([&] { return RouterMetric("dedit_sessions_open") == 0; }, 3000));
}

// A client that vanishes (its stream broken) mid-turn or between turns
// releases everything at once (the idle timeout here is the default 300 s).
TEST_F(SessionsTest, VanishedClientsReleaseTheirCacheAtOnce) {
  StartCluster();
  for (bool mid_turn : {true, false}) {
    SCOPED_TRACE(mid_turn ? "mid-turn" : "between turns");
    auto vanishing = std::make_unique<SessionClient>(stub_.get());
    ASSERT_TRUE(vanishing->Open(SpeculativeOpen(true)));
    if (mid_turn) {
      v1::SessionRequest request;
      *request.mutable_turn() = TokensTurn(RandomPrompt(12, 120, 2), 3000);
      ASSERT_TRUE(vanishing->Send(request));
      v1::SessionResponse r;
      ASSERT_TRUE(vanishing->Read(&r));
    } else {
      ASSERT_TRUE(vanishing->Turn(TokensTurn(RandomPrompt(12, 120, 3), 8))
                      .last.finished());
    }
    // Running, or kept idle once its turn ended. (Polled: the first
    // streamed message can race the target's bookkeeping on a loaded
    // machine; the waits end as soon as the condition holds.)
    EXPECT_TRUE(
        WaitFor([&] { return TargetInfo().num_sequences() == 1; }, 5000));
    vanishing.reset();  // cancels the call
    EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 15000));
  }
  EXPECT_TRUE(
      WaitFor([&] { return RouterMetric("dedit_sessions_open") == 0; }, 10000));
}

// KV pressure: a prompt that needs the room evicts the idle session's
// sequence on the target; that session's next turn re-prefills its whole
// history (cache_lost, counted) and is still exact.
TEST_F(SessionsTest, EvictedSessionsNextTurnIsStillExact) {
  ServiceCluster::Options options;
  options.target_flags = {"--kv_capacity_tokens=200"};
  StartCluster(options);
  SessionClient session(stub_.get());
  ASSERT_TRUE(session.Open(SpeculativeOpen(true)));
  std::vector<int32_t> history = RandomPrompt(100, 120, 9);
  const Generated first = session.Turn(TokensTurn(history, 16));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  history.insert(history.end(), first.tokens.begin(), first.tokens.end());
  ASSERT_TRUE(
      WaitFor([&] { return TargetInfo().idle_sequences() == 1; }, 5000));

  // 60 + 40 + 8 = 108 tokens to reserve; 200 - ~115 idle are free.
  const Generated other =
      Generate(stub_.get(), IdsRequest(RandomPrompt(60, 120, 10), 40, 8, 2));
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(TargetInfo().evicted_sequences(), 1);
  EXPECT_EQ(TargetInfo().idle_sequences(), 0);

  const std::vector<int32_t> input = RandomPrompt(10, 120, 11);
  history.insert(history.end(), input.begin(), input.end());
  const Generated next = session.Turn(TokensTurn(input, 16));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_TRUE(next.last.usage().cache_lost());
  EXPECT_EQ(next.last.usage().cached_prompt_tokens(), 0);
  EXPECT_EQ(next.tokens, Greedy(history, 16));
  EXPECT_EQ(RouterMetric("dedit_session_reprefills_total"), 1);
  auto target_metrics =
      ServiceCluster::Scrape(cluster_->target()->metrics_port());
  ASSERT_TRUE(target_metrics.ok());
  EXPECT_EQ(ServiceCluster::MetricValue(*target_metrics,
                                        "dedit_target_sequences_evicted_total"),
            1);
  EXPECT_TRUE(session.Close().ok());
  EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 5000));
}

// Sequence leases: an idle session's sequence would expire on the
// target after --sequence_lease_seconds, but the router that holds it
// renews it (Target.KeepAlive every lease / 3), so a turn after a long
// pause still reuses the cache; a router that is gone renews nothing and
// the target frees the sequence.
TEST_F(SessionsTest, IdleSessionsRenewTheirLeases) {
  ServiceCluster::Options options;
  options.target_flags = {"--sequence_lease_seconds=1.5"};
  StartCluster(options);
  SessionClient session(stub_.get());
  ASSERT_TRUE(session.Open(SpeculativeOpen(true)));
  std::vector<int32_t> history = RandomPrompt(20, 120, 31);
  const Generated first = session.Turn(TokensTurn(history, 8));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  history.insert(history.end(), first.tokens.begin(), first.tokens.end());
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));
  EXPECT_EQ(TargetInfo().expired_sequences(), 0);
  EXPECT_EQ(TargetInfo().idle_sequences(), 1);
  const std::vector<int32_t> input = RandomPrompt(5, 120, 32);
  history.insert(history.end(), input.begin(), input.end());
  const Generated next = session.Turn(TokensTurn(input, 8));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_FALSE(next.last.usage().cache_lost());
  EXPECT_GT(next.last.usage().cached_prompt_tokens(), 20);
  EXPECT_EQ(next.tokens, Greedy(history, 8));

  // The router dies (SIGKILL): nobody renews; the target frees it.
  cluster_->router()->Kill();
  EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 8000));
  EXPECT_EQ(TargetInfo().expired_sequences(), 1);
}

// Resident memory of a process in bytes (VmRSS), for the log.
int64_t RssBytes(pid_t pid) {
  return testing::ProcStatusValue(pid, "VmRSS") * 1024;
}

// After one long request, idle sessions hold their own tokens' KV on the
// target, not a slab each as long as the longest sequence ever seen, and
// the pool gives its memory back once they close.
TEST_F(SessionsTest, IdleSessionsHoldTheirOwnTokensNotTheLongestSlab) {
  StartCluster();
  const pid_t target = cluster_->target()->pid();
  const int64_t rss_start = RssBytes(target);
  v1::GenerateRequest long_request =
      IdsRequest(RandomPrompt(1000, 120, 77), 8, 8, 2);
  const Generated long_one = Generate(stub_.get(), long_request);
  ASSERT_TRUE(long_one.status.ok()) << long_one.status.error_message();
  constexpr int kSessions = 24;
  std::vector<std::unique_ptr<SessionClient>> sessions;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(std::make_unique<SessionClient>(stub_.get()));
    ASSERT_TRUE(sessions.back()->Open(SpeculativeOpen(true)));
    const Generated g =
        sessions.back()->Turn(TokensTurn(RandomPrompt(10, 120, 500 + i), 4));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  }
  ASSERT_TRUE(WaitFor(
      [&] { return TargetInfo().idle_sequences() == kSessions; }, 5000));
  const v1::TargetInfoResponse info = TargetInfo();
  ASSERT_GT(info.cached_tokens(), 0);
  const int64_t token_bytes = info.kv_bytes_in_use() / info.cached_tokens();
  const int64_t held_tokens = info.kv_bytes_held() / token_bytes;
  const int64_t rss_idle = RssBytes(target);
  std::printf(
      "[ kv memory ] %d idle sessions after a 1008-token request: %lld "
      "tokens cached, the pool holds %lld tokens' worth (%lld bytes); "
      "target RSS %lld MB at start, %lld MB now\n",
      kSessions, static_cast<long long>(info.cached_tokens()),
      static_cast<long long>(held_tokens),
      static_cast<long long>(info.kv_bytes_held()),
      static_cast<long long>(rss_start >> 20),
      static_cast<long long>(rss_idle >> 20));
  // Each session: its ~14 tokens (whole 16-token key blocks at most), plus
  // the pool's initial slots (4 x 256). A slab each would be 24 x 1008+.
  EXPECT_LE(held_tokens, info.cached_tokens() + kSessions * 16 + 4 * 256);
  // The drafter parks them too, once idle for --park_idle_ms (2 s).
  auto drafter_held_tokens = [&] {
    auto stub = v1::Drafter::NewStub(cluster_->DrafterChannel());
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::DrafterInfoResponse d;
    EXPECT_TRUE(stub->Info(&c, {}, &d).ok());
    if (d.context_tokens() == 0) return int64_t{-1};
    const int64_t bytes = d.kv_bytes_in_use() / d.context_tokens();
    return d.kv_bytes_held() / bytes - d.context_tokens();
  };
  EXPECT_TRUE(WaitFor(
      [&] {
        const int64_t slack = drafter_held_tokens();
        return slack >= 0 && slack <= kSessions * 16 + 4 * 256;
      },
      8000))
      << "drafter slack: " << drafter_held_tokens() << " tokens";
  for (auto& session : sessions) EXPECT_TRUE(session->Close().ok());
  ASSERT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 5000));
  const v1::TargetInfoResponse after = TargetInfo();
  EXPECT_EQ(after.kv_bytes_in_use(), 0);
  EXPECT_LE(after.kv_bytes_held() / token_bytes, 4 * 256);
  std::printf(
      "[ kv memory ] closed: the pool holds %lld bytes; target RSS "
      "%lld MB\n",
      static_cast<long long>(after.kv_bytes_held()),
      static_cast<long long>(RssBytes(target) >> 20));
}

// Bad input ends the stream with a status naming what is wrong, and leaks
// nothing.
TEST_F(SessionsTest, BadSessionsAreRefusedClearly) {
  ServiceCluster::Options options;
  options.router_flags = {"--max_sessions=2", "--max_session_turns=2"};
  StartCluster(options);
  auto status_of = [&](const std::vector<v1::SessionRequest>& requests) {
    SessionClient s(stub_.get());
    v1::SessionResponse response;
    for (const v1::SessionRequest& r : requests) {
      if (!s.Send(r)) break;
      // One turn at a time: read each turn to its end.
      if (r.has_turn() && !s.ReadTurn().last.finished()) break;
    }
    while (s.Read(&response)) {
    }
    return s.Finish();
  };
  v1::SessionRequest open;
  *open.mutable_open() = SpeculativeOpen(true);
  v1::SessionRequest turn;
  *turn.mutable_turn() = TokensTurn({1, 2, 3}, 4);

  grpc::Status s = status_of({turn});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("open"));
  s = status_of({open, open});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::SessionRequest bad_open = open;
  bad_open.mutable_open()->set_window(999);
  s = status_of({bad_open});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("window"));
  s = status_of({open, turn, turn, turn});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("max_session_turns"));

  // A bad turn fails alone, naming what was wrong; the session stays open
  // and its next turn continues the history it had, from the cache.
  {
    SessionClient c(stub_.get());
    ASSERT_TRUE(c.Open(SpeculativeOpen(true)));
    Generated first = c.Turn(TokensTurn({1, 2, 3}, 4));
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    v1::SessionTurn no_max = TokensTurn({4, 5}, 4);
    no_max.set_max_tokens(0);
    Generated refused = c.Turn(no_max);
    EXPECT_TRUE(refused.turn_refused);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(refused.status.error_message(), HasSubstr("max_tokens"));
    v1::SessionTurn chat;
    chat.set_max_tokens(4);
    chat.mutable_chat()->add_messages()->set_role("user");
    refused = c.Turn(chat);
    EXPECT_TRUE(refused.turn_refused);
    EXPECT_THAT(refused.status.error_message(), HasSubstr("token session"));
    // History past the context.
    const int64_t context = DefaultTinySpec().target.max_position_embeddings;
    refused = c.Turn(
        TokensTurn(RandomPrompt(static_cast<int>(context) - 2, 120, 3), 4));
    EXPECT_TRUE(refused.turn_refused);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(refused.status.error_message(), HasSubstr("session history"));
    EXPECT_THAT(refused.status.error_message(), HasSubstr("context"));
    // The next turn is the session's second and reuses the first's cache.
    Generated second = c.Turn(TokensTurn({4, 5}, 4));
    ASSERT_TRUE(second.status.ok()) << second.status.error_message();
    EXPECT_FALSE(second.turn_refused);
    EXPECT_EQ(second.tokens.size(), 4u);
    EXPECT_GT(second.last.usage().cached_prompt_tokens(), 0);
    std::vector<int32_t> history = {1, 2, 3};
    history.insert(history.end(), first.tokens.begin(), first.tokens.end());
    history.insert(history.end(), {4, 5});
    v1::GenerateRequest fresh = IdsRequest(history, 4, 8, 2);
    Generated want = Generate(stub_.get(), fresh);
    ASSERT_TRUE(want.status.ok()) << want.status.error_message();
    EXPECT_EQ(second.tokens, want.tokens);
    EXPECT_TRUE(c.Close().ok());
  }
  // Sessions per router (a session's slot is free once its status has
  // reached the client).
  EXPECT_EQ(RouterMetric("dedit_sessions_open"), 0);
  {
    SessionClient a(stub_.get()), b(stub_.get());
    ASSERT_TRUE(a.Open(SpeculativeOpen(true)));
    ASSERT_TRUE(b.Open(SpeculativeOpen(true)));
    s = status_of({open});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(s.error_message(), HasSubstr("max_sessions"));
  }
  EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 5000));
  EXPECT_TRUE(
      WaitFor([&] { return RouterMetric("dedit_sessions_open") == 0; }, 5000));
}

// A session's --max_sessions slot is given back before its final status is
// sent: a client that saw one session end (closed, refused or failed) can
// open the next at once, with no wait for the router's clean-up.
TEST_F(SessionsTest, AnEndedSessionFreesItsSlotBeforeTheClientSeesTheEnd) {
  ServiceCluster::Options options;
  options.router_flags = {"--max_sessions=1", "--max_session_turns=1"};
  StartCluster(options);
  for (int i = 0; i < 25; ++i) {
    SessionClient c(stub_.get());
    ASSERT_TRUE(c.Open(SpeculativeOpen(true))) << "session " << i;
    if (i % 2 == 0) {
      Generated turn = c.Turn(TokensTurn({1, 2, 3}, 2));
      ASSERT_TRUE(turn.status.ok()) << turn.status.error_message();
    }
    ASSERT_TRUE(c.Close().ok()) << "session " << i;
  }
  // A refused session (too many turns) frees its slot as well.
  for (int i = 0; i < 5; ++i) {
    SessionClient c(stub_.get());
    ASSERT_TRUE(c.Open(SpeculativeOpen(true)));
    Generated first = c.Turn(TokensTurn({1, 2, 3}, 2));
    ASSERT_TRUE(first.status.ok()) << first.status.error_message();
    Generated second = c.Turn(TokensTurn({4, 5}, 2));
    EXPECT_EQ(second.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << second.status.error_message();
  }
  SessionClient last(stub_.get());
  EXPECT_TRUE(last.Open(SpeculativeOpen(true)));
  EXPECT_TRUE(last.Close().ok());
}

// Runs `command` in a shell, returns its stdout.
std::string Shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

// dedit-cli chat in a real terminal (tmux): turns are typed, answers and
// per-turn statistics read off the screen; the second turn reuses the
// first's cache; /quit closes the session and empties both services.
TEST_F(SessionsTest, CliChatInATerminal) {
  ASSERT_EQ(std::system("command -v tmux >/dev/null"), 0)
      << "tmux is missing (scripts/install-deps.sh installs it)";
  StartCluster();
  const std::string socket =
      absl::StrCat("dedit-chat-test-", static_cast<long>(getpid()));
  const std::string tmux = absl::StrCat("tmux -L ", socket, " ");
  const std::string chat = absl::StrCat(
      DEDIT_CLI_BINARY, " chat --router=", cluster_->router_address(),
      " --max_tokens=6 --ignore_eos --window=8 --passes=2");
  ASSERT_EQ(std::system((tmux + "new-session -d -s chat -x 160 -y 40 '" + chat +
                         "; echo CHAT-EXITED-$?; sleep 30'")
                            .c_str()),
            0);
  auto screen = [&] { return Shell(tmux + "capture-pane -p -t chat"); };
  auto type = [&](const std::string& line) {
    std::system((tmux + "send-keys -t chat -l '" + line + "'").c_str());
    std::system((tmux + "send-keys -t chat Enter").c_str());
  };
  // The prompt marker (capture-pane drops its trailing space).
  EXPECT_TRUE(
      WaitFor([&] { return screen().find('>') != std::string::npos; }, 10000))
      << screen();
  type("hello there");
  EXPECT_TRUE(WaitFor(
      [&] { return screen().find("[turn 1: 6 tokens") != std::string::npos; },
      20000))
      << screen();
  EXPECT_THAT(screen(), HasSubstr("(0 cached)"));
  EXPECT_EQ(TargetInfo().idle_sequences(), 1);
  type("and again");
  EXPECT_TRUE(WaitFor(
      [&] { return screen().find("[turn 2: 6 tokens") != std::string::npos; },
      20000))
      << screen();
  const std::string after_two = screen();
  const size_t stats = after_two.find("[turn 2:");
  const size_t cached = after_two.find(" cached", stats);
  ASSERT_NE(cached, std::string::npos) << after_two;
  const size_t open = after_two.rfind('(', cached);
  EXPECT_GT(std::atoi(after_two.substr(open + 1, cached - open - 1).c_str()), 0)
      << after_two;
  type("/quit");
  EXPECT_TRUE(WaitFor(
      [&] { return screen().find("CHAT-EXITED-0") != std::string::npos; },
      10000))
      << screen();
  std::system((tmux + "kill-server").c_str());
  EXPECT_TRUE(WaitFor([&] { return ServicesEmpty(); }, 5000));
}

}  // namespace
}  // namespace dedit
