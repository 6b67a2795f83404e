// Moves one (layer, KV head) of a sequence of block payloads to and from
// fp32 rows, for compaction (daemon/compaction/compactor.h).
//
// Payload layout (storage/catalog/records.h, BlockLayout
// kLayerKvHeadTokenDim): [layers][k|v][kv_heads][block_size_tokens][head_dim]
// little-endian fp16, bf16 or fp32. Writing rounds fp32 to the nearest
// representable value (ties to even).
//
// Thread safety: pure functions.
#ifndef KVTIER_DAEMON_COMPACTION_HEAD_CODEC_H_
#define KVTIER_DAEMON_COMPACTION_HEAD_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "storage/catalog/records.h"

namespace kvtier::daemon {

struct HeadShape {
  int32_t layers = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 0;
  KvDtype dtype = KvDtype::kFp16;

  static HeadShape Of(const ModelProfile& profile);
  int64_t block_bytes() const;
};

// One KV head of one layer.
struct KvHead {
  int32_t layer = 0;
  int32_t head = 0;
};

// Copies the keys and values of `which` of every payload, in order, into
// keys and values: [payloads.size() * block_tokens][head_dim] each. Every
// payload must be exactly shape.block_bytes() long.
void GatherHead(const HeadShape& shape, absl::Span<const absl::string_view> payloads, KvHead which,
                float* keys, float* values);

// Rows [0, rows) of a head's keys and values, [rows][head_dim] each.
struct HeadRows {
  const float* keys = nullptr;
  const float* values = nullptr;
  int64_t rows = 0;
};

// Writes `rows` as the tokens of `which`, filling block 0's tokens first.
// payloads must hold ceil(rows.rows / block_tokens) strings of
// shape.block_bytes() each; tokens past rows.rows are left as they are.
void ScatterHead(const HeadShape& shape, KvHead which, const HeadRows& rows,
                 std::vector<std::string>* payloads);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_COMPACTION_HEAD_CODEC_H_
