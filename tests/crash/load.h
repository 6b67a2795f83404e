// Load: the crash loop's mixed workload against one kvtierd life, until
// the daemon is killed.
//
// Threads (each with a Client of its own, i.e. its own connection):
//   * writers (owners 0..writers-1) mix PutBlocks of new ids (durable or
//     not, some retained), identical re-puts of their own ids (also of
//     deleted ones), puts of different bytes under their own retained ids
//     (must be ALREADY_EXISTS), GetBlocks as bytes of their own and
//     anyone's ids, Lookup of their own ids, GetBlocks as device handles
//     read through the mapped arena (then Release), and DeleteBlocks of
//     their own non-retained ids; they also put shared ids (owner
//     writers + 1; identical bytes from several threads at once, never
//     deleted), as engines that share a prompt prefix do;
//   * one engine (owner `writers`) drives a context as an inference engine
//     does: each step puts one block (half through a staging slot, some
//     durable), appends it to its open context (OpenContext for the first
//     one, a new context every kBlocksPerContext blocks) and runs Select
//     on one long-lived stream, reading every RESIDENT handle in the arena.
// Every byte read is compared with Payload(id); every acknowledged outcome
// goes to the Oracle, whose promises are checked on each read (see
// oracle.h). A call that fails after MarkKilled is the kill's: its
// operation becomes uncertain in the Oracle and the thread stops. Any
// other unexpected outcome is logged to the FailureLog and stops the load.
//
// Thread safety: Start, WaitForAcks, MarkKilled and Join are for one
// controlling thread; counters() after Join.
#ifndef KVTIER_TESTS_CRASH_LOAD_H_
#define KVTIER_TESTS_CRASH_LOAD_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/crash/failure_log.h"
#include "tests/crash/oracle.h"

namespace kvtier::crash {

struct LoadOptions {
  std::string socket_path;
  std::string token;        // bearer token of the load's tenant
  uint64_t profile_id = 0;  // CrashProfile(), registered
  int writers = 3;          // the Oracle needs writers + 2 owners (engine, shared ids)
  uint64_t seed = 0;        // with cycle, seeds every thread's choices
  int cycle = 0;            // for messages
};

// What one life of the daemon saw; summed over threads.
struct LoadCounters {
  uint64_t acked_ops = 0;      // calls answered OK (whatever their items said)
  uint64_t blocks_put = 0;     // put items acknowledged OK
  uint64_t durable_puts = 0;   // ... with PutResult.durable
  uint64_t retained_puts = 0;  // ... with PutResult.retained
  uint64_t blocks_read = 0;    // bytes compared with Payload(id)
  uint64_t handles_read = 0;   // device-arena slots compared (GetBlocks, Select)
  uint64_t deletes = 0;        // delete items acknowledged OK
  uint64_t selects = 0;
  uint64_t wrong_puts_refused = 0;  // ALREADY_EXISTS for different bytes
  uint64_t retained_quota_refusals = 0;
  uint64_t full_refusals = 0;   // puts RESOURCE_EXHAUSTED by full tiers
  uint64_t evictions_seen = 0;  // durable blocks their owner read as NOT_FOUND
  // Acknowledged durable blocks their owner's Lookup found present but no
  // longer durable (the NVMe copy was evicted, a host copy stays).
  uint64_t durability_dropped_seen = 0;
  uint64_t ops_in_flight_at_kill = 0;
  uint64_t durable_puts_in_flight_at_kill = 0;  // blocks
  void Add(const LoadCounters& o);
};

class Load {
 public:
  Load(LoadOptions options, Oracle* oracle, FailureLog* failures);
  ~Load();  // Joins

  void Start();
  // Waits until `acks` calls were acknowledged (true), or until the load
  // stopped on a failure, every thread stopped, or `timeout` passed (false).
  bool WaitForAcks(uint64_t acks, std::chrono::milliseconds timeout);
  // Call right before killing the daemon.
  void MarkKilled();
  void Join();
  LoadCounters counters() const;

 private:
  struct Worker;
  void RunWriter(Worker* w);
  void RunEngine(Worker* w);
  // Writer operations; false when the thread must stop.
  bool PutNew(Worker* w);
  bool PutShared(Worker* w);
  bool Reput(Worker* w);
  bool PutWrongBytes(Worker* w);
  bool ReadBytes(Worker* w);
  bool LookupOwn(Worker* w);
  bool ReadHandles(Worker* w);
  bool DeleteSome(Worker* w);
  // Shared by writers and the engine.
  bool PutAndRecord(Worker* w, const std::vector<std::string>& ids, bool durable, bool retain,
                    bool via_slot, std::vector<std::string>* stored);
  // A failed call: returns false. After MarkKilled the kill did it; the
  // operation's ids are handed to `uncertain`. Before: a failure.
  bool CallFailed(Worker* w, const char* call, const std::string& status);
  void Fail(Worker* w, const std::string& what);
  void Acked(Worker* w);
  // Checks one read result of id against Payload(id) and the oracle's
  // facts taken before the call; false on a broken promise.
  bool CheckRead(Worker* w, const char* call, const std::string& id, const BlockFacts& before,
                 int code, const std::string& message, const std::string* data);
  bool CheckArenaSlot(Worker* w, const char* call, const std::string& id, uint64_t arena_id,
                      uint64_t offset_bytes, uint64_t size_bytes);

  const LoadOptions options_;
  Oracle* const oracle_;
  FailureLog* const failures_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::thread> threads_;
  std::atomic<bool> killed_{false};
  std::atomic<bool> stop_{false};

  absl::Mutex mu_;
  uint64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::crash

#endif  // KVTIER_TESTS_CRASH_LOAD_H_
