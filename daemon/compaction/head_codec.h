// Moves one (layer, KV head) of a sequence of block payloads to and from
// fp32 rows, for compaction (daemon/compaction/compactor.h).
//
// Payload layout (index/summary/block_layout.h; a profile's layout comes
// from daemon/convert.h LayoutOf): [layers][k|v][kv_heads][block_size_tokens]
// [head_dim] little-endian fp16, bf16 or fp32. Writing rounds fp32 to the
// nearest representable value (ties to even).
//
// Thread safety: pure functions.
#ifndef KVTIER_DAEMON_COMPACTION_HEAD_CODEC_H_
#define KVTIER_DAEMON_COMPACTION_HEAD_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "index/summary/block_layout.h"

namespace kvtier::daemon {

// One KV head of one layer.
struct KvHead {
  int32_t layer = 0;
  int32_t head = 0;
};

// Copies the keys and values of `which` of every payload, in order, into
// keys and values: [payloads.size() * block_size_tokens][head_dim] each. Every
// payload must be exactly index::PayloadSizeBytes(shape) long.
void GatherHead(const index::BlockLayout& shape, absl::Span<const absl::string_view> payloads,
                KvHead which, float* keys, float* values);

// Rows [0, rows) of a head's keys and values, [rows][head_dim] each.
struct HeadRows {
  const float* keys = nullptr;
  const float* values = nullptr;
  int64_t rows = 0;
};

// Writes `rows` as the tokens of `which`, filling block 0's tokens first.
// payloads must hold ceil(rows.rows / block_size_tokens) strings of
// index::PayloadSizeBytes(shape) each; tokens past rows.rows are left as they are.
void ScatterHead(const index::BlockLayout& shape, KvHead which, const HeadRows& rows,
                 std::vector<std::string>* payloads);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_COMPACTION_HEAD_CODEC_H_
