// Streams: the load test's workload, N concurrent client streams against
// one kvtierd, each a thread with a Client (a connection) of its own.
//
//   * engines (streams 0..engines-1) drive a context as an inference engine
//     does: put a prompt (shared_prefix_blocks blocks shared by all engines,
//     put concurrently with identical bytes, then blocks of their own),
//     OpenContext, then every decode step one Select on a long-lived
//     stream, reading every RESIDENT handle through the mapped device
//     arena; every selects_per_block steps a new block is put and
//     AppendBlocks'ed as it completes; after context_blocks blocks the
//     context is closed and a new one opened.
//   * writers (the other streams) mix, by WriterMix weights: PutBlocks of
//     1..4 of their own ids (durable_fraction of them durable, slot_fraction
//     through staging slots), GetBlocks as bytes of their own recent, own
//     and anyone's ids, GetBlocks as device handles read through the arena
//     and then Released, and DeleteBlocks of one own id.
// Each stream cycles through ids_per_stream ids of its own, so the working
// set is streams * ids_per_stream blocks and the tiers, sized far below it,
// evict all the time. A payload is a function of its id (load_block.h):
// every byte read is compared with it; a difference is a mismatch.
//
// Outcomes: NOT_FOUND reads (evicted), RESOURCE_EXHAUSTED items (full or
// fully pinned tiers, staging full) and FAILED_PRECONDITION for contexts
// whose blocks were evicted, deletes of pinned blocks, are expected and
// counted. Anything else -- a failed call, an unexpected code, a response
// of the wrong shape, DATA_LOSS -- is a failure: logged (the first
// kMaxFailureMessages), counted, and the stream carries on.
//
// Thread safety: Start, Stop, Join from one controlling thread;
// calls_done() from any thread; the rest after Join.
#ifndef KVTIER_TESTS_LOAD_STREAMS_H_
#define KVTIER_TESTS_LOAD_STREAMS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tests/load/op_stats.h"

namespace kvtier::load {

// Relative weights of a writer's operations (any non-negative integers,
// not all zero).
struct WriterMix {
  int put = 40, get = 40, handles = 15, del = 5;
};

struct StreamsOptions {
  std::string socket_path;
  std::string token;
  uint64_t profile_id = 0;
  uint64_t block_bytes = 0;
  int streams = 64;
  int engines = 16;
  uint64_t ids_per_stream = 64;  // >= context_blocks + prompt_blocks
  double durable_fraction = 0.2;
  double slot_fraction = 0.25;
  WriterMix mix;
  int selects_per_block = 4;
  int context_blocks = 32;
  int prompt_blocks = 4;  // of which shared_prefix_blocks are shared
  int shared_prefix_blocks = 2;
  uint32_t select_budget_blocks = 4;
  uint32_t lease_ttl_ms = 30000;  // GetBlocks handles, staging slots, contexts
  std::chrono::milliseconds duration{6000};
  uint64_t seed = 0;
};

inline constexpr size_t kMaxFailureMessages = 20;

// Summed over streams.
struct StreamCounters {
  uint64_t blocks_put = 0, durable_puts = 0, slot_puts = 0;
  uint64_t full_refusals = 0;    // put items RESOURCE_EXHAUSTED
  uint64_t staging_full = 0;     // ReserveSlots RESOURCE_EXHAUSTED (put as bytes instead)
  uint64_t blocks_read = 0;      // GetBlocks bytes compared
  uint64_t handles_read = 0;     // arena slots compared (GetBlocks handles, Select)
  uint64_t read_misses = 0;      // NOT_FOUND reads
  uint64_t handles_refused = 0;  // handle items RESOURCE_EXHAUSTED (device fully pinned)
  uint64_t deletes = 0, deletes_pinned = 0;
  uint64_t selects = 0, selected_resident = 0, selected_pending = 0, selected_absent = 0;
  uint64_t contexts_opened = 0, appends = 0;
  uint64_t contexts_evicted = 0;  // OpenContext/AppendBlocks FAILED_PRECONDITION
  uint64_t mismatches = 0;        // bytes read != Payload(id)
  uint64_t failures = 0;          // every other unexpected outcome
  void Add(const StreamCounters& o);
};

class Streams {
 public:
  explicit Streams(StreamsOptions options);
  ~Streams();  // Stops and joins

  // Connects every stream, then starts them; they run for options.duration.
  // False with *error when a Connect fails (nothing is started then).
  bool Start(std::string* error);
  // Asks every stream to stop after its current operation.
  void Stop() { stop_.store(true); }
  void Join();
  uint64_t calls_done() const { return calls_done_.load(std::memory_order_relaxed); }

  // After Join.
  StreamCounters counters() const;
  OpStats MergedStats() const;
  std::vector<std::string> failure_messages() const;

 private:
  struct Worker;
  bool Done() const;
  void RunWriter(Worker* w);
  void RunEngine(Worker* w);
  // Writer operations.
  void PutSome(Worker* w);
  void GetBytes(Worker* w);
  void GetHandles(Worker* w);
  void DeleteOne(Worker* w);
  // Puts ids (bytes or staging slots); *stored gets those acknowledged OK.
  void Put(Worker* w, const std::vector<std::string>& ids, bool durable, bool via_slot,
           std::vector<std::string>* stored);
  // Engine steps; false when the context is gone (closed or never opened).
  bool OpenNewContext(Worker* w);
  void SelectStep(Worker* w);
  void AppendStep(Worker* w);
  void CloseContext(Worker* w);
  // Checks: a read item (code, bytes or nullptr) and an arena slot.
  void CheckRead(Worker* w, const char* call, const std::string& id, int code,
                 const std::string& message, const std::string* data);
  void CheckSlot(Worker* w, const char* call, const std::string& id, uint64_t arena_id,
                 uint64_t offset_bytes, uint64_t size_bytes);
  void Fail(Worker* w, const std::string& what);
  void Mismatch(Worker* w, const std::string& what);
  void Called(Worker* w) { calls_done_.fetch_add(1, std::memory_order_relaxed); }

  const StreamsOptions options_;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> calls_done_{0};

  mutable absl::Mutex mu_;
  std::vector<std::string> failure_messages_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::load

#endif  // KVTIER_TESTS_LOAD_STREAMS_H_
