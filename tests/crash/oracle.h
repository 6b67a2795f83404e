// Oracle: what kvtierd acknowledged about every block id the crash loop
// used, and what was in flight when it was killed.
//
// Ownership: ids are made by BlockId(owner, seq); only the load thread
// `owner` puts or deletes its ids, so its own operations on an id are
// sequential and its view of that id is exact between calls. Any thread
// may read any id. One owner index may instead stand for shared ids, which
// every thread puts (concurrently, as engines put a common prefix) and
// nobody deletes; their facts come from whichever acknowledgement was
// recorded last, which can only under-state what the daemon promised.
//
// Facts per id:
//   may_exist  a put was acknowledged, or was in flight at a kill, since the
//              id was last known absent (never put, acknowledged delete, a
//              NOT_FOUND read by its owner, a restart check that found it
//              absent). False: every read of it must be NOT_FOUND.
//   durable    the last acknowledged put reported PutResult.durable (a
//              synced NVMe copy and catalog record) and no delete was
//              acknowledged or in flight since. A non-retained block may
//              have been evicted since; a retained one stays durable.
//   retained   the last acknowledged put reported PutResult.retained and no
//              delete was acknowledged or in flight since (the load never
//              deletes a retained block, so the retained set only grows,
//              until a crash takes retained blocks that were not yet
//              durable).
//   uncertain  an operation on it was in flight at the last kill.
// What the facts promise (checked by load.cc and restart_check.cc):
//   * while one daemon runs: retained -> present; !may_exist (owner's view)
//     -> NOT_FOUND;
//   * after a restart: durable && retained -> present and exact; durable
//     alone -> present or evicted; !may_exist -> NOT_FOUND;
//   * whatever is returned for id is Payload(id).
//
// Thread safety: all methods may be called concurrently (one mutex).
#ifndef KVTIER_TESTS_CRASH_ORACLE_H_
#define KVTIER_TESTS_CRASH_ORACLE_H_

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::crash {

struct BlockFacts {
  uint8_t owner = 0;
  bool may_exist = false;
  bool durable = false;
  bool retained = false;
  bool uncertain = false;
};

class Oracle {
 public:
  // owners: load threads 0..owners-1 (at most 255).
  explicit Oracle(int owners);

  // The owner's next id, registered as never put.
  std::string NewId(uint8_t owner);
  // The facts of a registered id (default facts for an unknown one).
  BlockFacts Facts(const std::string& id) const;

  // Random choices for the load; nullopt when there is none.
  // An id of `owner` that may exist, retained or not as asked.
  std::optional<std::string> PickLive(uint8_t owner, bool retained, std::mt19937_64& rng) const;
  // Any id of `owner`, present or not.
  std::optional<std::string> PickOwn(uint8_t owner, std::mt19937_64& rng) const;
  // One of the `recent` newest ids of `owner`.
  std::optional<std::string> PickRecent(uint8_t owner, size_t recent, std::mt19937_64& rng) const;
  // Any registered id.
  std::optional<std::string> PickAny(std::mt19937_64& rng) const;

  // Outcomes, reported by the id's owner (by any thread for shared ids).
  void PutAcked(const std::string& id, bool durable, bool retained);
  void PutUncertain(const std::string& id);
  void DeleteAcked(const std::string& id);
  void DeleteUncertain(const std::string& id);
  // The owner read it as NOT_FOUND (the caller checked that it was allowed).
  void ObservedAbsent(const std::string& id);
  // After a restart check: what the daemon holds now (present: read back
  // exactly; retained: as ListBlocks reports it). Clears uncertain.
  void Resync(const std::string& id, bool present, bool retained);

  std::vector<std::pair<std::string, BlockFacts>> Snapshot() const;
  size_t size() const;

 private:
  // Ids with O(1) insert, erase and random pick.
  class IdSet {
   public:
    void Insert(const std::string& id);
    void Erase(const std::string& id);
    std::optional<std::string> Pick(std::mt19937_64& rng) const;

   private:
    std::vector<std::string> ids_;
    absl::flat_hash_map<std::string, size_t> index_;
  };
  struct Owner {
    uint64_t next_seq = 0;
    std::vector<std::string> all;
    IdSet live_plain;     // may_exist && !retained
    IdSet live_retained;  // may_exist && retained
  };
  // Moves id between its owner's live sets after its facts changed.
  void PlaceLocked(const std::string& id, const BlockFacts& before, const BlockFacts& after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  template <typename Fn>
  void UpdateLocked(const std::string& id, Fn fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<Owner> owners_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> all_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, BlockFacts> facts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::crash

#endif  // KVTIER_TESTS_CRASH_ORACLE_H_
