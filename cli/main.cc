// dedit-cli: command-line tools around the dedit libraries.
//
//   dedit-cli tokenize --tokenizer PATH [--decode] [--skip-special-tokens]
//                      [--split-special-tokens]  < in.json > out.json
//   dedit-cli generate --router HOST:PORT --prompt TEXT [--chat] ...
//
// Each subcommand parses its own flags and fills the Options struct of a
// library function (cli/*_command.h),
// so a new subcommand is one more entry in the command table. Exit status: 0 success,
// 1 runtime error (bad input, unreadable tokenizer), 2 usage error.
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "cli/tokenize_command.h"
#ifdef DEDIT_HAVE_ROUTER_CLIENT
#include "cli/generate_command.h"
#endif

namespace dedit {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct Command {
  const char* name;
  const char* summary;
  std::function<int(const std::vector<std::string>& args)> run;
};

void PrintUsage(const std::vector<Command>& commands, std::FILE* stream) {
  std::fprintf(stream, "usage: dedit-cli <command> [flags]\n\ncommands:\n");
  for (const Command& c : commands) {
    std::fprintf(stream, "  %-10s %s\n", c.name, c.summary);
  }
  std::fprintf(stream,
               "\nRun 'dedit-cli <command> --help' for the command's flags.\n");
}

// Matches "--name VALUE" and "--name=VALUE"; advances *i past the value.
// Returns false when `args[*i]` is not this flag; sets *missing when the
// value is absent.
bool TakeValueFlag(const std::vector<std::string>& args, size_t* i,
                   absl::string_view name, std::string* value, bool* missing) {
  const std::string& arg = args[*i];
  if (arg == name) {
    if (*i + 1 >= args.size()) {
      *missing = true;
      return true;
    }
    *value = args[++*i];
    return true;
  }
  if (absl::StartsWith(arg, name) && arg.size() > name.size() &&
      arg[name.size()] == '=') {
    *value = arg.substr(name.size() + 1);
    return true;
  }
  return false;
}

constexpr char kTokenizeUsage[] =
    "usage: dedit-cli tokenize --tokenizer PATH [--decode]\n"
    "                          [--skip-special-tokens] "
    "[--split-special-tokens]\n"
    "\n"
    "Reads a JSON array from stdin and writes a JSON array to stdout.\n"
    "  default   [\"text\", ...]      -> [[id, ...], ...]\n"
    "  --decode  [[id, ...], ...]   -> [\"text\", ...]\n"
    "\n"
    "  --tokenizer PATH          tokenizer.json (HF format, byte-level BPE)\n"
    "  --decode                  decode id arrays instead of encoding text\n"
    "  --skip-special-tokens     (decode) drop special tokens from the text\n"
    "  --split-special-tokens    (encode) treat special-token text as text\n";

int RunTokenize(const std::vector<std::string>& args) {
  TokenizeCommandOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    bool missing = false;
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kTokenizeUsage, stdout);
      return kExitOk;
    }
    if (TakeValueFlag(args, &i, "--tokenizer", &options.tokenizer_path,
                      &missing)) {
      if (missing) {
        std::fprintf(stderr, "dedit-cli tokenize: --tokenizer needs a path\n");
        return kExitUsage;
      }
    } else if (args[i] == "--decode") {
      options.decode = true;
    } else if (args[i] == "--skip-special-tokens") {
      options.skip_special_tokens = true;
    } else if (args[i] == "--split-special-tokens") {
      options.split_special_tokens = true;
    } else {
      std::fprintf(stderr, "dedit-cli tokenize: unknown flag '%s'\n\n%s",
                   args[i].c_str(), kTokenizeUsage);
      return kExitUsage;
    }
  }
  if (options.tokenizer_path.empty()) {
    std::fprintf(stderr, "dedit-cli tokenize: --tokenizer is required\n\n%s",
                 kTokenizeUsage);
    return kExitUsage;
  }
  const absl::Status status = RunTokenizeCommand(options, std::cin, std::cout);
  if (!status.ok()) {
    std::fprintf(stderr, "dedit-cli tokenize: %s\n", status.ToString().c_str());
    return kExitFailure;
  }
  return kExitOk;
}

int Main(int argc, char** argv) {
  const std::vector<Command> commands = {
      {"tokenize", "encode text to token ids, or decode ids (--decode)",
       RunTokenize},
#ifdef DEDIT_HAVE_ROUTER_CLIENT
      {"generate", "stream a generation from dedit-router", RunGenerateCommand},
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
    if (name == c.name) return c.run(args);
  }
  std::fprintf(stderr, "dedit-cli: unknown command '%s'\n\n", name.c_str());
  PrintUsage(commands, stderr);
  return kExitUsage;
}

}  // namespace
}  // namespace dedit

int main(int argc, char** argv) { return dedit::Main(argc, argv); }
