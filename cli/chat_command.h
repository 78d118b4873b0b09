// `dedit-cli chat`: an interactive multi-turn chat over one
// dedit.v1.Generation/Session stream (docs/SERVICES.md "Sessions"). Each
// line read is a user message; the answer streams as it arrives, then one
// line of per-turn statistics (tokens, tokens/s, mean acceptance length,
// prompt tokens and how many of them the session's KV cache already held).
// The router keeps the conversation and the target its KV cache between
// turns, so a turn prefills only its new tokens.
//
//   dedit-cli chat --router 127.0.0.1:50050 --max_tokens 256
//   > Why is the sky blue?
//   ...answer...
//   [turn 1: 41 tokens, 120.3 tokens/s, mean acceptance length 3.10,
//    prompt 18 tokens (0 cached), finish stop]
//
// `/quit` or end of input closes the session.
#ifndef DEDIT_CLI_CHAT_COMMAND_H_
#define DEDIT_CLI_CHAT_COMMAND_H_

#include <istream>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "cli/generate_command.h"

namespace dedit {

struct ChatCommandOptions {
  // router, model, max_tokens (per turn), sampling, window, passes,
  // no_speculation, method, stop, ignore_eos, enable_thinking; prompt and
  // chat are not used. timeout_s bounds the whole session.
  GenerateCommandOptions generate;
  std::string system;  // a system message before the first turn
  std::string prompt_marker = "> ";
};

// Reads user lines from `in` until `/quit` or end of input; answers and
// the "> " prompt go to `out`, the statistics lines to `stats_out`.
absl::Status RunChat(const ChatCommandOptions& options, std::istream& in,
                     std::ostream& out, std::ostream& stats_out);

}  // namespace dedit

#endif  // DEDIT_CLI_CHAT_COMMAND_H_
