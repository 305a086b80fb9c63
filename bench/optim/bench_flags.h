// The command-line shape the optimizer benchmarks share: "--name=value" flags (a bare "--name"
// has an empty value), the command echoed into their reports, and comma-separated lists.
#ifndef PIPEOFFLOAD_BENCH_OPTIM_BENCH_FLAGS_H_
#define PIPEOFFLOAD_BENCH_OPTIM_BENCH_FLAGS_H_

#include <sstream>
#include <string>
#include <vector>

namespace pipeoffload::bench {

struct BenchFlag {
  std::string name;   // "--params"
  std::string value;  // after the first '=', or empty
};

// argv joined by spaces, for the report's "Command:" line.
inline std::string CommandLine(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  return command;
}

// argv[1..] split at their first '='.
inline std::vector<BenchFlag> SplitFlags(int argc, char** argv) {
  std::vector<BenchFlag> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::size_t eq = arg.find('=');
    flags.push_back(
        BenchFlag{arg.substr(0, eq), eq == std::string::npos ? "" : arg.substr(eq + 1)});
  }
  return flags;
}

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> items;
  std::stringstream stream(list);
  for (std::string item; std::getline(stream, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

}  // namespace pipeoffload::bench

#endif  // PIPEOFFLOAD_BENCH_OPTIM_BENCH_FLAGS_H_
