// The one flag parser of the programs outside the library (examples/ and bench/): a table of
// flags (name, value name, help, handler) drives both the parsing of argv and the --help text, so
// the help can never miss a flag, and every bad input is an InvalidArgument naming the flag, what
// it expects and what it got. gpt_train, slide_train and every bench tool declare their tables
// with it; FlagsExitCode gives their mains one behaviour: --help (-h) prints the help on stdout
// and exits 0, a bad command line prints the error on stderr and exits kExitUsage (2).
#ifndef PIPEOFFLOAD_EXAMPLES_COMMON_FLAGS_H_
#define PIPEOFFLOAD_EXAMPLES_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "lib/base/status_macros.h"

namespace pipeoffload::examples {

// The exit status of every program here on a bad command line (their other codes are their own).
inline constexpr int kExitUsage = 2;

// "--flag expects EXPECTED, got 'GOT'".
absl::Status BadFlagValue(std::string_view flag, std::string_view expected, const std::string& got);
// An integer in [lo, hi].
[[nodiscard]] absl::StatusOr<std::int64_t> ParseFlagInt(std::string_view flag,
                                                        const std::string& text, std::int64_t lo,
                                                        std::int64_t hi);
// A finite number in [lo, hi].
[[nodiscard]] absl::StatusOr<double> ParseFlagDouble(std::string_view flag, const std::string& text,
                                                     double lo, double hi);
// A positive byte count with an optional suffix: K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti
// (powers of 1024), up to 2^50.
[[nodiscard]] absl::StatusOr<std::int64_t> ParseFlagBytes(std::string_view flag,
                                                          const std::string& text);
// One of `names` (its index). Errors list the names.
[[nodiscard]] absl::StatusOr<int> ParseFlagChoice(std::string_view flag, const std::string& text,
                                                  const std::vector<std::string_view>& names);

// A comma-separated list (empty items skipped, at least one left) of `names`, as their indices
// in the order given. Errors list the names.
[[nodiscard]] absl::StatusOr<std::vector<int>> ParseFlagChoices(
    std::string_view flag, const std::string& text, const std::vector<std::string_view>& names);
// A comma-separated list (empty items skipped, at least one left) of integers in [lo, hi].
[[nodiscard]] absl::StatusOr<std::vector<std::int64_t>> ParseFlagInts(std::string_view flag,
                                                                     const std::string& text,
                                                                     std::int64_t lo,
                                                                     std::int64_t hi);

template <typename Options>
struct FlagDef {
  using Handler = std::function<absl::Status(Options&, const std::string&)>;
  std::string_view name;        // without the leading "--"
  std::string_view value_name;  // empty for switches (the handler gets "")
  std::string_view help;
  Handler handler;
};

// Table entries that store the value in a field of Options (`name` must outlive the table: a
// literal). An integer in [lo, hi]:
template <typename Options, typename T>
FlagDef<Options> IntFlag(std::string_view name, std::string_view value_name, std::string_view help,
                         T Options::*field, std::int64_t lo, std::int64_t hi) {
  return {name, value_name, help, [=](Options& o, const std::string& value) -> absl::Status {
            PO_ASSIGN_OR_RETURN(const std::int64_t x, ParseFlagInt(name, value, lo, hi));
            o.*field = static_cast<T>(x);
            return absl::OkStatus();
          }};
}
// A finite number in [lo, hi]:
template <typename Options, typename T>
FlagDef<Options> RealFlag(std::string_view name, std::string_view value_name,
                          std::string_view help, T Options::*field, double lo, double hi) {
  return {name, value_name, help, [=](Options& o, const std::string& value) -> absl::Status {
            PO_ASSIGN_OR_RETURN(const double x, ParseFlagDouble(name, value, lo, hi));
            o.*field = static_cast<T>(x);
            return absl::OkStatus();
          }};
}
// Any text, the empty one included:
template <typename Options>
FlagDef<Options> TextFlag(std::string_view name, std::string_view value_name,
                          std::string_view help, std::string Options::*field) {
  return {name, value_name, help, [=](Options& o, const std::string& value) -> absl::Status {
            o.*field = value;
            return absl::OkStatus();
          }};
}
// A switch that sets the field:
template <typename Options>
FlagDef<Options> SwitchFlag(std::string_view name, std::string_view help, bool Options::*field) {
  return {name, "", help, [=](Options& o, const std::string&) -> absl::Status {
            o.*field = true;
            return absl::OkStatus();
          }};
}
// --help, which ParseFlags also takes as -h:
template <typename Options>
FlagDef<Options> HelpFlag(bool Options::*field) {
  return SwitchFlag<Options>("help", "print this text and exit (-h too).", field);
}

// Wraps `help` at the 100th column, the text starting at the 27th, one flag per entry.
std::string FlagHelpLines(const std::vector<std::pair<std::string, std::string_view>>& entries);

template <typename Options>
std::string FlagsHelp(const std::vector<FlagDef<Options>>& flags) {
  std::vector<std::pair<std::string, std::string_view>> entries;
  for (const FlagDef<Options>& def : flags) {
    std::string head = absl::StrCat("  --", std::string(def.name));
    if (!def.value_name.empty()) absl::StrAppend(&head, " ", std::string(def.value_name));
    entries.push_back({std::move(head), def.help});
  }
  return FlagHelpLines(entries);
}

// A program's --help text: `header` (its usage lines and what it does), then the flags.
template <typename Options>
std::string FlagsHelpText(std::string_view header, const std::vector<FlagDef<Options>>& flags) {
  return absl::StrCat(std::string(header), "\nflags:\n", FlagsHelp(flags));
}

// Parses args (argv[1..]) into `options` through `flags`: "--name value", "--name=value", and
// switches without a value; "-h" is "--help". `aliases` maps other spellings to flag names.
// Errors: InvalidArgument for an unknown flag, a missing value, a value given to a switch, an
// argument that is not a flag, and whatever a handler returns.
template <typename Options>
[[nodiscard]] absl::Status ParseFlags(
    const std::vector<std::string>& args, const std::vector<FlagDef<Options>>& flags,
    Options& options, const std::vector<std::pair<std::string_view, std::string_view>>& aliases = {}) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "-h") arg = "--help";
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "'; flags start with -- (see --help)"));
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const std::size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    for (const auto& [alias, real] : aliases) {
      if (name == alias) name = std::string(real);
    }
    const FlagDef<Options>* def = nullptr;
    for (const FlagDef<Options>& candidate : flags) {
      if (candidate.name == name) def = &candidate;
    }
    if (def == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (def->value_name.empty()) {
      if (value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      value = "";
    } else if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value (", std::string(def->value_name), ")"));
      }
      value = args[++i];
    }
    PO_RETURN_IF_ERROR(def->handler(options, *value));
  }
  return absl::OkStatus();
}

// argv[1..], for ParseFlags.
std::vector<std::string> FlagArgs(int argc, char** argv);
// argv joined by spaces, for a report's "Command:" line.
std::string CommandLine(int argc, char** argv);

// What a program's main does with its parsed command line: std::nullopt to go on and run;
// otherwise the status to exit with at once, after printing `help_text()` on stdout for --help
// (0), or "PROGRAM: MESSAGE (see --help)" on stderr for a bad command line (kExitUsage).
std::optional<int> FlagsExitCode(std::string_view program, const absl::Status& parsed, bool help,
                                 const std::function<std::string()>& help_text);
// A bad command line's message with " (see --help)" appended, unless it names --help already
// (the parser's own messages do).
std::string WithHelpPointer(const std::string& message);
// The same for options with a `help` field.
template <typename Options>
std::optional<int> FlagsExitCode(std::string_view program, const absl::StatusOr<Options>& parsed,
                                 const std::function<std::string()>& help_text) {
  return FlagsExitCode(program, parsed.status(), parsed.ok() && parsed->help, help_text);
}

}  // namespace pipeoffload::examples

#endif  // PIPEOFFLOAD_EXAMPLES_COMMON_FLAGS_H_
