#include "router/stack_discovery.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dedit {
namespace {

bool LooksLikeAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  return colon != absl::string_view::npos && colon > 0 &&
         absl::SimpleAtoi(address.substr(colon + 1), &port) && port > 0 &&
         port < 65536;
}

}  // namespace

absl::StatusOr<std::vector<StackAddress>> ParseStacksFile(
    absl::string_view text, int max_stacks) {
  std::vector<StackAddress> stacks;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() < 2 || fields.size() > 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stacks file line ", line_number,
          ": expected `name target_host:port [drafter_host:port]`"));
    }
    if (max_stacks > 0 && static_cast<int>(stacks.size()) == max_stacks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stacks file line ", line_number, ": more than ", max_stacks,
          " stacks (--max_stacks); the whole list is refused"));
    }
    StackAddress a;
    a.name = std::string(fields[0]);
    a.target_address = std::string(fields[1]);
    if (fields.size() == 3) a.drafter_address = std::string(fields[2]);
    if (!LooksLikeAddress(a.target_address) ||
        (!a.drafter_address.empty() && !LooksLikeAddress(a.drafter_address))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stacks file line ", line_number, ": an address is not host:port"));
    }
    for (const StackAddress& b : stacks) {
      if (b.name == a.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("stacks file line ", line_number, ": stack name '",
                         a.name, "' repeats"));
      }
    }
    stacks.push_back(std::move(a));
  }
  return stacks;
}

absl::StatusOr<StacksDnsName> ParseStacksDnsName(absl::string_view spec) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  StacksDnsName name;
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() ||
      !absl::SimpleAtoi(parts[1], &name.target_port) || name.target_port <= 0 ||
      name.target_port > 65535 ||
      (parts.size() == 3 &&
       (!absl::SimpleAtoi(parts[2], &name.drafter_port) ||
        name.drafter_port <= 0 || name.drafter_port > 65535))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stacks_dns must be host:target_port[:drafter_port], got '", spec,
        "'"));
  }
  name.host = std::string(parts[0]);
  return name;
}

absl::StatusOr<std::vector<StackAddress>> ResolveStacks(
    const StacksDnsName& name) {
  std::vector<std::string> ips;
  for (int family : {AF_INET, AF_INET6}) {
    addrinfo hints{};
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* result = nullptr;
    const int rc = getaddrinfo(name.host.c_str(), nullptr, &hints, &result);
    if (rc == EAI_NONAME || rc == EAI_NODATA || rc == EAI_ADDRFAMILY) continue;
    if (rc != 0) {
      return absl::UnavailableError(
          absl::StrCat("resolving ", name.host, ": ", gai_strerror(rc)));
    }
    for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr =
          family == AF_INET
              ? static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr)
              : static_cast<const void*>(
                    &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr);
      if (inet_ntop(family, addr, text, sizeof(text)) == nullptr) continue;
      std::string ip =
          family == AF_INET ? std::string(text) : absl::StrCat("[", text, "]");
      if (std::find(ips.begin(), ips.end(), ip) == ips.end()) {
        ips.push_back(std::move(ip));
      }
    }
    freeaddrinfo(result);
    if (!ips.empty()) break;  // IPv4 when there is any
  }
  if (ips.empty()) {
    return absl::NotFoundError(absl::StrCat(name.host, " has no address"));
  }
  std::sort(ips.begin(), ips.end());
  std::vector<StackAddress> stacks;
  for (const std::string& ip : ips) {
    StackAddress a;
    a.name = ip;
    a.target_address = absl::StrCat(ip, ":", name.target_port);
    if (name.drafter_port > 0) {
      a.drafter_address = absl::StrCat(ip, ":", name.drafter_port);
    }
    stacks.push_back(std::move(a));
  }
  return stacks;
}

StackDiscovery::StackDiscovery(Source source, int64_t refresh_ms,
                               OnChange on_change)
    : source_(std::move(source)),
      refresh_ms_(refresh_ms),
      on_change_(std::move(on_change)) {}

StackDiscovery::~StackDiscovery() { Stop(); }

absl::Status StackDiscovery::Validate(const Source& source) {
  if (source.stacks_file.empty() == source.stacks_dns.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --stacks_file and --stacks_dns");
  }
  if (!source.stacks_dns.empty()) {
    return ParseStacksDnsName(source.stacks_dns).status();
  }
  return absl::OkStatus();
}

void StackDiscovery::Start() {
  Poll();
  thread_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             absl::Milliseconds(refresh_ms_));
        if (stopping_) return;
      }
      Poll();
    }
  });
}

void StackDiscovery::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::vector<StackAddress>> StackDiscovery::Read() {
  if (!source_.stacks_dns.empty()) {
    absl::StatusOr<StacksDnsName> name = ParseStacksDnsName(source_.stacks_dns);
    if (!name.ok()) return name.status();
    absl::StatusOr<std::vector<StackAddress>> stacks = ResolveStacks(*name);
    // No address: no ready stack pod. Anything else may be transient.
    if (absl::IsNotFound(stacks.status())) return std::vector<StackAddress>();
    if (stacks.ok() && source_.max_stacks > 0 &&
        static_cast<int>(stacks->size()) > source_.max_stacks) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_.stacks_dns, " resolves to ", stacks->size(),
          " addresses, more than --max_stacks ", source_.max_stacks));
    }
    return stacks;
  }
  // Refused unread when it is over the limit, and refused when it grew
  // past it while being read (at most one buffer more is read).
  const int64_t limit = source_.max_file_bytes;
  auto too_large = [&](int64_t bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_.stacks_file, " is over --max_stacks_file_bytes ",
                     limit, " (", bytes, " bytes)"));
  };
  struct stat st {};
  if (stat(source_.stacks_file.c_str(), &st) == 0 && st.st_size > limit) {
    return too_large(st.st_size);
  }
  std::ifstream in(source_.stacks_file, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", source_.stacks_file));
  }
  std::string text;
  char buffer[1 << 16];
  while (in && static_cast<int64_t>(text.size()) <= limit) {
    in.read(buffer, sizeof(buffer));
    text.append(buffer, static_cast<size_t>(in.gcount()));
  }
  if (static_cast<int64_t>(text.size()) > limit) return too_large(text.size());
  return ParseStacksFile(text, source_.max_stacks);
}

void StackDiscovery::Poll() {
  if (!source_.stacks_file.empty()) {
    struct stat st {};
    if (stat(source_.stacks_file.c_str(), &st) == 0 && have_list_ &&
        st.st_mtim.tv_sec == file_mtime_.tv_sec &&
        st.st_mtim.tv_nsec == file_mtime_.tv_nsec && st.st_size == file_size_) {
      return;  // unchanged
    }
    file_mtime_ = st.st_mtim;
    file_size_ = st.st_size;
  }
  absl::StatusOr<std::vector<StackAddress>> stacks = Read();
  if (!stacks.ok()) {
    const std::string error(stacks.status().ToString());
    if (error != last_error_) {
      std::fprintf(stderr,
                   "dedit-router: stack discovery: %s (keeping %zu "
                   "stacks)\n",
                   error.c_str(), current_.size());
      last_error_ = error;
    }
    // Re-read the file next time even if it does not change again.
    file_size_ = -1;
    return;
  }
  last_error_.clear();
  if (have_list_ && *stacks == current_) return;
  have_list_ = true;
  current_ = std::move(*stacks);
  on_change_(current_);
}

}  // namespace dedit
