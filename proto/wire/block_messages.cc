#include "proto/wire/block_messages.h"

#include "absl/strings/str_cat.h"

namespace kvtier::wire {
namespace {

// PutBlocksRequest, BlockPut, SlotRef (kvtier.proto, types.proto).
constexpr uint32_t kPutProfileId = 1, kPutBlocks = 2, kPutDurable = 3, kPutRetain = 4;
constexpr uint32_t kBlockId = 1, kBlockData = 2, kBlockSlot = 3, kBlockXxh3 = 4;
// GetBlocksResponse, BlockResult, ItemStatus.
constexpr uint32_t kGetResults = 1, kGetLeaseId = 2;
constexpr uint32_t kResultBlockId = 1, kResultStatus = 2, kResultTier = 3, kResultData = 4,
                   kResultHandle = 5, kResultCompacted = 6;
constexpr uint32_t kStatusCode = 1, kStatusMessage = 2;
constexpr uint64_t kMaxStatusMessageBytes = 64 << 10;

// A known field must come with its own wire type (libprotobuf would keep a
// mismatched one as an unknown field; kvtier refuses the message instead).
bool ExpectType(PieceReader& r, WireType got, WireType want, const std::string& name) {
  if (got == want) return true;
  return r.Fail(absl::StrCat(name, ": wire type ", static_cast<int>(got), ", expected ",
                             static_cast<int>(want)));
}

// Runs `body(field, type)` for every field of the length-delimited message
// that starts at the reader's position.
template <typename Body>
bool ForEachField(PieceReader& r, Body body) {
  while (!r.AtLimit()) {
    uint32_t field = 0;
    WireType type = kVarint;
    if (!r.ReadKey(&field, &type)) return false;
    if (!body(field, type)) return false;
  }
  return true;
}

template <typename Body>
bool Nested(PieceReader& r, Body body) {
  uint64_t length = 0;
  if (!r.ReadLength(&length)) return false;
  const uint64_t outer = r.PushLimit(length);
  const bool ok = ForEachField(r, body);
  r.PopLimit(outer);
  return ok;
}

bool ParseSlot(PieceReader& r, const std::string& name, SlotRefFields* slot) {
  return Nested(r, [&](uint32_t field, WireType type) {
    uint64_t* target = nullptr;
    switch (field) {
      case 1:
        target = &slot->slot_id;
        break;
      case 2:
        target = &slot->offset_bytes;
        break;
      case 3:
        target = &slot->size_bytes;
        break;
      case 4:
        target = &slot->generation;
        break;
      default:
        return r.SkipValue(type);
    }
    return ExpectType(r, type, kVarint, name) && r.ReadVarint(target);
  });
}

bool ParseBlockPut(PieceReader& r, const std::string& name, BlockPutView* b) {
  return Nested(r, [&](uint32_t field, WireType type) {
    uint64_t length = 0;
    switch (field) {
      case kBlockId:
        return ExpectType(r, type, kLengthDelimited, name + ".block_id") && r.ReadLength(&length) &&
               r.ReadString(length, kMaxCopiedFieldBytes, "block_id", &b->block_id);
      case kBlockData:
        if (!ExpectType(r, type, kLengthDelimited, name + ".data") || !r.ReadLength(&length)) {
          return false;
        }
        b->source = BlockPutView::Source::kData;
        b->slot = SlotRefFields{};
        b->data.clear();
        b->data_size = length;
        return r.ReadRanges(length, &b->data);
      case kBlockSlot:
        if (!ExpectType(r, type, kLengthDelimited, name + ".slot")) return false;
        if (b->source != BlockPutView::Source::kSlot) {
          b->source = BlockPutView::Source::kSlot;
          b->slot = SlotRefFields{};
          b->data.clear();
          b->data_size = 0;
        }
        return ParseSlot(r, name + ".slot", &b->slot);
      case kBlockXxh3:
        return ExpectType(r, type, kVarint, name + ".xxh3") && r.ReadVarint(&b->xxh3);
      default:
        return r.SkipValue(type);
    }
  });
}

}  // namespace

absl::Status ParsePutBlocks(absl::Span<const Bytes> pieces, uint64_t max_blocks,
                            const char* limit_name, PutBlocksView* out) {
  *out = PutBlocksView{};
  PieceReader r(pieces);
  const bool ok = ForEachField(r, [&](uint32_t field, WireType type) {
    uint64_t v = 0;
    switch (field) {
      case kPutProfileId:
        return ExpectType(r, type, kVarint, "profile_id") && r.ReadVarint(&out->profile_id);
      case kPutDurable:
        if (!ExpectType(r, type, kVarint, "durable") || !r.ReadVarint(&v)) return false;
        out->durable = v != 0;
        return true;
      case kPutRetain:
        if (!ExpectType(r, type, kVarint, "retain") || !r.ReadVarint(&v)) return false;
        out->retain = v != 0;
        return true;
      case kPutBlocks: {
        const std::string name = absl::StrCat("blocks[", out->blocks.size(), "]");
        if (!ExpectType(r, type, kLengthDelimited, name)) return false;
        if (out->blocks.size() >= max_blocks) {
          return r.Fail(
              absl::StrCat("blocks: more than ", limit_name, " = ", max_blocks, " in one message"));
        }
        return ParseBlockPut(r, name, &out->blocks.emplace_back());
      }
      default:
        return r.SkipValue(type);
    }
  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("not a PutBlocksRequest: ", r.error().message()));
}

std::string PutBlocksHead(uint64_t profile_id, bool durable, bool retain) {
  std::string out;
  AppendVarintField(kPutProfileId, profile_id, &out);
  AppendVarintField(kPutDurable, durable ? 1 : 0, &out);
  AppendVarintField(kPutRetain, retain ? 1 : 0, &out);
  return out;
}

std::string BlockPutHead(std::string_view block_id, uint64_t xxh3, uint64_t data_size) {
  std::string inner;
  AppendBytesField(kBlockId, block_id, &inner);
  AppendVarintField(kBlockXxh3, xxh3, &inner);
  // proto3 writes an empty bytes field of a oneof too: it says which member
  // is set.
  AppendLengthKey(kBlockData, data_size, &inner);
  std::string out;
  AppendLengthKey(kPutBlocks, inner.size() + data_size, &out);
  out += inner;
  return out;
}

absl::Status ParseGetBlocksResponse(absl::Span<const Bytes> pieces, GetBlocksView* out) {
  PieceReader r(pieces);
  const bool ok = ForEachField(r, [&](uint32_t field, WireType type) {
    if (field == kGetLeaseId) {
      return ExpectType(r, type, kVarint, "lease_id") && r.ReadVarint(&out->lease_id);
    }
    if (field != kGetResults) return r.SkipValue(type);
    const std::string name = absl::StrCat("results[", out->results.size(), "]");
    if (!ExpectType(r, type, kLengthDelimited, name)) return false;
    BlockResultView& b = out->results.emplace_back();
    return Nested(r, [&](uint32_t f, WireType t) {
      uint64_t length = 0, v = 0;
      switch (f) {
        case kResultBlockId:
          return ExpectType(r, t, kLengthDelimited, name + ".block_id") && r.ReadLength(&length) &&
                 r.ReadString(length, kMaxCopiedFieldBytes, "block_id", &b.block_id);
        case kResultStatus:
          if (!ExpectType(r, t, kLengthDelimited, name + ".status")) return false;
          return Nested(r, [&](uint32_t sf, WireType st) {
            if (sf == kStatusCode) {
              if (!ExpectType(r, st, kVarint, name + ".status.code") || !r.ReadVarint(&v)) {
                return false;
              }
              b.status_code = static_cast<int32_t>(v);
              return true;
            }
            if (sf == kStatusMessage) {
              return ExpectType(r, st, kLengthDelimited, name + ".status.message") &&
                     r.ReadLength(&length) &&
                     r.ReadString(length, kMaxStatusMessageBytes, "status.message",
                                  &b.status_message);
            }
            return r.SkipValue(st);
          });
        case kResultTier:
          if (!ExpectType(r, t, kVarint, name + ".tier") || !r.ReadVarint(&v)) return false;
          b.tier = static_cast<int32_t>(v);
          return true;
        case kResultData:
          if (!ExpectType(r, t, kLengthDelimited, name + ".data") || !r.ReadLength(&length)) {
            return false;
          }
          b.data.clear();
          b.data_size = length;
          return r.ReadRanges(length, &b.data);
        case kResultHandle:
        case kResultCompacted:
          (f == kResultHandle ? b.has_handle : b.has_compacted) = true;
          return r.SkipValue(t);
        default:
          return r.SkipValue(t);
      }
    });
  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("not a GetBlocksResponse: ", r.error().message()));
}

}  // namespace kvtier::wire
