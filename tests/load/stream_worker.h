// Streams::Worker: one stream's state, shared by streams.cc (common parts,
// writers) and engine.cc. Internal to tests/load.
//
// Thread safety: owned and used by its stream's thread only (the
// controlling thread reads counters and stats after Join).
#ifndef KVTIER_TESTS_LOAD_STREAM_WORKER_H_
#define KVTIER_TESTS_LOAD_STREAM_WORKER_H_

#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/shm/shm_mapping.h"
#include "tests/load/load_block.h"
#include "tests/load/op_stats.h"
#include "tests/load/streams.h"

namespace kvtier::load {

// google.rpc.Code values in ItemStatus.code.
inline constexpr int kOk = 0, kNotFound = 5, kAlreadyExists = 6, kResourceExhausted = 8,
                     kFailedPrecondition = 9;
inline constexpr size_t kRecentIds = 16;  // a writer's recent puts, read back first
inline constexpr std::chrono::seconds kCallTimeout{30};

struct Streams::Worker {
  uint32_t stream = 0;
  bool engine = false;
  std::string name;  // "engine 3", "writer 17"
  std::mt19937_64 rng;
  std::unique_ptr<Client> client;
  std::unique_ptr<client::ShmArenaView> arena;
  uint64_t arena_id = 0;
  std::unique_ptr<client::ShmStagingFile> staging;
  OpStats stats;
  StreamCounters counters;
  std::deque<std::string> recent;  // writers: own ids acknowledged lately
  uint64_t next_seq = 0;           // engines: own ids are taken in turn

  // Engines: the Select stream (reopened if it breaks) and the context.
  std::unique_ptr<grpc::ClientContext> select_ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SelectRequest, v1::SelectResponse>> select;
  uint64_t request_id = 0;
  uint64_t context_id = 0;
  std::vector<std::string> context_ids;  // position -> block id
  int steps = 0;                         // Selects on the current context
  int appends_tried = 0;                 // on the current context

  bool Coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
  uint64_t UniformSeq(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); }
  // A writer's read: half go to what it put lately (mostly still cached),
  // a quarter to any of its ids, a quarter to any stream's (stream
  // `streams` holds the engines' shared prefixes).
  std::string PickReadId(int streams, uint64_t ids_per_stream) {
    const int r = Uniform(0, 3);
    if (r < 2 && !recent.empty()) return recent[UniformSeq(recent.size())];
    const uint32_t s = r == 2 ? stream : static_cast<uint32_t>(Uniform(0, streams));
    return BlockId(s, UniformSeq(ids_per_stream));
  }
};

inline void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
}

}  // namespace kvtier::load

#endif  // KVTIER_TESTS_LOAD_STREAM_WORKER_H_
