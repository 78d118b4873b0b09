// How dedit-cli's commands read their flags: absl flags (ABSL_FLAG in
// cli/main.cc, read with absl::GetFlag into the command's Options struct),
// one subcommand at a time.
//
//   dedit-cli <command> [--flag=value | --flag value | --bool_flag]...
//
//   const CommandFlags kTokenize = {
//       "dedit-cli tokenize", "--tokenizer PATH [--decode] < in > out",
//       "Encodes text to token ids.", {"tokenizer", "decode"}};
//   if (std::optional<int> exit = ParseCommandFlags(kTokenize, argv[0], args))
//     return *exit;
//   options.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
//
// On top of absl::ParseCommandLine:
//   - Dashes and underscores in flag names are interchangeable
//     (--skip-special-tokens is --skip_special_tokens). absl flag names
//     cannot contain '-', and scripts and users type the dashed names;
//     values are never rewritten.
//   - A command accepts only its own flags, although every command's
//     flags are defined in the one binary.
//   - A usage error (unknown flag, missing or malformed value, an argument
//     that is not a flag, a list flag given twice — absl would keep only
//     the last list) is printed with the command's help to stderr and the
//     command exits kExitUsage; absl::ParseCommandLine alone would exit 1,
//     which these programs reserve for runtime errors.
//   - --help or -h prints the command's help (synopsis, description, its
//     flags with their help text and defaults) to stdout; exit 0.
#ifndef DEDIT_CLI_COMMAND_FLAGS_H_
#define DEDIT_CLI_COMMAND_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dedit {

// Exit statuses of every dedit-cli command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // runtime error: bad input, I/O, RPC
inline constexpr int kExitUsage = 2;    // the command line is wrong

struct CommandFlags {
  std::string program;             // "dedit-cli tokenize": message prefix
  std::string synopsis;            // what follows `program` on the usage line
  std::string description;         // printed after the usage line
  std::vector<std::string> flags;  // the absl flags it accepts, help order
};

// Checks `args` (the words after the command) against `command`, then
// sets the flags with absl::ParseCommandLine. Returns std::nullopt when
// the flags are set and the command should run; otherwise the exit status
// after help (kExitOk) or a usage error (kExitUsage), already reported.
// Each value is checked with its flag's own absl parser first, so
// absl::ParseCommandLine is only reached with a command line it accepts.
// A flag name in `command.flags` that no ABSL_FLAG defines is a program
// bug: reported, kExitFailure.
// Call once per process.
std::optional<int> ParseCommandFlags(const CommandFlags& command,
                                     const char* argv0,
                                     const std::vector<std::string>& args);

// Prints "<program>: <message>", a blank line and the command's help to
// stderr; returns kExitUsage. For checks ParseCommandFlags cannot make,
// such as a required flag left empty.
int ReportUsageError(const CommandFlags& command, absl::string_view message);

// The end of a command that ran: kExitOk when `status` is OK, else prints
// "<program>: <status>" to stderr and returns kExitFailure.
int CommandExitStatus(const CommandFlags& command, const absl::Status& status);

}  // namespace dedit

#endif  // DEDIT_CLI_COMMAND_FLAGS_H_
