// common/serving/internal_auth.h in one process: the checks on the token and
// PEM files (each bad input names its flag), the constant-time comparison, and
// a real gRPC server with the token processor or mTLS against clients with
// and without credentials. Certificates come from
// scripts/make_internal_certs.sh, run into a temp dir (openssl).
#include "common/serving/internal_auth.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/serving/server_bootstrap.h"
#include "dedit/v1/services.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace dedit {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

class InfoService final : public v1::Target::CallbackService {
 public:
  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const v1::TargetInfoRequest*,
                                 v1::TargetInfoResponse* response) override {
    response->set_model_name("info");
    // The token is consumed by the processor: the service never sees it.
    if (context->client_metadata().count("authorization") > 0) {
      response->set_model_name("saw the token");
    }
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class InternalAuthTest : public ::testing::Test {
 protected:
  InternalAuthTest() {
    std::string dir =
        absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                     "/dedit_internal_auth_test.XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) std::abort();
    dir_ = dir;
  }
  ~InternalAuthTest() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  // scripts/make_internal_certs.sh into dir_/name.
  std::string Certs(const std::string& name) {
    const std::string out = dir_ + "/" + name;
    const std::string command =
        absl::StrCat("bash ", DEDIT_SOURCE_DIR,
                     "/scripts/make_internal_certs.sh ", out, " >/dev/null");
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
    return out;
  }
  static InternalAuthOptions Tls(const std::string& certs,
                                 const std::string& who) {
    InternalAuthOptions o;
    o.tls_cert = certs + "/" + who + ".crt";
    o.tls_key = certs + "/" + who + ".key";
    o.tls_ca = certs + "/ca.crt";
    return o;
  }
  static InternalAuth Loaded(const InternalAuthOptions& o) {
    absl::StatusOr<InternalAuth> auth = InternalAuth::Load(o);
    EXPECT_TRUE(auth.ok()) << auth.status();
    return auth.value_or(InternalAuth());
  }
  // Starts InfoService with `auth`'s server credentials on 127.0.0.1.
  void Serve(const InternalAuth& auth) {
    absl::StatusOr<StartedServer> server = StartGrpcServer(
        "127.0.0.1:0", {&service_}, 0, auth.ServerCredentials());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    server_.server->GetHealthCheckService()->SetServingStatus("", true);
  }
  std::string address() const {
    return absl::StrCat("127.0.0.1:", server_.port);
  }
  static grpc::Status Info(const std::shared_ptr<grpc::Channel>& channel,
                           std::string* model = nullptr) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::TargetInfoResponse response;
    const grpc::Status s =
        v1::Target::NewStub(channel)->Info(&c, {}, &response);
    if (model != nullptr) *model = response.model_name();
    return s;
  }
  static HealthCheckResponse::ServingStatus Health(
      const std::shared_ptr<grpc::Channel>& channel) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    HealthCheckResponse response;
    const grpc::Status s = grpc::health::v1::Health::NewStub(channel)->Check(
        &c, HealthCheckRequest(), &response);
    return s.ok() ? response.status() : HealthCheckResponse::UNKNOWN;
  }
  std::shared_ptr<grpc::Channel> Plaintext() const {
    return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }

  std::string dir_;
  InfoService service_;
  StartedServer server_;
};

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("Bearer abc", "Bearer abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abd", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer ab", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abcd", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), "a"));
}

TEST_F(InternalAuthTest, NoFlagsMeansPlaintext) {
  InternalAuth none = Loaded(InternalAuthOptions());
  EXPECT_FALSE(none.token());
  EXPECT_FALSE(none.tls());
  EXPECT_EQ(none.Describe(), "plaintext, no authentication");
  Serve(none);
  EXPECT_TRUE(Info(Plaintext()).ok());
}

TEST_F(InternalAuthTest, BadTokenFilesNameTheFlag) {
  InternalAuthOptions o;
  o.token_file = dir_ + "/missing";
  absl::Status s = InternalAuth::Load(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("--internal_token_file"));
  EXPECT_THAT(s.message(), HasSubstr(o.token_file));

  o.token_file = Write("short", "0123456789\n");
  s = InternalAuth::Load(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("at least 16"));

  o.token_file = Write("spaces", "0123456789 abcdef0123\n");
  s = InternalAuth::Load(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("printable ASCII"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("0123456789")));

  o.token_file = dir_;  // a directory
  EXPECT_EQ(InternalAuth::Load(o).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Surrounding whitespace (an editor's newline) is not part of it.
  o.token_file = Write("token", absl::StrCat("  ", kToken, "\r\n"));
  InternalAuth auth = Loaded(o);
  EXPECT_TRUE(auth.token());
  EXPECT_EQ(auth.Describe(), "token, loopback only");
}

TEST_F(InternalAuthTest, BadTlsFilesNameTheFlag) {
  const std::string certs = Certs("certs"), other = Certs("other");
  InternalAuthOptions o = Tls(certs, "stack");
  o.tls_key.clear();
  absl::Status s = InternalAuth::Load(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--tls_key is missing"));

  o = Tls(certs, "stack");
  o.tls_key = certs + "/router.key";
  s = InternalAuth::Load(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is not the key of the certificate"));

  o = Tls(certs, "stack");
  o.tls_ca = other + "/ca.crt";
  s = InternalAuth::Load(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not verify against --tls_ca"));

  o = Tls(certs, "stack");
  o.tls_cert = Write("garbage.crt", "not a certificate\n");
  s = InternalAuth::Load(o).status();
  EXPECT_THAT(s.message(), HasSubstr("--tls_cert"));
  EXPECT_THAT(s.message(), HasSubstr("holds no PEM certificate"));

  o = Tls(certs, "stack");
  o.tls_key = Write("garbage.key", "-----BEGIN PRIVATE KEY-----\nxx\n");
  s = InternalAuth::Load(o).status();
  EXPECT_THAT(s.message(), HasSubstr("--tls_key"));

  o = Tls(certs, "stack");
  o.tls_ca = dir_ + "/none.crt";
  s = InternalAuth::Load(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("--tls_ca"));

  InternalAuthOptions name_only;
  name_only.tls_server_name = "dedit-stack";
  EXPECT_THAT(InternalAuth::Load(name_only).status().message(),
              HasSubstr("--tls_server_name needs"));
}

TEST_F(InternalAuthTest, TokenServerRefusesCallsWithoutTheTokenButNotHealth) {
  InternalAuthOptions o;
  o.token_file = Write("token", kToken);
  InternalAuth auth = Loaded(o);
  Serve(auth);
  const grpc::Status none = Info(Plaintext());
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("--internal_token_file"));
  EXPECT_EQ(Health(Plaintext()), HealthCheckResponse::SERVING);

  std::string model;
  const grpc::Status with =
      Info(auth.Channel(address(), InternalChannelArguments()), &model);
  EXPECT_TRUE(with.ok()) << with.error_message();
  EXPECT_EQ(model, "info");  // the token was removed from the metadata

  InternalAuthOptions wrong;
  wrong.token_file = Write("wrong", "0123456789abcdef0123456789abcdeF");
  EXPECT_EQ(Info(Loaded(wrong).Channel(address(), InternalChannelArguments()))
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Only the exact token: not a prefix, not without "Bearer ".
  for (const std::string& value :
       {absl::StrCat("Bearer ", std::string(kToken).substr(0, 31)),
        std::string(kToken), absl::StrCat("Bearer ", kToken, "x")}) {
    grpc::ClientContext c;
    c.AddMetadata("authorization", value);
    v1::TargetInfoResponse response;
    EXPECT_EQ(
        v1::Target::NewStub(Plaintext())->Info(&c, {}, &response).error_code(),
        grpc::StatusCode::UNAUTHENTICATED)
        << value;
  }
}

TEST_F(InternalAuthTest, MutualTlsNeedsACertificateFromTheCa) {
  const std::string certs = Certs("certs"), other = Certs("other");
  InternalAuth server = Loaded(Tls(certs, "stack"));
  EXPECT_EQ(server.Describe(), "mTLS");
  Serve(server);
  // The router's certificate; the server's name checked for "localhost"'s
  // 127.0.0.1 (an IP SAN) or an override (the Service name).
  EXPECT_TRUE(Info(Loaded(Tls(certs, "router"))
                       .Channel(address(), InternalChannelArguments()))
                  .ok());
  InternalAuthOptions named = Tls(certs, "router");
  named.tls_server_name = "dedit-stack";
  EXPECT_TRUE(
      Info(Loaded(named).Channel(address(), InternalChannelArguments())).ok());
  named.tls_server_name = "elsewhere";
  EXPECT_EQ(Info(Loaded(named).Channel(address(), InternalChannelArguments()))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // No certificate (health included: the handshake comes first), another
  // CA's certificate, plaintext: refused.
  grpc::SslCredentialsOptions no_cert;
  std::ifstream ca(certs + "/ca.crt");
  no_cert.pem_root_certs.assign(std::istreambuf_iterator<char>(ca),
                                std::istreambuf_iterator<char>());
  auto anonymous =
      grpc::CreateChannel(address(), grpc::SslCredentials(no_cert));
  EXPECT_EQ(Info(anonymous).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Health(anonymous), HealthCheckResponse::UNKNOWN);
  InternalAuthOptions stranger = Tls(other, "router");
  stranger.tls_ca = certs + "/ca.crt";
  // Its own CA does not sign it: Load refuses; the channel is made by hand.
  EXPECT_FALSE(InternalAuth::Load(stranger).ok());
  grpc::SslCredentialsOptions foreign = no_cert;
  std::ifstream key(other + "/router.key"), crt(other + "/router.crt");
  foreign.pem_private_key.assign(std::istreambuf_iterator<char>(key),
                                 std::istreambuf_iterator<char>());
  foreign.pem_cert_chain.assign(std::istreambuf_iterator<char>(crt),
                                std::istreambuf_iterator<char>());
  EXPECT_EQ(Info(grpc::CreateChannel(address(), grpc::SslCredentials(foreign)))
                .error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Info(Plaintext()).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(InternalAuthTest, MutualTlsAndTokenNeedBoth) {
  const std::string certs = Certs("certs");
  InternalAuthOptions o = Tls(certs, "stack");
  o.token_file = Write("token", kToken);
  InternalAuth server = Loaded(o);
  EXPECT_EQ(server.Describe(), "mTLS + token");
  Serve(server);
  InternalAuthOptions client = Tls(certs, "router");
  EXPECT_EQ(Info(Loaded(client).Channel(address(), InternalChannelArguments()))
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  client.token_file = o.token_file;
  EXPECT_TRUE(
      Info(Loaded(client).Channel(address(), InternalChannelArguments())).ok());
}

// A token file rewritten in place (a Secret rotation): the next calls of
// a client send the new token, the server takes it, and the old one still
// works during the grace period; a token file that turns bad keeps the
// last good token. No restart, no new channel.
TEST_F(InternalAuthTest, TokenFilesRotateWithoutARestart) {
  InternalAuthOptions o;
  o.token_file = Write("token", kToken);
  InternalAuth server = Loaded(o);
  Serve(server);
  InternalAuthOptions client_options;
  client_options.token_file = Write("client-token", kToken);
  auto client =
      Loaded(client_options).Channel(address(), InternalChannelArguments());
  ASSERT_TRUE(Info(client).ok());
  const std::string rotated = "fedcba9876543210fedcba9876543210";
  // Rotated everywhere; both re-read at most a second later.
  std::filesystem::rename(Write("token.new", rotated), o.token_file);
  std::filesystem::rename(Write("client-token.new", rotated),
                          client_options.token_file);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(Info(client).ok());
  auto with_token = [&](const std::string& token) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    c.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::TargetInfoResponse response;
    return v1::Target::NewStub(Plaintext())->Info(&c, {}, &response);
  };
  EXPECT_TRUE(with_token(rotated).ok());
  EXPECT_TRUE(with_token(kToken).ok()) << "the previous token, in its grace";
  EXPECT_EQ(with_token("0123456789abcdef0123456789abcdeF").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A bad rewrite (too short) is refused: the rotated token stays.
  std::filesystem::rename(Write("token.bad", "short"), o.token_file);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_TRUE(Info(client).ok());
  EXPECT_EQ(with_token("short").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

// Certificates and CA replaced on disk at both ends (a new CA): new
// connections use the new set after the refresh, with no restart; a
// client still holding only the old CA's certificate is refused.
TEST_F(InternalAuthTest, CertificatesRotateWithoutARestart) {
  const std::string live = dir_ + "/live";
  std::filesystem::create_directories(live);
  auto install = [&](const std::string& certs) {
    for (const char* f :
         {"ca.crt", "stack.crt", "stack.key", "router.crt", "router.key"}) {
      std::filesystem::copy_file(
          certs + "/" + f, live + "/" + f + ".tmp",
          std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(live + "/" + f + ".tmp", live + "/" + f);
    }
  };
  const std::string first = Certs("first"), second = Certs("second");
  install(first);
  InternalAuthOptions server_options = Tls(live, "stack");
  server_options.tls_refresh_s = 1;
  Serve(Loaded(server_options));
  InternalAuthOptions client_options = Tls(live, "router");
  client_options.tls_refresh_s = 1;
  InternalAuth client = Loaded(client_options);
  EXPECT_TRUE(Info(client.Channel(address(), InternalChannelArguments())).ok());
  install(second);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  // A new channel (a new handshake) from the same InternalAuth: the
  // rotated certificate and CA on both ends.
  const grpc::Status rotated =
      Info(client.Channel(address(), InternalChannelArguments()));
  EXPECT_TRUE(rotated.ok()) << rotated.error_message();
  // The old set alone no longer gets in.
  InternalAuthOptions old_client = Tls(first, "router");
  EXPECT_EQ(
      Info(Loaded(old_client).Channel(address(), InternalChannelArguments()))
          .error_code(),
      grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace dedit
