// Golden files in tests/golden/: where they are, and the one way a test checks (or, under
// scripts/update_golden.sh, rewrites) one. PO_GOLDEN_DIR overrides the folder; PO_UPDATE_GOLDEN=1
// writes the rendered text instead of comparing, so only that script changes golden files.
#ifndef PIPEOFFLOAD_TESTS_TESTING_GOLDEN_FILE_H_
#define PIPEOFFLOAD_TESTS_TESTING_GOLDEN_FILE_H_

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/catch.h"

namespace pipeoffload::testing {

inline std::filesystem::path GoldenDir() {
  if (const char* dir = std::getenv("PO_GOLDEN_DIR"); dir != nullptr && *dir != '\0') return dir;
  // tests/testing/golden_file.h -> tests/golden
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "golden";
}

inline std::vector<std::string> GoldenLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// REQUIREs that the file `name` in GoldenDir() holds exactly `rendered`, naming the first line
// that differs; writes it instead when PO_UPDATE_GOLDEN=1.
inline void MatchGolden(const std::string& name, const std::string& rendered) {
  const std::filesystem::path path = GoldenDir() / name;
  INFO("golden file " << path.string());
  const char* update = std::getenv("PO_UPDATE_GOLDEN");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << rendered;
    out.close();
    REQUIRE(out.good());
    return;
  }
  std::ifstream in(path, std::ios::binary);
  INFO("missing? run scripts/update_golden.sh");
  REQUIRE(in.good());
  std::stringstream stored;
  stored << in.rdbuf();
  const std::vector<std::string> want = GoldenLines(stored.str());
  const std::vector<std::string> got = GoldenLines(rendered);
  for (std::size_t i = 0; i < std::max(want.size(), got.size()); ++i) {
    const std::string w = i < want.size() ? want[i] : "<end of file>";
    const std::string g = i < got.size() ? got[i] : "<end of output>";
    INFO("first difference at line " << i + 1 << "\n  golden:   " << w << "\n  rendered: " << g);
    REQUIRE(w == g);
  }
  REQUIRE(stored.str() == rendered);  // byte for byte: line endings and the last newline too
}

}  // namespace pipeoffload::testing

#endif  // PIPEOFFLOAD_TESTS_TESTING_GOLDEN_FILE_H_
