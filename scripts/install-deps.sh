#!/usr/bin/env bash
# Installs everything dedit needs to build, test and run on Debian 12.
# Idempotent: packages already present are not reinstalled, and apt is only
# consulted when something is missing. Must run as root (or with sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  # clang 14 is the compiler (thread-safety analysis); its sanitizer runtimes
  # (ASan/UBSan parser tests); clang-format and universal-ctags for the
  # style tests (format, function size); ccache.
  clang-14 libclang-rt-14-dev clang-format-14 universal-ctags ccache
  # libtorch (CPU) and a fast BLAS: without OpenBLAS, Debian's libtorch falls
  # back to the reference BLAS and runs far slower.
  libtorch-dev libopenblas0-pthread libopenblas-pthread-dev
  # OpenSSL: internal mTLS (common/serving/internal_auth.cc checks the PEM files),
  # and the openssl tool that makes the certificates
  # (scripts/make_internal_certs.sh, also run by the tests)
  libssl-dev openssl
  # gRPC / protobuf / abseil / Prometheus client
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  # HTTP server of every binary's /metrics (common/serving/metrics_endpoint.cc)
  # and the HTTP client of the gateway's end-to-end tests
  libcpp-httplib-dev
  # Boost.Beast + Boost.Asio (header-only): the OpenAI-compatible front's
  # HTTP server (gateway/http_server.h)
  libboost-dev
  libabsl-dev prometheus-cpp-dev
  # tests and benchmarks; valgrind checks the PCRE2 path (fuzz.regex_valgrind),
  # which ASan cannot see into
  libgtest-dev libgmock-dev googletest libbenchmark-dev valgrind
  # JSON, regex, Unicode (tokenizer)
  nlohmann-json3-dev libpcre2-dev libicu-dev
  # Python side: reference models, gRPC client test
  python3 python3-torch python3-numpy python3-grpcio python3-grpc-tools
  # Deployment tests: render/validate deploy/k8s and deploy/prometheus
  python3-yaml
  # The DEdit plots next to docs/RESULTS.md (scripts/plot_dedit.py)
  python3-matplotlib
  # Training corpus for the bundled model (scripts/train_tiny.sh)
  libpython3.11-stdlib python3.11-doc
  # Prometheus server + promtool (deployment tests)
  prometheus
  # A real terminal for the dedit-cli chat test (tests/services/sessions_test.cc)
  tmux
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js + npm run the tokenizer oracle. Machines that already have a Node
# from another source (nodesource) conflict with Debian's nodejs package, so
# only ask apt for it when the commands are absent.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Make sure the pthread OpenBLAS is the selected libblas/liblapack provider.
if command -v update-alternatives >/dev/null; then
  for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
    target=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas-pthread | head -1 || true)
    [ -n "$target" ] && $SUDO update-alternatives --set "$alt" "$target" >/dev/null || true
  done
fi
echo "install-deps: done"
