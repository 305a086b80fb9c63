// ReadBoundedFile: whole regular files; refusals of devices, FIFOs and directories (without
// blocking), of a byte past the limit (exactly at it is fine), of NUL bytes in text; errno codes
// for missing files; and files whose st_size is 0 but which hold more (/proc).
#include "lib/base/bounded_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/catch.h"
#include "tests/testing/status_value.h"

namespace pipeoffload {
namespace {

using testing::OkValue;

// A fresh directory under /tmp, removed with its files at scope exit.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/po_bounded_file_XXXXXX";
    REQUIRE(::mkdtemp(pattern) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    for (const std::string& file : files_) ::unlink(file.c_str());
    ::rmdir(path_.c_str());
  }
  std::string File(const std::string& name, const std::string& bytes) {
    const std::string path = Name(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string Name(const std::string& name) {
    files_.push_back(path_ + "/" + name);
    return files_.back();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

std::string Message(const absl::Status& status) { return std::string(status.message()); }

constexpr FileLimits kText{"schedule file", 16, /*text=*/true};

TEST_CASE("ReadBoundedFile reads a regular file whole, up to exactly the limit") {
  TempDir dir;
  const std::string at_limit = dir.File("at_limit.json", std::string(16, 'x'));
  CHECK(OkValue(ReadBoundedFile(at_limit, kText)) == std::string(16, 'x'));
  const std::string empty = dir.File("empty.json", "");
  CHECK(OkValue(ReadBoundedFile(empty, kText)) == std::string());

  const std::string over = dir.File("over.json", std::string(17, 'x'));
  const absl::StatusOr<std::string> refused = ReadBoundedFile(over, kText);
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(refused.status()) ==
        "'" + over + "' has more than 16 bytes, the limit for a schedule file");
}

TEST_CASE("ReadBoundedFile refuses NUL bytes in text and keeps them in binary files") {
  TempDir dir;
  const std::string nul = dir.File("nul.json", std::string("{}\0tail", 7));
  const absl::StatusOr<std::string> text = ReadBoundedFile(nul, kText);
  REQUIRE(!text.ok());
  CHECK(Message(text.status()) ==
        "'" + nul + "' holds a NUL byte at offset 2; a schedule file is text");
  const absl::StatusOr<std::string> binary =
      ReadBoundedFile(nul, {"data file", 16, /*text=*/false});
  CHECK(OkValue(binary) == std::string("{}\0tail", 7));
}

TEST_CASE("ReadBoundedFile refuses what is not a regular file, without blocking") {
  const absl::StatusOr<std::string> zero = ReadBoundedFile("/dev/zero", kText);
  REQUIRE(!zero.ok());
  CHECK(Message(zero.status()) == "'/dev/zero' is not a regular file (a character device); a "
                                  "schedule file must be one");

  TempDir dir;
  // A FIFO nobody writes: a plain open() for reading would wait forever.
  const std::string fifo = dir.Name("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const absl::StatusOr<std::string> from_fifo = ReadBoundedFile(fifo, kText);
  REQUIRE(!from_fifo.ok());
  CHECK(Message(from_fifo.status()) ==
        "'" + fifo + "' is not a regular file (a FIFO); a schedule file must be one");

  const absl::StatusOr<std::string> directory = ReadBoundedFile(dir.path(), kText);
  REQUIRE(!directory.ok());
  CHECK(Message(directory.status()) ==
        "'" + dir.path() + "' is not a regular file (a directory); a schedule file must be one");
}

TEST_CASE("ReadBoundedFile gives the errno's code and text for a missing file") {
  const absl::StatusOr<std::string> missing =
      ReadBoundedFile("/nonexistent/po/x.json", kText);
  REQUIRE(!missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(Message(missing.status()) ==
        "cannot open '/nonexistent/po/x.json': No such file or directory");
}

TEST_CASE("ReadBoundedFile bounds files whose size the kernel reports as 0") {
  // /proc/self/maps is a regular file of st_size 0 that reads as many lines; the limit holds on
  // what is read, not on what stat said.
  struct stat info {};
  REQUIRE(::stat("/proc/self/maps", &info) == 0);
  REQUIRE(info.st_size == 0);
  const absl::StatusOr<std::string> small = ReadBoundedFile("/proc/self/maps", kText);
  REQUIRE(!small.ok());
  CHECK(Message(small.status()) ==
        "'/proc/self/maps' has more than 16 bytes, the limit for a schedule file");
  const absl::StatusOr<std::string> whole =
      ReadBoundedFile("/proc/self/maps", {"maps", 1 << 24, /*text=*/true});
  REQUIRE(whole.ok());
  CHECK(whole->find("[stack]") != std::string::npos);
}

}  // namespace
}  // namespace pipeoffload
