// ByteWriter / ByteReader (see byte_wire.h).
#include "lib/base/byte_wire.h"

#include "absl/strings/str_cat.h"

namespace pipeoffload::internal {

void ByteWriter::PutStatus(const absl::Status& status) {
  Put<std::int32_t>(static_cast<std::int32_t>(status.code()));
  PutString(std::string(status.message()));
}

bool ByteReader::GetString(std::string* text) {
  std::uint64_t n = 0;
  if (!Get(&n) || n > bytes_.size() - pos_) return ok_ = false;
  text->assign(bytes_.data() + pos_, n);
  pos_ += n;
  return true;
}

bool ByteReader::GetStatus(absl::Status* status) {
  std::int32_t code = 0;
  std::string message;
  if (!Get(&code) || !GetString(&message)) return false;
  *status = absl::Status(static_cast<absl::StatusCode>(code), message);
  return true;
}

absl::Status ByteReader::Finish(std::string_view what) const {
  if (!ok_ || pos_ != bytes_.size()) {
    return absl::DataLossError(
        absl::StrCat("malformed ", std::string(what), " message from a rank (", bytes_.size(), " bytes, read ",
                     pos_, ok_ ? "; bytes left over)" : "; ran short)"));
  }
  return absl::OkStatus();
}

}  // namespace pipeoffload::internal
