// Saved queries, keys and values of one sequence (a realkv dump), and a
// synthetic generator with the same shape for quick runs and tests.
//
// Tensors (safetensors, see safetensors.h and the data README):
//   tokens  I32 [T]
//   q       F16 [layers][q_heads][T][head_dim]   after rotary embedding
//   k       F16 [layers][kv_heads][T][head_dim]  after rotary embedding
//   v       F16 [layers][kv_heads][T][head_dim]
// Query head h reads KV head h / (q_heads / kv_heads). The shapes must agree
// with each other and with the metadata (layers, q_heads, kv_heads,
// head_dim, seq_len) when the metadata gives them.
//
// Thread safety: plain values; the functions are pure (file reads aside).
#ifndef KVTIER_BENCH_QUALITY_KV_DUMP_H_
#define KVTIER_BENCH_QUALITY_KV_DUMP_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/quality/safetensors.h"

namespace kvtier::quality {

inline constexpr int64_t kMaxDumpTokens = int64_t{1} << 20;

struct KvDump {
  std::string name;  // file stem, e.g. "rk-persuasion-recall-00"
  std::string kind;  // name without a trailing "-NN", e.g. "rk-persuasion-recall"
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> tokens;  // [T]
  std::vector<float> q;         // [L][Hq][T][D]
  std::vector<float> k;         // [L][Hkv][T][D]
  std::vector<float> v;         // [L][Hkv][T][D]
  std::map<std::string, std::string> metadata;

  int32_t group_size() const { return num_q_heads / num_kv_heads; }
  const float* Q(int32_t l, int32_t h, int64_t t) const {
    return &q[((static_cast<size_t>(l) * num_q_heads + h) * seq_len + t) * head_dim];
  }
  const float* K(int32_t l, int32_t h, int64_t t) const {
    return &k[((static_cast<size_t>(l) * num_kv_heads + h) * seq_len + t) * head_dim];
  }
  const float* V(int32_t l, int32_t h, int64_t t) const {
    return &v[((static_cast<size_t>(l) * num_kv_heads + h) * seq_len + t) * head_dim];
  }
};

// "dir/rk-x-recall-03.safetensors" -> name "rk-x-recall-03",
// kind "rk-x-recall".
std::string DumpName(const std::string& path);
std::string DumpKind(const std::string& name);

// Validates and converts a parsed file. InvalidArgument naming the tensor
// or metadata field that disagrees.
absl::StatusOr<KvDump> KvDumpFromSafetensors(const SafetensorsFile& file, const std::string& name);
absl::StatusOr<KvDump> LoadKvDump(const std::string& path);

// Keeps the first `tokens` positions (all layers and heads).
// InvalidArgument when tokens is not in [1, seq_len].
absl::StatusOr<KvDump> TruncateDump(const KvDump& dump, int64_t tokens);

// Serialises a dump with q, k, v in F16 (values are rounded).
absl::StatusOr<std::string> SerializeKvDump(const KvDump& dump);

// A synthetic sequence with the structures real attention shows: a sink
// (token 0 draws attention from every query), local heads (a positional
// rotation favours recent keys), topic runs (keys of a run share a topic
// direction that queries of the same run also carry) and, in "recall" mode,
// a passage (first quarter) repeated in the last quarter whose queries point
// at the first occurrence.
struct SyntheticDumpOptions {
  int32_t num_layers = 2;
  int32_t num_q_heads = 4;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 32;
  int64_t seq_len = 512;
  bool recall = true;
  int32_t topic_run_tokens = 64;
  uint64_t seed = 1;
};
absl::StatusOr<KvDump> MakeSyntheticDump(const SyntheticDumpOptions& options);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_KV_DUMP_H_
