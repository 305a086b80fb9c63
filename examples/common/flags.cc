// Value parsers, help layout and exit handling of the programs' flag parser (flags.h).
#include "examples/common/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_split.h"

namespace pipeoffload::examples {

absl::Status BadFlagValue(std::string_view flag, std::string_view expected, const std::string& got) {
  return absl::InvalidArgumentError(absl::StrCat("--", std::string(flag), " expects ",
                                                 std::string(expected), ", got '", got, "'"));
}

absl::StatusOr<std::int64_t> ParseFlagInt(std::string_view flag, const std::string& text,
                                          std::int64_t lo, std::int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || value < lo || value > hi) {
    return BadFlagValue(flag, absl::StrCat("an integer in [", lo, ", ", hi, "]"), text);
  }
  return static_cast<std::int64_t>(value);
}

absl::StatusOr<double> ParseFlagDouble(std::string_view flag, const std::string& text, double lo,
                                       double hi) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(value) || value < lo ||
      value > hi) {
    return BadFlagValue(flag, absl::StrCat("a number in [", lo, ", ", hi, "]"), text);
  }
  return value;
}

absl::StatusOr<std::int64_t> ParseFlagBytes(std::string_view flag, const std::string& text) {
  static constexpr std::pair<std::string_view, std::int64_t> kSuffixes[] = {
      {"Ki", std::int64_t{1} << 10}, {"Mi", std::int64_t{1} << 20},
      {"Gi", std::int64_t{1} << 30}, {"Ti", std::int64_t{1} << 40},
      {"K", 1000},                   {"M", 1000 * 1000},
      {"G", 1000 * 1000 * 1000},     {"T", std::int64_t{1000} * 1000 * 1000 * 1000}};
  std::string digits = text;
  std::int64_t scale = 1;
  for (const auto& [suffix, factor] : kSuffixes) {
    if (digits.size() > suffix.size() &&
        std::string_view(digits).substr(digits.size() - suffix.size()) == suffix) {
      digits.resize(digits.size() - suffix.size());
      scale = factor;
      break;
    }
  }
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 50;
  absl::StatusOr<std::int64_t> base = ParseFlagInt(flag, digits, 1, kMaxBytes / scale);
  if (!base.ok()) {
    return BadFlagValue(flag, "a positive byte count (suffixes K, M, G, T, Ki, Mi, Gi, Ti)", text);
  }
  return *base * scale;
}

absl::StatusOr<int> ParseFlagChoice(std::string_view flag, const std::string& text,
                                    const std::vector<std::string_view>& names) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (text == names[i]) return static_cast<int>(i);
  }
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : (i + 1 == names.size() ? " or " : ", "),
                    std::string(names[i]));
  }
  return BadFlagValue(flag, list, text);
}

absl::StatusOr<std::vector<int>> ParseFlagChoices(std::string_view flag, const std::string& text,
                                                  const std::vector<std::string_view>& names) {
  const std::vector<std::string> items = absl::StrSplit(text, ',', absl::SkipEmpty());
  std::vector<int> indices;
  for (const std::string& item : items) {
    const auto it = std::find(names.begin(), names.end(), item);
    if (it == names.end()) break;
    indices.push_back(static_cast<int>(it - names.begin()));
  }
  if (items.empty() || indices.size() != items.size()) {
    std::string list;
    for (const std::string_view name : names) {
      absl::StrAppend(&list, list.empty() ? "" : ", ", std::string(name));
    }
    return BadFlagValue(flag, absl::StrCat("a comma-separated list of ", list), text);
  }
  return indices;
}

absl::StatusOr<std::vector<std::int64_t>> ParseFlagInts(std::string_view flag,
                                                        const std::string& text, std::int64_t lo,
                                                        std::int64_t hi) {
  const std::vector<std::string> items = absl::StrSplit(text, ',', absl::SkipEmpty());
  std::vector<std::int64_t> values;
  for (const std::string& item : items) {
    absl::StatusOr<std::int64_t> value = ParseFlagInt(flag, item, lo, hi);
    if (!value.ok()) break;
    values.push_back(*value);
  }
  if (items.empty() || values.size() != items.size()) {
    return BadFlagValue(
        flag, absl::StrCat("a comma-separated list of integers in [", lo, ", ", hi, "]"), text);
  }
  return values;
}

std::string FlagHelpLines(const std::vector<std::pair<std::string, std::string_view>>& entries) {
  constexpr std::size_t kHelpColumn = 27;  // where each flag's text starts
  constexpr std::size_t kWidth = 100;      // wrap the text at this column
  std::string text;
  for (const auto& [head, help] : entries) {
    std::string line = head;
    line.resize(std::max(line.size() + 1, kHelpColumn), ' ');
    std::string_view words = help;
    while (!words.empty()) {
      const std::size_t space = words.find(' ');
      const std::string_view word = words.substr(0, space);
      words = space == std::string_view::npos ? std::string_view() : words.substr(space + 1);
      const std::size_t newline = line.rfind('\n');
      const std::size_t used = line.size() - (newline == std::string::npos ? 0 : newline + 1);
      if (used + word.size() >= kWidth && used > kHelpColumn) {
        line.back() = '\n';
        line.append(kHelpColumn, ' ');
      }
      absl::StrAppend(&line, std::string(word), " ");
    }
    line.back() = '\n';
    text += line;
  }
  return text;
}

std::vector<std::string> FlagArgs(int argc, char** argv) {
  return argc > 1 ? std::vector<std::string>(argv + 1, argv + argc) : std::vector<std::string>();
}

std::string CommandLine(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) absl::StrAppend(&command, i == 0 ? "" : " ", argv[i]);
  return command;
}

std::string WithHelpPointer(const std::string& message) {
  return message.find("--help") == std::string::npos ? message + " (see --help)" : message;
}

std::optional<int> FlagsExitCode(std::string_view program, const absl::Status& parsed, bool help,
                                 const std::function<std::string()>& help_text) {
  if (!parsed.ok()) {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(),
                 WithHelpPointer(std::string(parsed.message())).c_str());
    return kExitUsage;
  }
  if (help) {
    std::fputs(help_text().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

}  // namespace pipeoffload::examples
