#include "storage/catalog/record_format.h"

#include <xxhash.h>

#include <bit>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvtier::catalog_format {
namespace {

constexpr uint8_t kFlagDurable = 1 << 0;
constexpr uint8_t kFlagQuarantined = 1 << 1;
constexpr uint8_t kFlagHasNvme = 1 << 2;
constexpr uint8_t kFlagRetained = 1 << 3;
constexpr uint8_t kKnownFlags = kFlagDurable | kFlagQuarantined | kFlagHasNvme | kFlagRetained;
constexpr size_t kCheckBytes = 4;

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }

void PutLittle(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutU64Big(std::string* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutShortBytes(std::string* out, absl::string_view bytes) {
  PutU8(out, static_cast<uint8_t>(bytes.size()));
  out->append(bytes.data(), bytes.size());
}

uint32_t Check(absl::string_view bytes) {
  return static_cast<uint32_t>(XXH3_64bits(bytes.data(), bytes.size()));
}

void AppendCheck(std::string* out) { PutLittle(out, Check(*out), 4); }

// Bounds-checked reading of one encoded key or value. Every Get* returns
// false once the input is exhausted; the caller turns that into DATA_LOSS.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : bytes_(bytes) {}

  size_t remaining() const { return bytes_.size() - pos_; }
  bool GetU8(uint8_t* v) {
    if (bytes_.size() - pos_ < 1) return false;
    *v = static_cast<uint8_t>(bytes_[pos_++]);
    return true;
  }
  bool GetLittle(int width, uint64_t* v) {
    if (bytes_.size() - pos_ < static_cast<size_t>(width)) return false;
    *v = 0;
    for (int i = 0; i < width; ++i) {
      *v |= uint64_t{static_cast<uint8_t>(bytes_[pos_ + i])} << (8 * i);
    }
    pos_ += width;
    return true;
  }
  bool GetU32(uint32_t* v) {
    uint64_t wide;
    if (!GetLittle(4, &wide)) return false;
    *v = static_cast<uint32_t>(wide);
    return true;
  }
  bool GetU64(uint64_t* v) { return GetLittle(8, v); }
  bool GetI64(int64_t* v) {
    uint64_t u;
    if (!GetLittle(8, &u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  bool GetU64Big(uint64_t* v) {
    if (bytes_.size() - pos_ < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v = (*v << 8) | static_cast<uint8_t>(bytes_[pos_ + i]);
    pos_ += 8;
    return true;
  }
  bool GetBytes(size_t n, std::string* out) {
    if (bytes_.size() - pos_ < n) return false;
    out->assign(bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool GetShortBytes(std::string* out) {
    uint8_t n;
    return GetU8(&n) && GetBytes(n, out);
  }
  std::string Rest() {
    std::string rest(bytes_.substr(pos_));
    pos_ = bytes_.size();
    return rest;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  absl::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Loss(absl::string_view what, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("corrupt catalog ", what, ": ", why));
}

// Verifies the version byte and the trailing check of a value and returns
// a reader over the bytes between them.
absl::StatusOr<Reader> OpenValue(absl::string_view bytes, absl::string_view what) {
  if (bytes.size() < 1 + kCheckBytes) return Loss(what, "too short");
  const absl::string_view body = bytes.substr(0, bytes.size() - kCheckBytes);
  Reader tail(bytes.substr(body.size()));
  uint32_t stored = 0;
  tail.GetU32(&stored);
  if (stored != Check(body)) return Loss(what, "check mismatch");
  if (static_cast<uint8_t>(body[0]) != kRecordVersion) {
    return Loss(what, absl::StrCat("unknown version ", static_cast<int>(body[0])));
  }
  return Reader(body.substr(1));
}

// tenant | profile_id prefix shared by block and context keys.
bool GetScope(Reader* r, std::string* tenant, uint64_t* profile_id) {
  return r->GetShortBytes(tenant) && tenant->size() <= kMaxTenantBytes &&
         r->GetU64Big(profile_id) && *profile_id != 0;
}

}  // namespace

std::string BlockKeyPrefix(absl::string_view tenant, uint64_t profile_id) {
  std::string out;
  out.reserve(1 + tenant.size() + 8);
  PutShortBytes(&out, tenant);
  PutU64Big(&out, profile_id);
  return out;
}

std::string EncodeBlockKey(const BlockKey& key) {
  std::string out = BlockKeyPrefix(key.tenant, key.profile_id);
  out.append(key.block_id);
  return out;
}

absl::StatusOr<BlockKey> DecodeBlockKey(absl::string_view bytes) {
  Reader r(bytes);
  BlockKey key;
  if (!GetScope(&r, &key.tenant, &key.profile_id)) return Loss("block key", "bad scope");
  key.block_id = r.Rest();
  if (key.block_id.empty() || key.block_id.size() > kMaxBlockIdBytes) {
    return Loss("block key", absl::StrCat("block_id of ", key.block_id.size(), " bytes"));
  }
  return key;
}

std::string EncodeBlockRecord(const BlockRecord& record) {
  std::string out;
  out.reserve(62 + record.summary.size());
  PutU8(&out, kRecordVersion);
  uint8_t flags = 0;
  if (record.durable) flags |= kFlagDurable;
  if (record.quarantined) flags |= kFlagQuarantined;
  if (record.nvme.has_value()) flags |= kFlagHasNvme;
  if (record.retained) flags |= kFlagRetained;
  PutU8(&out, flags);
  PutLittle(&out, record.size_bytes, 8);
  PutLittle(&out, record.checksum, 8);
  PutLittle(&out, static_cast<uint64_t>(record.created_micros), 8);
  PutLittle(&out, static_cast<uint64_t>(record.last_access_micros), 8);
  if (record.nvme.has_value()) {
    PutLittle(&out, record.nvme->file_index, 4);
    PutLittle(&out, record.nvme->offset, 8);
    PutLittle(&out, record.nvme->length, 8);
  }
  PutLittle(&out, record.summary.size(), 4);
  out.append(record.summary);
  AppendCheck(&out);
  return out;
}

absl::StatusOr<BlockRecord> DecodeBlockRecord(absl::string_view bytes) {
  auto opened = OpenValue(bytes, "block record");
  if (!opened.ok()) return opened.status();
  Reader& r = *opened;
  BlockRecord record;
  uint8_t flags = 0;
  if (!r.GetU8(&flags) || !r.GetU64(&record.size_bytes) || !r.GetU64(&record.checksum) ||
      !r.GetI64(&record.created_micros) || !r.GetI64(&record.last_access_micros)) {
    return Loss("block record", "truncated header");
  }
  if ((flags & ~kKnownFlags) != 0) {
    return Loss("block record", absl::StrCat("unknown flags ", static_cast<int>(flags)));
  }
  record.durable = (flags & kFlagDurable) != 0;
  record.quarantined = (flags & kFlagQuarantined) != 0;
  record.retained = (flags & kFlagRetained) != 0;
  if ((flags & kFlagHasNvme) != 0) {
    NvmeExtent loc;
    if (!r.GetU32(&loc.file_index) || !r.GetU64(&loc.offset) || !r.GetU64(&loc.length)) {
      return Loss("block record", "truncated nvme location");
    }
    record.nvme = loc;
  }
  uint32_t summary_len = 0;
  if (!r.GetU32(&summary_len) || summary_len > kMaxSummaryBytes ||
      !r.GetBytes(summary_len, &record.summary) || !r.done()) {
    return Loss("block record", "bad summary length");
  }
  absl::Status valid = ValidateBlockRecord(record);
  if (!valid.ok()) return Loss("block record", valid.message());
  return record;
}

std::string ProfileIdPrefix(uint64_t profile_id) {
  std::string out(1, kProfileKeyTag);
  PutU64Big(&out, profile_id);
  return out;
}

std::string EncodeProfileKey(absl::string_view tenant, uint64_t profile_id) {
  std::string out = ProfileIdPrefix(profile_id);
  PutShortBytes(&out, tenant);
  return out;
}

std::string EncodeProfileNameKey(absl::string_view tenant, absl::string_view name,
                                 absl::string_view revision) {
  std::string out(1, kProfileNameKeyTag);
  PutShortBytes(&out, tenant);
  PutShortBytes(&out, name);
  PutShortBytes(&out, revision);
  return out;
}

std::string EncodeProfileRecord(const ModelProfile& profile) {
  std::string out;
  PutU8(&out, kRecordVersion);
  PutLittle(&out, profile.profile_id, 8);
  PutLittle(&out, profile.layers, 4);
  PutLittle(&out, profile.kv_heads, 4);
  PutLittle(&out, profile.head_dim, 4);
  PutLittle(&out, profile.block_size_tokens, 4);
  PutU8(&out, static_cast<uint8_t>(profile.dtype));
  PutU8(&out, static_cast<uint8_t>(profile.layout));
  PutShortBytes(&out, profile.name);
  PutShortBytes(&out, profile.revision);
  // Optional trailing fields, each u8 tag | u32 length | bytes (records
  // written before them end at the revision).
  auto field = [&out](uint8_t tag, const std::string& bytes) {
    if (bytes.empty()) return;
    PutU8(&out, tag);
    PutLittle(&out, bytes.size(), 4);
    out.append(bytes);
  };
  field(kProfileCalibrationTag, profile.calibration);
  field(kProfileOwnerTag, profile.owner);
  AppendCheck(&out);
  return out;
}

absl::StatusOr<ModelProfile> DecodeProfileRecord(absl::string_view bytes) {
  auto opened = OpenValue(bytes, "profile record");
  if (!opened.ok()) return opened.status();
  Reader& r = *opened;
  ModelProfile p;
  uint8_t dtype = 0;
  uint8_t layout = 0;
  if (!r.GetU64(&p.profile_id) || !r.GetU32(&p.layers) || !r.GetU32(&p.kv_heads) ||
      !r.GetU32(&p.head_dim) || !r.GetU32(&p.block_size_tokens) || !r.GetU8(&dtype) ||
      !r.GetU8(&layout) || !r.GetShortBytes(&p.name) || !r.GetShortBytes(&p.revision)) {
    return Loss("profile record", "truncated");
  }
  while (!r.done()) {
    uint8_t tag = 0;
    uint32_t n = 0;
    std::string bytes;
    if (!r.GetU8(&tag) || !r.GetU32(&n) || n == 0 || n > kMaxCalibrationBytes ||
        !r.GetBytes(n, &bytes)) {
      return Loss("profile record", "truncated optional field");
    }
    if (tag == kProfileCalibrationTag && p.calibration.empty()) {
      p.calibration = std::move(bytes);
    } else if (tag == kProfileOwnerTag && p.owner.empty() && n <= kMaxTenantBytes) {
      p.owner = std::move(bytes);
    } else {
      return Loss("profile record", absl::StrCat("unknown or repeated field ", int{tag}));
    }
  }
  p.dtype = static_cast<KvDtype>(dtype);
  p.layout = static_cast<BlockLayout>(layout);
  absl::Status valid = ValidateProfile(p);
  if (!valid.ok()) return Loss("profile record", valid.message());
  if (p.profile_id == 0) return Loss("profile record", "profile_id 0");
  return p;
}

// ---- Compaction versions ----------------------------------------------------

namespace {

void PutU32Big(std::string* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// u32 count | count 4-byte values; a count the remaining bytes cannot hold
// is refused before anything is allocated.
template <typename T, typename FromBits>
bool GetArray(Reader* r, std::vector<T>* out, FromBits from_bits) {
  uint32_t n = 0;
  if (!r->GetU32(&n) || n > kMaxCompactedSlots || n > r->remaining() / 4) return false;
  out->resize(n);
  for (T& v : *out) {
    uint32_t bits = 0;
    r->GetU32(&bits);
    v = from_bits(bits);
  }
  return true;
}

}  // namespace

std::string ContextVersionPrefix(absl::string_view tenant, uint64_t profile_id) {
  std::string out(1, kContextVersionKeyTag);
  out.append(BlockKeyPrefix(tenant, profile_id));
  return out;
}

std::string ContextVersionPrefix(absl::string_view tenant, uint64_t profile_id,
                                 absl::string_view context_key) {
  std::string out = ContextVersionPrefix(tenant, profile_id);
  PutShortBytes(&out, context_key);
  return out;
}

std::string EncodeContextVersionKey(const ContextVersionKey& key) {
  std::string out = ContextVersionPrefix(key.tenant, key.profile_id, key.context_key);
  PutU32Big(&out, key.version);
  return out;
}

absl::StatusOr<ContextVersionKey> DecodeContextVersionKey(absl::string_view bytes) {
  Reader r(bytes);
  ContextVersionKey key;
  uint8_t tag = 0;
  uint64_t version = 0;
  if (!r.GetU8(&tag) || tag != kContextVersionKeyTag ||
      !GetScope(&r, &key.tenant, &key.profile_id) || !r.GetShortBytes(&key.context_key) ||
      key.context_key.empty() || r.remaining() != 4) {
    return Loss("context version key", absl::StrCat(bytes.size(), " bytes"));
  }
  for (int i = 0; i < 4; ++i) {
    uint8_t b = 0;
    r.GetU8(&b);
    version = (version << 8) | b;
  }
  key.version = static_cast<uint32_t>(version);
  return key;
}

std::string EncodeContextVersionRecord(const ContextVersionRecord& record) {
  std::string out;
  PutU8(&out, kRecordVersion);
  PutLittle(&out, record.version, 4);
  PutShortBytes(&out, record.context_key);
  PutLittle(&out, record.tokens, 4);
  PutLittle(&out, std::bit_cast<uint32_t>(record.retention), 4);
  PutU8(&out, record.importance);
  PutU8(&out, record.merge);
  PutU8(&out, record.bias);
  PutLittle(&out, record.created_unix_ms, 8);
  PutU8(&out, record.dropped ? 1 : 0);
  PutLittle(&out, record.block_ids.size(), 4);
  for (const std::string& id : record.block_ids) PutShortBytes(&out, id);
  AppendCheck(&out);
  return out;
}

absl::StatusOr<ContextVersionRecord> DecodeContextVersionRecord(absl::string_view bytes) {
  constexpr absl::string_view kWhat = "context version record";
  auto opened = OpenValue(bytes, kWhat);
  if (!opened.ok()) return opened.status();
  Reader& r = *opened;
  ContextVersionRecord v;
  uint32_t retention = 0, count = 0;
  uint8_t flags = 0;
  if (!r.GetU32(&v.version) || !r.GetShortBytes(&v.context_key) || !r.GetU32(&v.tokens) ||
      !r.GetU32(&retention) || !r.GetU8(&v.importance) || !r.GetU8(&v.merge) || !r.GetU8(&v.bias) ||
      !r.GetU64(&v.created_unix_ms) || !r.GetU8(&flags)) {
    return Loss(kWhat, "truncated");
  }
  if (flags > 1) return Loss(kWhat, absl::StrCat("unknown flags ", static_cast<int>(flags)));
  v.retention = std::bit_cast<float>(retention);
  v.dropped = flags == 1;
  if (!r.GetU32(&count) || count > kMaxContextBlocks || count > r.remaining()) {
    return Loss(kWhat, "bad block count");
  }
  v.block_ids.resize(count);
  for (std::string& id : v.block_ids) {
    if (!r.GetShortBytes(&id)) return Loss(kWhat, "truncated block id");
  }
  if (!r.done()) return Loss(kWhat, "trailing bytes");
  absl::Status valid = ValidateContextVersionRecord(v);
  if (!valid.ok()) return Loss(kWhat, valid.message());
  return v;
}

std::string EncodeCompactedSlotsKey(const BlockKey& key) {
  return std::string(1, kCompactedSlotsKeyTag) + EncodeBlockKey(key);
}

absl::StatusOr<BlockKey> DecodeCompactedSlotsKey(absl::string_view bytes) {
  if (bytes.empty() || bytes[0] != kCompactedSlotsKeyTag) {
    return Loss("compacted slots key", "bad tag");
  }
  return DecodeBlockKey(bytes.substr(1));
}

std::string EncodeCompactedSlotsRecord(const CompactedSlotsRecord& record) {
  std::string out;
  PutU8(&out, kRecordVersion);
  PutLittle(&out, record.version, 4);
  PutLittle(&out, record.positions.size(), 4);
  for (int32_t p : record.positions) PutLittle(&out, static_cast<uint32_t>(p), 4);
  PutLittle(&out, record.logit_bias.size(), 4);
  for (float b : record.logit_bias) PutLittle(&out, std::bit_cast<uint32_t>(b), 4);
  PutLittle(&out, record.merged.size(), 4);
  for (uint32_t m : record.merged) PutLittle(&out, m, 4);
  AppendCheck(&out);
  return out;
}

absl::StatusOr<CompactedSlotsRecord> DecodeCompactedSlotsRecord(absl::string_view bytes) {
  constexpr absl::string_view kWhat = "compacted slots record";
  auto opened = OpenValue(bytes, kWhat);
  if (!opened.ok()) return opened.status();
  Reader& r = *opened;
  CompactedSlotsRecord s;
  if (!r.GetU32(&s.version) ||
      !GetArray(&r, &s.positions, [](uint32_t u) { return static_cast<int32_t>(u); }) ||
      !GetArray(&r, &s.logit_bias, [](uint32_t u) { return std::bit_cast<float>(u); }) ||
      !GetArray(&r, &s.merged, [](uint32_t u) { return u; })) {
    return Loss(kWhat, "bad slot array");
  }
  if (!r.done()) return Loss(kWhat, "trailing bytes");
  return s;
}

std::string EncodeU32(uint32_t value) {
  std::string out;
  PutLittle(&out, value, 4);
  return out;
}

std::string EncodeU64(uint64_t value) {
  std::string out;
  PutLittle(&out, value, 8);
  return out;
}

absl::StatusOr<uint32_t> DecodeU32(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes);
  uint32_t v = 0;
  if (!r.GetU32(&v) || !r.done()) return Loss(what, absl::StrCat(bytes.size(), " bytes"));
  return v;
}

absl::StatusOr<uint64_t> DecodeU64(absl::string_view bytes, absl::string_view what) {
  Reader r(bytes);
  uint64_t v = 0;
  if (!r.GetU64(&v) || !r.done()) return Loss(what, absl::StrCat(bytes.size(), " bytes"));
  return v;
}

std::string PrefixSuccessor(absl::string_view prefix) {
  std::string out(prefix);
  while (!out.empty()) {
    if (static_cast<uint8_t>(out.back()) != 0xff) {
      out.back() = static_cast<char>(static_cast<uint8_t>(out.back()) + 1);
      return out;
    }
    out.pop_back();
  }
  return out;
}

}  // namespace kvtier::catalog_format
