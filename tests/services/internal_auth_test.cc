// The internal ports authenticate their callers. Real
// dedit-drafter, dedit-target and dedit-router processes on loopback, once
// with a shared token (--internal_token_file) and once with mTLS
// certificates made at test time by scripts/make_internal_certs.sh (the
// same script deploy/README.md tells operators to use): calls without the
// token or without a certificate are refused, the cluster still generates
// the target's greedy tokens with the drafter's help, and health stays
// reachable for probes.
#include "common/serving/internal_auth.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/in_process.h"
#include "common/serving/server_bootstrap.h"
#include "dedit/v1/services.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "tests/services/service_cluster.h"
#include "tests/services/stream_client.h"

namespace dedit {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using testing::Generate;
using testing::Generated;
using ::testing::HasSubstr;
using testing::IdsRequest;
using testing::RandomPrompt;
using testing::ServiceCluster;
using testing::ServiceProcess;
using testing::WaitFor;

constexpr char kToken[] = "3f9c2a7d51e84b06a1c9d2e7f4b8a6c0";

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return path;
}

// The certificates of scripts/make_internal_certs.sh in `dir`.
bool MakeCerts(const std::string& dir) {
  const std::string command =
      absl::StrCat("bash ", DEDIT_SOURCE_DIR,
                   "/scripts/make_internal_certs.sh ", dir, " >/dev/null");
  return std::system(command.c_str()) == 0;
}

std::vector<std::string> TlsFlags(const std::string& dir,
                                  const std::string& who) {
  return {absl::StrCat("--tls_cert=", dir, "/", who, ".crt"),
          absl::StrCat("--tls_key=", dir, "/", who, ".key"),
          absl::StrCat("--tls_ca=", dir, "/ca.crt")};
}

std::shared_ptr<grpc::Channel> Plaintext(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                             grpc::InsecureChannelCredentials());
}

std::shared_ptr<grpc::Channel> Authenticated(const InternalAuthOptions& o,
                                             int port) {
  absl::StatusOr<InternalAuth> auth = InternalAuth::Load(o);
  EXPECT_TRUE(auth.ok()) << auth.status();
  return auth.value_or(InternalAuth())
      .Channel(absl::StrCat("127.0.0.1:", port), InternalChannelArguments());
}

grpc::ClientContext* WithDeadline(grpc::ClientContext* c) {
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return c;
}

grpc::Status TargetInfo(const std::shared_ptr<grpc::Channel>& channel,
                        v1::TargetInfoResponse* info = nullptr) {
  v1::TargetInfoResponse unused;
  grpc::ClientContext c;
  return v1::Target::NewStub(channel)->Info(WithDeadline(&c), {},
                                            info ? info : &unused);
}

grpc::Status DrafterInfo(const std::shared_ptr<grpc::Channel>& channel,
                         v1::DrafterInfoResponse* info = nullptr) {
  v1::DrafterInfoResponse unused;
  grpc::ClientContext c;
  return v1::Drafter::NewStub(channel)->Info(WithDeadline(&c), {},
                                             info ? info : &unused);
}

// "" on `channel`; UNKNOWN when the call fails.
HealthCheckResponse::ServingStatus Health(
    const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext c;
  HealthCheckResponse response;
  const grpc::Status s = grpc::health::v1::Health::NewStub(channel)->Check(
      WithDeadline(&c), HealthCheckRequest(), &response);
  return s.ok() ? response.status() : HealthCheckResponse::UNKNOWN;
}

// Waits until the router knows the model and sees a healthy drafter, then
// checks that a speculative request (W 4, K 1) streams the target's greedy
// tokens with every round drafted by the drafter service (none fell back).
void ExpectSpeculativeGreedyOutput(ServiceCluster& cluster) {
  auto stub = v1::Generation::NewStub(cluster.RouterChannel());
  // The model known: the loop has reached the target (its TLS handshake
  // may finish after the drafter's health probe).
  ASSERT_TRUE(
      testing::WaitForRouterReady(stub.get(), /*with_drafter=*/true, 20000));
  const std::vector<int32_t> prompt = RandomPrompt(9, 300, 17);
  Generated g = Generate(stub.get(), IdsRequest(prompt, 24, 4, 1));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  InProcessStack::Options o;
  o.target_dir = cluster.target_dir();
  o.drafter_dir = cluster.drafter_dir();
  auto reference = InProcessStack::Load(o);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ(g.tokens,
            testing::GreedyReference((*reference)->target(), prompt, 24));
  EXPECT_GT(g.last.acceptance().drafted_rounds(), 0);
  EXPECT_EQ(g.last.acceptance().fallback_rounds(), 0);
}

TEST(InternalAuthTest, TokenRefusesCallsWithoutItAndTheClusterServes) {
  const std::string dir = testing::MakeTempDir();
  const std::string token_file =
      WriteFile(dir + "/token", absl::StrCat(kToken, "\n"));
  const std::string flag = "--internal_token_file=" + token_file;
  ServiceCluster::Options options;
  options.router_flags = {flag};
  options.target_flags = {flag};
  options.drafter_flags = {flag};
  ServiceCluster cluster(options);
  const absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  ExpectSpeculativeGreedyOutput(cluster);

  const int target = cluster.target()->grpc_port();
  const int drafter = cluster.drafter()->grpc_port();
  // No token, a wrong one: UNAUTHENTICATED, on both services.
  EXPECT_EQ(TargetInfo(Plaintext(target)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(DrafterInfo(Plaintext(drafter)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  InternalAuthOptions wrong;
  wrong.token_file =
      WriteFile(dir + "/wrong", "3f9c2a7d51e84b06a1c9d2e7f4b8a6c1");
  EXPECT_EQ(TargetInfo(Authenticated(wrong, target)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(DrafterInfo(Authenticated(wrong, drafter)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // The token in metadata by hand, as any client may send it.
  {
    grpc::ClientContext c;
    c.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::TargetInfoResponse info;
    EXPECT_TRUE(v1::Target::NewStub(Plaintext(target))
                    ->Info(WithDeadline(&c), {}, &info)
                    .ok());
  }
  // With the token: answers, and the target's context stream (which
  // carries it too) is attached to the drafter.
  InternalAuthOptions right;
  right.token_file = token_file;
  v1::TargetInfoResponse target_info;
  const grpc::Status t = TargetInfo(Authenticated(right, target), &target_info);
  EXPECT_TRUE(t.ok()) << t.error_message();
  EXPECT_TRUE(target_info.context_stream_connected());
  EXPECT_EQ(target_info.num_sequences(), 0);
  v1::DrafterInfoResponse drafter_info;
  const grpc::Status d =
      DrafterInfo(Authenticated(right, drafter), &drafter_info);
  EXPECT_TRUE(d.ok()) << d.error_message();
  EXPECT_EQ(drafter_info.context_streams(), 1);
  // Health needs no token (Kubernetes probes carry none).
  EXPECT_EQ(Health(Plaintext(target)), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(Plaintext(drafter)), HealthCheckResponse::SERVING);
}

TEST(InternalAuthTest, MutualTlsClusterServesAndRefusesClientsWithoutACert) {
  const std::string dir = testing::MakeTempDir();
  const std::string certs = dir + "/certs", other = dir + "/other-ca";
  ASSERT_TRUE(MakeCerts(certs));
  ASSERT_TRUE(MakeCerts(other));
  ServiceCluster::Options options;
  options.target_flags = TlsFlags(certs, "stack");
  options.target_flags.push_back("--health_port=0");
  options.drafter_flags = TlsFlags(certs, "stack");
  options.drafter_flags.push_back("--health_port=0");
  // As in Kubernetes: the stacks' certificate is checked for its Service
  // name, whatever address is dialled.
  options.router_flags = TlsFlags(certs, "router");
  options.router_flags.push_back("--tls_server_name=dedit-stack");
  ServiceCluster cluster(options);
  const absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  ExpectSpeculativeGreedyOutput(cluster);

  const int target = cluster.target()->grpc_port();
  const int drafter = cluster.drafter()->grpc_port();
  // A client with the router's certificate gets answers.
  InternalAuthOptions router;
  router.tls_cert = certs + "/router.crt";
  router.tls_key = certs + "/router.key";
  router.tls_ca = certs + "/ca.crt";
  const grpc::Status ok = TargetInfo(Authenticated(router, target));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_TRUE(DrafterInfo(Authenticated(router, drafter)).ok());
  // Refused at the handshake: plaintext, TLS without a client certificate,
  // a certificate from another CA.
  for (int port : {target, drafter}) {
    EXPECT_EQ(TargetInfo(Plaintext(port)).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    grpc::SslCredentialsOptions no_cert;
    std::ifstream ca(certs + "/ca.crt");
    no_cert.pem_root_certs.assign(std::istreambuf_iterator<char>(ca),
                                  std::istreambuf_iterator<char>());
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("dedit-stack");
    const grpc::Status refused = TargetInfo(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::SslCredentials(no_cert), args));
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE)
        << refused.error_message();
    grpc::SslCredentialsOptions stranger = no_cert;
    std::ifstream key(other + "/router.key"), crt(other + "/router.crt");
    stranger.pem_private_key.assign(std::istreambuf_iterator<char>(key),
                                    std::istreambuf_iterator<char>());
    stranger.pem_cert_chain.assign(std::istreambuf_iterator<char>(crt),
                                   std::istreambuf_iterator<char>());
    EXPECT_EQ(TargetInfo(grpc::CreateCustomChannel(
                             absl::StrCat("127.0.0.1:", port),
                             grpc::SslCredentials(stranger), args))
                  .error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  // The server is checked too: a name its certificate lacks fails.
  InternalAuthOptions misnamed = router;
  misnamed.tls_server_name = "dedit-router";
  EXPECT_EQ(TargetInfo(Authenticated(misnamed, target)).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Probes: the plaintext health port answers without a certificate and
  // serves nothing else.
  ASSERT_GT(cluster.target()->health_port(), 0);
  ASSERT_GT(cluster.drafter()->health_port(), 0);
  EXPECT_EQ(Health(Plaintext(cluster.target()->health_port())),
            HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(Plaintext(cluster.drafter()->health_port())),
            HealthCheckResponse::SERVING);
  EXPECT_EQ(TargetInfo(Plaintext(cluster.target()->health_port())).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// A binary given bad auth files exits at start-up, naming the flag.
TEST(InternalAuthTest, BadFlagsStopTheBinariesWithTheFlagNamed) {
  const std::string dir = testing::MakeTempDir();
  ASSERT_TRUE(MakeCerts(dir + "/certs"));
  struct Case {
    const char* binary;
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {DEDIT_DRAFTER_BINARY,
       {"--drafter_dir=/nonexistent", "--target_dir=/nonexistent",
        "--tls_cert=" + dir + "/certs/stack.crt"},
       "--tls_key is missing"},
      {DEDIT_TARGET_BINARY,
       {"--target_dir=/nonexistent",
        "--internal_token_file=" + WriteFile(dir + "/short", "abc\n")},
       "at least 16"},
      {DEDIT_ROUTER_BINARY,
       {"--internal_token_file=" + dir + "/missing"},
       "--internal_token_file"},
      {DEDIT_TARGET_BINARY,
       {"--target_dir=/nonexistent", "--tls_cert=" + dir + "/certs/stack.crt",
        "--tls_key=" + dir + "/certs/router.key",
        "--tls_ca=" + dir + "/certs/ca.crt"},
       "is not the key of the certificate"},
      {DEDIT_DRAFTER_BINARY,
       {"--drafter_dir=/nonexistent", "--target_dir=/nonexistent",
        "--health_port=70000"},
       "--health_port"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.push_back("--port=0");
    args.push_back("--metrics_port=0");
    auto process = ServiceProcess::Start(c.binary, args, dir, "bad", 20000);
    ASSERT_FALSE(process.ok()) << c.binary << " started with bad flags";
    EXPECT_THAT(std::string(process.status().message()), HasSubstr(c.message))
        << c.binary;
  }
}

}  // namespace
}  // namespace dedit
