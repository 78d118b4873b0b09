// dedit-cli: command-line tools around the dedit libraries.
//
//   dedit-cli tokenize --tokenizer PATH [--decode] [--skip_special_tokens]
//                      [--split_special_tokens]  < in.json > out.json
//   dedit-cli generate --router HOST:PORT --prompt TEXT [--chat] ...
//   dedit-cli chat --router HOST:PORT [--system TEXT] ...
//   dedit-cli <command> --help
//
// Every command's flags are absl flags defined here; the command's entry
// below lists the ones it accepts, ParseCommandFlags (command_flags.h)
// sets them, and Run* fills the Options struct of the command's library
// function (cli/*_command.h). Dashed names (--skip-special-tokens) work
// too. Exit status: 0 success, 1 runtime error (bad input, unreadable
// tokenizer, failed RPC), 2 usage error.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "cli/command_flags.h"
#include "cli/tokenize_command.h"
#ifdef DEDIT_HAVE_ROUTER_CLIENT
#include "cli/chat_command.h"
#include "cli/generate_command.h"
#endif

ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json (HF format, byte-level BPE); required");
ABSL_FLAG(bool, decode, false, "decode id arrays instead of encoding text");
ABSL_FLAG(bool, skip_special_tokens, false,
          "with --decode: drop special tokens from the text");
ABSL_FLAG(bool, split_special_tokens, false,
          "when encoding: treat special-token text as plain text");

#ifdef DEDIT_HAVE_ROUTER_CLIENT
ABSL_FLAG(std::string, router, dedit::GenerateCommandOptions().router,
          "dedit-router address host:port");
ABSL_FLAG(std::string, model, "", "model name (empty: the router's model)");
ABSL_FLAG(std::string, prompt, "", "prompt text");
ABSL_FLAG(std::vector<std::string>, prompt_ids, {},
          "prompt token ids, comma-separated, instead of --prompt");
ABSL_FLAG(bool, chat, false,
          "send --prompt as one user message (Qwen3 chat template)");
ABSL_FLAG(bool, thinking, false, "with --chat: enable thinking");
ABSL_FLAG(int, max_tokens, dedit::GenerateCommandOptions().max_tokens,
          "tokens to generate at most");
ABSL_FLAG(float, temperature, dedit::GenerateCommandOptions().temperature,
          "sampling temperature (0 = greedy)");
ABSL_FLAG(int, top_k, dedit::GenerateCommandOptions().top_k, "top-k (0 = off)");
ABSL_FLAG(float, top_p, dedit::GenerateCommandOptions().top_p,
          "top-p (1 = off)");
ABSL_FLAG(int64_t, seed, dedit::GenerateCommandOptions().seed,
          "sampling seed (< 0 = unseeded)");
ABSL_FLAG(int, window, dedit::GenerateCommandOptions().window,
          "W, the speculation window (0 = the router's default)");
ABSL_FLAG(int, passes, dedit::GenerateCommandOptions().passes,
          "K, drafter passes (0 = the router's default)");
ABSL_FLAG(bool, no_speculation, false, "target-only decoding");
ABSL_FLAG(std::string, method, "",
          "who drafts: model, ngram or hybrid (empty = the router's default)");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings, comma-separated");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past EOS");
ABSL_FLAG(int, timeout_s, dedit::GenerateCommandOptions().timeout_s,
          "deadline of the whole generation, seconds");
ABSL_FLAG(std::string, system, "",
          "chat: a system message before the first turn");
#endif

namespace dedit {
namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const char* argv0, const std::vector<std::string>& args);
};

void PrintUsage(const std::vector<Command>& commands, std::FILE* stream) {
  std::fprintf(stream, "usage: dedit-cli <command> [flags]\n\ncommands:\n");
  for (const Command& c : commands) {
    std::fprintf(stream, "  %-10s %s\n", c.name, c.summary);
  }
  std::fprintf(stream,
               "\nRun 'dedit-cli <command> --help' for the command's flags.\n");
}

int TokenizeMain(const char* argv0, const std::vector<std::string>& args) {
  const CommandFlags command = {
      "dedit-cli tokenize",
      "--tokenizer PATH [--decode] [--skip_special_tokens]\n"
      "                          [--split_special_tokens]\n"
      "                          < in.json > out.json",
      "Reads a JSON array from stdin and writes a JSON array to stdout.\n"
      "  default   [\"text\", ...]      -> [[id, ...], ...]\n"
      "  --decode  [[id, ...], ...]   -> [\"text\", ...]\n",
      {"tokenizer", "decode", "skip_special_tokens", "split_special_tokens"}};
  if (std::optional<int> exit = ParseCommandFlags(command, argv0, args)) {
    return *exit;
  }
  TokenizeCommandOptions options;
  options.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  options.decode = absl::GetFlag(FLAGS_decode);
  options.skip_special_tokens = absl::GetFlag(FLAGS_skip_special_tokens);
  options.split_special_tokens = absl::GetFlag(FLAGS_split_special_tokens);
  if (options.tokenizer_path.empty()) {
    return ReportUsageError(command, "--tokenizer is required");
  }
  return CommandExitStatus(command,
                           RunTokenizeCommand(options, std::cin, std::cout));
}

#ifdef DEDIT_HAVE_ROUTER_CLIENT
// The flags generate and chat share: every GenerateCommandOptions field but
// the prompt's (--prompt, --prompt_ids, --chat).
void ReadRouterCommandFlags(GenerateCommandOptions* o) {
  o->router = absl::GetFlag(FLAGS_router);
  o->model = absl::GetFlag(FLAGS_model);
  o->enable_thinking = absl::GetFlag(FLAGS_thinking);
  o->max_tokens = absl::GetFlag(FLAGS_max_tokens);
  o->temperature = absl::GetFlag(FLAGS_temperature);
  o->top_k = absl::GetFlag(FLAGS_top_k);
  o->top_p = absl::GetFlag(FLAGS_top_p);
  o->seed = absl::GetFlag(FLAGS_seed);
  o->window = absl::GetFlag(FLAGS_window);
  o->passes = absl::GetFlag(FLAGS_passes);
  o->no_speculation = absl::GetFlag(FLAGS_no_speculation);
  o->method = absl::GetFlag(FLAGS_method);
  o->stop = absl::GetFlag(FLAGS_stop);
  o->ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  o->timeout_s = absl::GetFlag(FLAGS_timeout_s);
}

int GenerateMain(const char* argv0, const std::vector<std::string>& args) {
  const CommandFlags command = {
      "dedit-cli generate",
      "--router HOST:PORT (--prompt TEXT | --prompt_ids 1,2,3)\n"
      "                          [--chat] [--max_tokens N] [--window W]\n"
      "                          [--passes K] [--method model|ngram|hybrid]\n"
      "                          [--no_speculation] ...",
      "Streams a generation from dedit-router: the text to stdout as it\n"
      "arrives (token ids when the router has no tokenizer), then one line\n"
      "of statistics to stderr.\n",
      {"router", "model", "prompt", "prompt_ids", "chat", "thinking",
       "max_tokens", "temperature", "top_k", "top_p", "seed", "window",
       "passes", "method", "no_speculation", "stop", "ignore_eos",
       "timeout_s"}};
  if (std::optional<int> exit = ParseCommandFlags(command, argv0, args)) {
    return *exit;
  }
  GenerateCommandOptions o;
  ReadRouterCommandFlags(&o);
  o.prompt = absl::GetFlag(FLAGS_prompt);
  for (const std::string& id : absl::GetFlag(FLAGS_prompt_ids)) {
    if (id.empty()) continue;  // "1,,2" and a trailing comma are fine
    int32_t value = 0;
    if (!absl::SimpleAtoi(id, &value)) {
      return ReportUsageError(
          command, "bad --prompt_ids: '" + id + "' is not a token id");
    }
    o.prompt_ids.push_back(value);
  }
  o.chat = absl::GetFlag(FLAGS_chat);
  if (o.prompt.empty() && o.prompt_ids.empty()) {
    return ReportUsageError(command, "--prompt or --prompt_ids is required");
  }
  return CommandExitStatus(command, RunGenerate(o, std::cout, std::cerr));
}

int ChatMain(const char* argv0, const std::vector<std::string>& args) {
  const CommandFlags command = {
      "dedit-cli chat",
      "--router HOST:PORT [--max_tokens N] [--system TEXT] [--window W]\n"
      "                          [--passes K] [--method model|ngram|hybrid]\n"
      "                          [--no_speculation] ...",
      "An interactive multi-turn chat over one Generation.Session stream:\n"
      "each line is a user message; the answer streams, then a line of\n"
      "per-turn statistics (acceptance, prompt tokens cached) on stderr.\n"
      "/quit or end of input ends the session. --max_tokens is per turn,\n"
      "--timeout_s bounds the whole session.\n",
      {"router", "model", "system", "thinking", "max_tokens", "temperature",
       "top_k", "top_p", "seed", "window", "passes", "method", "no_speculation",
       "stop", "ignore_eos", "timeout_s"}};
  if (std::optional<int> exit = ParseCommandFlags(command, argv0, args)) {
    return *exit;
  }
  ChatCommandOptions c;
  ReadRouterCommandFlags(&c.generate);
  c.system = absl::GetFlag(FLAGS_system);
  return CommandExitStatus(command, RunChat(c, std::cin, std::cout, std::cerr));
}
#endif

int Main(int argc, char** argv) {
  const std::vector<Command> commands = {
      {"tokenize", "encode text to token ids, or decode ids (--decode)",
       TokenizeMain},
#ifdef DEDIT_HAVE_ROUTER_CLIENT
      {"generate", "stream a generation from dedit-router", GenerateMain},
      {"chat", "interactive multi-turn chat session with dedit-router",
       ChatMain},
#endif
  };
  if (argc < 2) {
    PrintUsage(commands, stderr);
    return kExitUsage;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(commands, stdout);
    return kExitOk;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const Command& c : commands) {
    if (name == c.name) return c.run(argv[0], args);
  }
  std::fprintf(stderr, "dedit-cli: unknown command '%s'\n\n", name.c_str());
  PrintUsage(commands, stderr);
  return kExitUsage;
}

}  // namespace
}  // namespace dedit

int main(int argc, char** argv) { return dedit::Main(argc, argv); }
