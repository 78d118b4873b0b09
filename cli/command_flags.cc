#include "cli/command_flags.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dedit {
namespace {

using FlagList = std::vector<std::string>;

// What a flag's value looks like, for the help text.
std::string ValueSyntax(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "";
  if (flag.IsOfType<std::string>()) return "=STRING";
  if (flag.IsOfType<FlagList>()) return "=A,B,...";
  if (flag.IsOfType<float>() || flag.IsOfType<double>()) return "=NUMBER";
  if (flag.IsOfType<int>() || flag.IsOfType<int64_t>()) return "=INT";
  return "=VALUE";
}

// Usage line, description, and the flags with their help and defaults.
std::string CommandHelp(const CommandFlags& command) {
  std::string help =
      absl::StrCat("usage: ", command.program, " ", command.synopsis, "\n");
  if (!command.description.empty()) {
    absl::StrAppend(&help, "\n", command.description);
    if (!absl::EndsWith(command.description, "\n")) help += "\n";
  }
  absl::StrAppend(&help,
                  "\nflags (dashes and underscores in names are "
                  "interchangeable):\n");
  for (const std::string& name : command.flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;  // reported by ParseCommandFlags
    absl::StrAppend(&help, "  --", name, ValueSyntax(*flag), "\n      ",
                    flag->Help());
    const std::string default_value = flag->DefaultValue();
    if (!default_value.empty() && default_value != "false") {
      absl::StrAppend(&help, " (default: ", default_value, ")");
    }
    help += "\n";
  }
  return help;
}

}  // namespace

int ReportUsageError(const CommandFlags& command, absl::string_view message) {
  std::fprintf(stderr, "%s: %s\n\n%s", command.program.c_str(),
               std::string(message).c_str(), CommandHelp(command).c_str());
  return kExitUsage;
}

int CommandExitStatus(const CommandFlags& command, const absl::Status& status) {
  if (status.ok()) return kExitOk;
  std::fprintf(stderr, "%s: %s\n", command.program.c_str(),
               status.ToString().c_str());
  return kExitFailure;
}

std::optional<int> ParseCommandFlags(const CommandFlags& command,
                                     const char* argv0,
                                     const std::vector<std::string>& args) {
  std::map<std::string, absl::CommandLineFlag*, std::less<>> known;
  for (const std::string& name : command.flags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      std::fprintf(stderr, "%s: bug: no ABSL_FLAG defines --%s\n",
                   command.program.c_str(), name.c_str());
      return kExitFailure;
    }
    known[name] = flag;
  }

  // The command line as absl::ParseCommandLine gets it: canonical names,
  // "--name=value", or "--name" "" for an empty value given apart (absl
  // refuses "--name=").
  std::vector<std::string> canonical;
  std::set<std::string> lists_seen;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(CommandHelp(command).c_str(), stdout);
      return kExitOk;
    }
    if (arg == "--") {  // ends the flags, as in absl; no arguments follow
      if (i + 1 < args.size()) {
        return ReportUsageError(
            command, absl::StrCat("unexpected argument '", args[i + 1], "'"));
      }
      break;
    }
    absl::string_view body = arg;
    if (!absl::ConsumePrefix(&body, "-") || body.empty()) {
      return ReportUsageError(command,
                              absl::StrCat("unexpected argument '", arg, "'"));
    }
    absl::ConsumePrefix(&body, "-");  // --name and -name, as in absl
    const size_t eq = body.find('=');
    const bool has_value = eq != absl::string_view::npos;
    std::string name(body.substr(0, eq));
    std::replace(name.begin(), name.end(), '-', '_');
    std::string value(has_value ? body.substr(eq + 1) : "");

    absl::CommandLineFlag* flag = nullptr;
    bool negated = false;  // --nodecode, as in absl
    if (auto it = known.find(name); it != known.end()) {
      flag = it->second;
    } else if (absl::StartsWith(name, "no")) {
      auto positive = known.find(absl::string_view(name).substr(2));
      if (positive != known.end() && positive->second->IsOfType<bool>()) {
        flag = positive->second;
        negated = true;
      }
    }
    if (flag == nullptr) {
      return ReportUsageError(command,
                              absl::StrCat("unknown flag '", arg, "'"));
    }
    const std::string shown = absl::StrCat("--", flag->Name());
    if (has_value && value.empty()) {
      return ReportUsageError(command,
                              absl::StrCat(arg, ": no value after '='"));
    }
    if (flag->IsOfType<bool>()) {
      if (negated && has_value) {
        return ReportUsageError(
            command, absl::StrCat(arg, ": the --no form takes no value"));
      }
      if (!has_value) value = negated ? "false" : "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        return ReportUsageError(command, absl::StrCat(shown, " needs a value"));
      }
      value = args[++i];
    }
    // absl keeps only the last of repeated values; for a list that would
    // silently drop items.
    if (flag->IsOfType<FlagList>() && !lists_seen.insert(name).second) {
      return ReportUsageError(command,
                              absl::StrCat(shown,
                                           " given twice: give the list once, "
                                           "comma-separated"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return ReportUsageError(command, error);
    }
    if (value.empty()) {
      canonical.push_back(shown);
      canonical.push_back("");
    } else {
      canonical.push_back(absl::StrCat(shown, "=", value));
    }
  }

  std::vector<char*> argv = {const_cast<char*>(argv0)};
  for (std::string& arg : canonical) argv.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  return std::nullopt;
}

}  // namespace dedit
