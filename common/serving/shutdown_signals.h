// SIGTERM/SIGINT for graceful shutdown, and the exit that follows a drain.
//
// Only one thread may take the shutdown signals (ServeUntilSignal's), so
// main() blocks them before any thread exists; threads inherit the mask.
//
//   int main(int argc, char** argv) {
//     dedit::BlockShutdownSignals();      // first, before any thread starts
//     ... flags → options ...
//     dedit::ExitAfterServing("dedit-target", dedit::RunTargetServer(options));
//   }
#ifndef DEDIT_SERVING_SHUTDOWN_SIGNALS_H_
#define DEDIT_SERVING_SHUTDOWN_SIGNALS_H_

#include "absl/status/status.h"

namespace dedit {

// Blocks SIGTERM and SIGINT in the calling thread and in every thread it
// starts afterwards, so that WaitForShutdownSignal() alone receives them.
void BlockShutdownSignals();

// Waits for SIGTERM or SIGINT; returns the signal number.
// REQUIRES: BlockShutdownSignals() ran before any thread started.
int WaitForShutdownSignal();

// The end of a server's main(); `served` is what its Run*Server returned.
//
// An error (startup failed) is logged as "<binary>: <status>" and the
// process exits 1 the ordinary way. OK means the server has drained and
// the threads it owned are joined: logs "<binary>: drained, exiting",
// flushes stdio and leaves with status 0 without running static
// destructors. Those were seen racing gRPC's own background threads at
// exit (SIGSEGV after a clean drain, under load), which would turn a
// clean SIGTERM into a crash report.
[[noreturn]] void ExitAfterServing(const char* binary,
                                   const absl::Status& served);

}  // namespace dedit

#endif  // DEDIT_SERVING_SHUTDOWN_SIGNALS_H_
