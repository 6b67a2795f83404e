// Fuzz target: the catalog's key and value decoders
// (storage/catalog/record_format.h).
//
// Input: byte 0 picks the decoder (low 3 bits) and, with bit 3 set, seals
// the rest with its correct 4-byte check (so mutations reach the fields
// behind the checksum); bytes 1.. are the encoded key or value.
//
// Checked (a violation abort()s):
//   - a decoder returns a value or DATA_LOSS, nothing else;
//   - a decoded value passes its Validate* function;
//   - keys, block records, context records and fixed-width integers are
//     canonical: encoding the decoded value gives back the input bytes;
//   - a profile record re-encodes to a record that decodes to the same
//     profile, and that encoding is a fixed point;
//   - PrefixSuccessor(p) is greater than p and every string starting with
//     p, or "" exactly when p is empty or all 0xff.
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "storage/catalog/record_format.h"
#include "storage/catalog/records.h"

namespace {

namespace cf = kvtier::catalog_format;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "catalog_record_fuzz: %s\n", what);
  std::abort();
}

template <class T>
bool Decoded(const absl::StatusOr<T>& v) {
  if (v.ok()) return true;
  Check(v.status().code() == absl::StatusCode::kDataLoss, "decoder error is not DATA_LOSS");
  Check(!v.status().message().empty(), "DATA_LOSS without a message");
  return false;
}

std::string Seal(std::string body) {
  const uint32_t check = static_cast<uint32_t>(XXH3_64bits(body.data(), body.size()));
  for (int i = 0; i < 4; ++i) body.push_back(static_cast<char>((check >> (8 * i)) & 0xff));
  return body;
}

void Successor(const std::string& p) {
  const std::string s = cf::PrefixSuccessor(p);
  if (s.empty()) {
    Check(p.find_first_not_of('\xff') == std::string::npos, "no successor for a non-0xff prefix");
    return;
  }
  Check(s > p, "successor is not greater than the prefix");
  Check(s.compare(0, p.size(), p) != 0, "successor starts with the prefix");
  Check(s.size() <= p.size(), "successor longer than the prefix");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((mode & 0x08) != 0) bytes = Seal(std::move(bytes));
  switch (mode & 0x07) {
    case 0: {
      auto key = cf::DecodeBlockKey(bytes);
      if (!Decoded(key)) break;
      Check(kvtier::ValidateBlockKey(*key).ok(), "decoded block key fails validation");
      Check(cf::EncodeBlockKey(*key) == bytes, "block key is not canonical");
      break;
    }
    case 1: {
      auto record = cf::DecodeBlockRecord(bytes);
      if (!Decoded(record)) break;
      Check(kvtier::ValidateBlockRecord(*record).ok(), "decoded block record fails validation");
      Check(cf::EncodeBlockRecord(*record) == bytes, "block record is not canonical");
      break;
    }
    case 2: {
      auto profile = cf::DecodeProfileRecord(bytes);
      if (!Decoded(profile)) break;
      Check(kvtier::ValidateProfile(*profile).ok(), "decoded profile fails validation");
      Check(profile->profile_id != 0, "decoded profile has id 0");
      const std::string again = cf::EncodeProfileRecord(*profile);
      auto reread = cf::DecodeProfileRecord(again);
      Check(reread.ok() && *reread == *profile, "profile record does not round-trip");
      Check(cf::EncodeProfileRecord(*reread) == again, "profile encoding is not a fixed point");
      break;
    }
    case 3: {
      auto key = cf::DecodeContextVersionKey(bytes);
      if (!Decoded(key)) break;
      auto again = cf::DecodeContextVersionKey(cf::EncodeContextVersionKey(*key));
      Check(again.ok() && again->tenant == key->tenant && again->profile_id == key->profile_id &&
                again->context_key == key->context_key && again->version == key->version,
            "context version key does not round-trip");
      break;
    }
    case 4: {
      auto record = cf::DecodeContextVersionRecord(bytes);
      if (!Decoded(record)) break;
      Check(kvtier::ValidateContextVersionRecord(*record).ok(),
            "decoded context version record fails validation");
      auto again = cf::DecodeContextVersionRecord(cf::EncodeContextVersionRecord(*record));
      Check(again.ok() && *again == *record, "context version record does not round-trip");
      break;
    }
    case 5: {
      auto v = cf::DecodeU32(bytes, "u32");
      if (Decoded(v)) Check(cf::EncodeU32(*v) == bytes, "u32 is not canonical");
      break;
    }
    case 6: {
      auto v = cf::DecodeU64(bytes, "u64");
      if (Decoded(v)) Check(cf::EncodeU64(*v) == bytes, "u64 is not canonical");
      break;
    }
    default:
      Successor(bytes);
      break;
  }
  return 0;
}
