#include "storage/common/client_text.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

std::string Cut(absl::string_view whole, size_t max_bytes, std::string shown) {
  if (whole.size() <= max_bytes) return shown;
  return absl::StrCat(shown, "...(", whole.size(), " bytes)");
}

}  // namespace

std::string ClientText(absl::string_view text, size_t max_bytes) {
  return Cut(text, max_bytes, absl::CHexEscape(text.substr(0, max_bytes)));
}

std::string ClientHex(absl::string_view bytes, size_t max_bytes) {
  return Cut(bytes, max_bytes, absl::BytesToHexString(bytes.substr(0, max_bytes)));
}

}  // namespace kvtier
