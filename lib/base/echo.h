// Quoting user text in error messages without echoing all of it: a 50 MB string or a line of a
// binary file must not become a 50 MB error message. Header-only; no state.
#ifndef PIPEOFFLOAD_LIB_BASE_ECHO_H_
#define PIPEOFFLOAD_LIB_BASE_ECHO_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace pipeoffload {

// Longest user text an error message repeats in full.
inline constexpr std::size_t kMaxEchoBytes = 64;

// `text` when it has at most `max_bytes` bytes, else its first ones (cut before a UTF-8
// continuation byte, so the message stays valid UTF-8 where the text was) followed by
// "... (N bytes)". Never quotes; callers add the quotes they want.
inline std::string Echo(std::string_view text, std::size_t max_bytes = kMaxEchoBytes) {
  if (text.size() <= max_bytes) return std::string(text);
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(std::string(text.substr(0, cut)), "... (", text.size(), " bytes)");
}

}  // namespace pipeoffload

#endif  // PIPEOFFLOAD_LIB_BASE_ECHO_H_
