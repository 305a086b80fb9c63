// The examples' one flag parser: a table of flags (name, value name, help, handler) drives both
// the parsing of argv and the --help text, so the help can never miss a flag, and every bad input
// is an InvalidArgument naming the flag, what it expects and what it got. gpt_train and
// slide_train declare their tables with it.
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

template <typename Options>
struct FlagDef {
  using Handler = std::function<absl::Status(Options&, const std::string&)>;
  std::string_view name;        // without the leading "--"
  std::string_view value_name;  // empty for switches (the handler gets "")
  std::string_view help;
  Handler handler;
};

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

}  // namespace pipeoffload::examples

#endif  // PIPEOFFLOAD_EXAMPLES_COMMON_FLAGS_H_
