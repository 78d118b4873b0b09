#include "common/serving/internal_auth.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/status.h"

namespace dedit {
namespace {

constexpr uint64_t kMaxPemBytes = 1 << 20;
constexpr uint64_t kMaxTokenFileBytes = 4096;
constexpr char kHealthPathPrefix[] = "/grpc.health.v1.Health/";

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct StoreFree {
  void operator()(X509_STORE* s) const { X509_STORE_free(s); }
};
struct StoreCtxFree {
  void operator()(X509_STORE_CTX* c) const { X509_STORE_CTX_free(c); }
};
struct StackFree {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

std::unique_ptr<BIO, BioFree> MemoryBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in a PEM text, in order.
std::vector<X509Ptr> ReadCertificates(const std::string& pem) {
  std::vector<X509Ptr> certs;
  auto bio = MemoryBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(x);
  }
  ERR_clear_error();  // the read that ended the loop
  return certs;
}

absl::StatusOr<std::string> ReadFlagFile(const char* flag,
                                         const std::string& path,
                                         uint64_t max_bytes) {
  absl::StatusOr<std::string> text = ReadFileToString(path, max_bytes);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("--", flag, ": ", text.status().message()));
  }
  return text;
}

// Checks the PEM files: a certificate, its key, a CA that signs it.
absl::Status CheckTlsFiles(const InternalAuthOptions& o,
                           const std::string& cert_pem,
                           const std::string& key_pem,
                           const std::string& ca_pem) {
  std::vector<X509Ptr> chain = ReadCertificates(cert_pem);
  if (chain.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert ", o.tls_cert, " holds no PEM certificate"));
  }
  auto key_bio = MemoryBio(key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key ", o.tls_key,
        " holds no PEM private key (an unencrypted key is needed)"));
  }
  if (X509_check_private_key(chain[0].get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key ", o.tls_key,
        " is not the key of the certificate in --tls_cert ", o.tls_cert));
  }
  std::vector<X509Ptr> cas = ReadCertificates(ca_pem);
  if (cas.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_ca ", o.tls_ca, " holds no PEM certificate"));
  }
  std::unique_ptr<X509_STORE, StoreFree> store(X509_STORE_new());
  for (const X509Ptr& ca : cas) X509_STORE_add_cert(store.get(), ca.get());
  std::unique_ptr<STACK_OF(X509), StackFree> intermediates(sk_X509_new_null());
  for (size_t i = 1; i < chain.size(); ++i) {
    X509_up_ref(chain[i].get());
    sk_X509_push(intermediates.get(), chain[i].get());
  }
  std::unique_ptr<X509_STORE_CTX, StoreCtxFree> ctx(X509_STORE_CTX_new());
  if (ctx == nullptr ||
      X509_STORE_CTX_init(ctx.get(), store.get(), chain[0].get(),
                          intermediates.get()) != 1) {
    ERR_clear_error();
    return absl::InternalError("cannot check --tls_cert: OpenSSL failed");
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert ", o.tls_cert, " does not verify against --tls_ca ",
        o.tls_ca, ": ", X509_verify_cert_error_string(err)));
  }
  return absl::OkStatus();
}

// Refuses every call without "authorization: Bearer <token>", except the
// standard health service's (Kubernetes probes). The token is removed from
// the metadata the service sees.
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::string token)
      : expected_(absl::StrCat("Bearer ", token)) {}

  // A comparison: cheap enough for gRPC's own thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*,
                       OutputMetadata* consumed, OutputMetadata*) override {
    const auto path = metadata.find(":path");
    if (path != metadata.end() &&
        absl::StartsWith(
            absl::string_view(path->second.data(), path->second.size()),
            kHealthPathPrefix)) {
      return grpc::Status::OK;
    }
    const auto [begin, end] = metadata.equal_range(kInternalTokenMetadataKey);
    for (auto it = begin; it != end; ++it) {
      const absl::string_view value(it->second.data(), it->second.size());
      if (ConstantTimeEquals(value, expected_)) {
        consumed->emplace(kInternalTokenMetadataKey, std::string(value));
        return grpc::Status::OK;
      }
    }
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        "internal call without the right token (see --internal_token_file)");
  }

 private:
  const std::string expected_;
};

// Adds "authorization: Bearer <token>" to every call of a channel.
class TokenCallCredentials final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenCallCredentials(std::string token)
      : value_(absl::StrCat("Bearer ", token)) {}

  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "dedit-internal-token"; }

  grpc::Status GetMetadata(
      grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
      std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace(kInternalTokenMetadataKey, value_);
    return grpc::Status::OK;
  }

 private:
  const std::string value_;
};

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `b` is compared, whatever `a` holds.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

absl::StatusOr<InternalAuth> InternalAuth::Load(
    const InternalAuthOptions& options) {
  InternalAuth auth;
  if (!options.token_file.empty()) {
    ASSIGN_OR_RETURN(std::string text,
                     ReadFlagFile("internal_token_file", options.token_file,
                                  kMaxTokenFileBytes));
    const absl::string_view token = absl::StripAsciiWhitespace(text);
    if (token.size() < kMinInternalTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--internal_token_file ", options.token_file, " holds ", token.size(),
          " bytes of token; at least ", kMinInternalTokenBytes,
          " are needed (e.g. openssl rand -hex 32)"));
    }
    for (const char c : token) {
      if (c < 0x21 || c > 0x7e) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--internal_token_file ", options.token_file,
            ": the token must be printable ASCII without spaces (it travels "
            "as gRPC metadata)"));
      }
    }
    auth.token_ = std::string(token);
  }
  const bool any_tls = !options.tls_cert.empty() || !options.tls_key.empty() ||
                       !options.tls_ca.empty();
  if (any_tls) {
    const std::pair<const char*, const std::string*> files[] = {
        {"tls_cert", &options.tls_cert},
        {"tls_key", &options.tls_key},
        {"tls_ca", &options.tls_ca}};
    for (const auto& [flag, path] : files) {
      if (path->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tls_cert, --tls_key and --tls_ca go together: --",
                         flag, " is missing"));
      }
    }
    ASSIGN_OR_RETURN(auth.cert_pem_,
                     ReadFlagFile("tls_cert", options.tls_cert, kMaxPemBytes));
    ASSIGN_OR_RETURN(auth.key_pem_,
                     ReadFlagFile("tls_key", options.tls_key, kMaxPemBytes));
    ASSIGN_OR_RETURN(auth.ca_pem_,
                     ReadFlagFile("tls_ca", options.tls_ca, kMaxPemBytes));
    RETURN_IF_ERROR(
        CheckTlsFiles(options, auth.cert_pem_, auth.key_pem_, auth.ca_pem_));
  }
  if (!options.tls_server_name.empty()) {
    if (!any_tls) {
      return absl::InvalidArgumentError(
          "--tls_server_name needs --tls_cert, --tls_key and --tls_ca");
    }
    auth.server_name_ = options.tls_server_name;
  }
  return auth;
}

std::string InternalAuth::Describe() const {
  if (tls()) return token() ? "mTLS + token" : "mTLS";
  if (token()) return "token, loopback only";
  return "plaintext, no authentication";
}

std::shared_ptr<grpc::ServerCredentials> InternalAuth::ServerCredentials()
    const {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (tls()) {
    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = ca_pem_;
    ssl.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
    credentials = grpc::SslServerCredentials(ssl);
  } else if (token()) {
    credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
  } else {
    return grpc::InsecureServerCredentials();
  }
  if (token()) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<TokenAuthProcessor>(token_));
  }
  return credentials;
}

std::shared_ptr<grpc::Channel> InternalAuth::Channel(
    const std::string& address, grpc::ChannelArguments args) const {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca_pem_;
    ssl.pem_private_key = key_pem_;
    ssl.pem_cert_chain = cert_pem_;
    credentials = grpc::SslCredentials(ssl);
    if (!server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
  } else if (token()) {
    credentials = grpc::experimental::LocalCredentials(LOCAL_TCP);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  if (token()) {
    // Local credentials rank as GRPC_SECURITY_NONE: the token is allowed
    // on them because they only ever connect to this host.
    credentials = grpc::CompositeChannelCredentials(
        credentials,
        grpc::experimental::MetadataCredentialsFromPlugin(
            std::make_unique<TokenCallCredentials>(token_),
            tls() ? GRPC_PRIVACY_AND_INTEGRITY : GRPC_SECURITY_NONE));
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace dedit
