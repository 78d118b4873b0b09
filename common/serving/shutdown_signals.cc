#include "common/serving/shutdown_signals.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>

namespace dedit {
namespace {

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSignals();
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

void ExitAfterServing(const char* binary, const absl::Status& served) {
  if (!served.ok()) {
    std::fprintf(stderr, "%s: %s\n", binary, served.ToString().c_str());
    std::exit(1);
  }
  std::fprintf(stderr, "%s: drained, exiting\n", binary);
  std::fflush(nullptr);
  std::_Exit(0);
}

}  // namespace dedit
