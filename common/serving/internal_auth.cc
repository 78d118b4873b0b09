#include "common/serving/internal_auth.h"

#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// The token in a token file's text; errors name the flag and the file,
// never the token.
absl::StatusOr<std::string> ParseToken(const std::string& path,
                                       const std::string& text) {
  const absl::string_view token = absl::StripAsciiWhitespace(text);
  if (token.size() < kMinInternalTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--internal_token_file ", path, " holds ", token.size(),
                     " bytes of token; at least ", kMinInternalTokenBytes,
                     " are needed (e.g. openssl rand -hex 32)"));
  }
  for (const char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--internal_token_file ", path,
          ": the token must be printable ASCII without spaces (it travels "
          "as gRPC metadata)"));
    }
  }
  return std::string(token);
}

}  // namespace

// The token file, re-read when it changes (its inode, size or mtime: a
// Kubernetes Secret update swaps a symlink, an edit rewrites the file).
// Checked at most once a second, on the calling thread (a stat; gRPC runs
// the credential hooks on its own threads, and both are non-blocking in
// the sense gRPC means: no wait on the network).
class RotatingToken {
 public:
  RotatingToken(std::string path, std::string token, struct stat st)
      : path_(std::move(path)), current_(std::move(token)), stat_(st) {}

  std::string Current() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    MaybeReload();
    return current_;
  }
  // `bearer` is "Bearer <current>", or "Bearer <previous>" within the
  // grace period after a rotation.
  bool Accepts(absl::string_view bearer) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    MaybeReload();
    if (ConstantTimeEquals(bearer, absl::StrCat("Bearer ", current_))) {
      return true;
    }
    return !previous_.empty() && absl::Now() < previous_until_ &&
           ConstantTimeEquals(bearer, absl::StrCat("Bearer ", previous_));
  }

 private:
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = absl::Now();
    if (now < next_check_) return;
    next_check_ = now + absl::Seconds(1);
    struct stat st {};
    if (stat(path_.c_str(), &st) != 0 ||
        (st.st_ino == stat_.st_ino && st.st_size == stat_.st_size &&
         st.st_mtim.tv_sec == stat_.st_mtim.tv_sec &&
         st.st_mtim.tv_nsec == stat_.st_mtim.tv_nsec)) {
      return;  // unchanged, or gone for now (a Secret swap in progress)
    }
    absl::StatusOr<std::string> text =
        ReadFlagFile("internal_token_file", path_, kMaxTokenFileBytes);
    absl::StatusOr<std::string> token =
        text.ok() ? ParseToken(path_, *text) : text.status();
    if (!token.ok()) {
      // Logged once per change; the last good token stays.
      std::fprintf(stderr, "dedit: keeping the internal token: %s\n",
                   std::string(token.status().message()).c_str());
      stat_ = st;
      return;
    }
    stat_ = st;
    if (*token == current_) return;
    previous_ = std::move(current_);
    previous_until_ = now + absl::Seconds(kPreviousTokenGraceSeconds);
    current_ = std::move(*token);
    std::fprintf(stderr,
                 "dedit: internal token rotated (%s); the previous one is "
                 "accepted for %d s more\n",
                 path_.c_str(), kPreviousTokenGraceSeconds);
  }

  const std::string path_;
  absl::Mutex mu_;
  std::string current_ ABSL_GUARDED_BY(mu_);
  std::string previous_ ABSL_GUARDED_BY(mu_);
  absl::Time previous_until_ ABSL_GUARDED_BY(mu_);
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  struct stat stat_ ABSL_GUARDED_BY(mu_);
};

namespace {

// Refuses every call without "authorization: Bearer <token>", except the
// standard health service's (Kubernetes probes). The token is removed from
// the metadata the service sees.
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::shared_ptr<RotatingToken> token)
      : token_(std::move(token)) {}

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
      if (token_->Accepts(value)) {
        consumed->emplace(kInternalTokenMetadataKey, std::string(value));
        return grpc::Status::OK;
      }
    }
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        "internal call without the right token (see --internal_token_file)");
  }

 private:
  const std::shared_ptr<RotatingToken> token_;
};

// Adds "authorization: Bearer <token>" to every call of a channel.
class TokenCallCredentials final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenCallCredentials(std::shared_ptr<RotatingToken> token)
      : token_(std::move(token)) {}

  bool IsBlocking() const override { return false; }
  const char* GetType() const override { return "dedit-internal-token"; }

  grpc::Status GetMetadata(
      grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
      std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace(kInternalTokenMetadataKey,
                      absl::StrCat("Bearer ", token_->Current()));
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<RotatingToken> token_;
};

// Watches the three PEM files (gRPC re-reads them every refresh_s and
// keeps the last good set when a read fails).
std::shared_ptr<grpc::experimental::CertificateProviderInterface> PemWatcher(
    const std::string& key, const std::string& cert, const std::string& ca,
    int refresh_s) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      key, cert, ca, static_cast<unsigned int>(std::max(refresh_s, 1)));
}

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
    struct stat st {};
    stat(options.token_file.c_str(), &st);
    ASSIGN_OR_RETURN(std::string text,
                     ReadFlagFile("internal_token_file", options.token_file,
                                  kMaxTokenFileBytes));
    ASSIGN_OR_RETURN(std::string token, ParseToken(options.token_file, text));
    auth.token_ = std::make_shared<RotatingToken>(options.token_file,
                                                  std::move(token), st);
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
    ASSIGN_OR_RETURN(std::string cert_pem,
                     ReadFlagFile("tls_cert", options.tls_cert, kMaxPemBytes));
    ASSIGN_OR_RETURN(std::string key_pem,
                     ReadFlagFile("tls_key", options.tls_key, kMaxPemBytes));
    ASSIGN_OR_RETURN(std::string ca_pem,
                     ReadFlagFile("tls_ca", options.tls_ca, kMaxPemBytes));
    RETURN_IF_ERROR(CheckTlsFiles(options, cert_pem, key_pem, ca_pem));
    auth.tls_cert_ = options.tls_cert;
    auth.tls_key_ = options.tls_key;
    auth.tls_ca_ = options.tls_ca;
    auth.tls_refresh_s_ = options.tls_refresh_s;
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
    grpc::experimental::TlsServerCredentialsOptions tls(
        PemWatcher(tls_key_, tls_cert_, tls_ca_, tls_refresh_s_));
    tls.watch_root_certs();
    tls.watch_identity_key_cert_pairs();
    tls.set_cert_request_type(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    credentials = grpc::experimental::TlsServerCredentials(tls);
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
    grpc::experimental::TlsChannelCredentialsOptions tls;
    tls.set_certificate_provider(
        PemWatcher(tls_key_, tls_cert_, tls_ca_, tls_refresh_s_));
    tls.watch_root_certs();
    tls.watch_identity_key_cert_pairs();
    tls.set_verify_server_certs(true);
    credentials = grpc::experimental::TlsCredentials(tls);
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
