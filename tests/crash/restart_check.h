// CheckAfterRestart: what a kvtierd restarted on a killed daemon's data
// directory holds, against the Oracle, before any load touches it.
//
// Checked (each broken promise is one FailureLog line naming the cycle and
// the block id in hex):
//   * memory tiers are empty, nothing is quarantined, no checksum failed;
//   * no orphan extents: NVMe used_bytes == NVMe blocks x kBlockBytes, and
//     the NVMe directory holds exactly the tier's files at their size;
//   * no ghosts: every block ListBlocks names is durable, on NVMe, of the
//     load's tenant and profile, allowed by the Oracle (may_exist), and
//     reads back; ListBlocks counts == Stats blocks;
//   * every id the Oracle knows, plus never-put probe ids, is read: bytes
//     equal Payload(id); a listed id is present and an unlisted one is
//     NOT_FOUND (not DATA_LOSS); durable && retained ids are present (and
//     still retained); !may_exist ids are absent;
//   * retained_bytes == retained listed blocks x kBlockBytes <= the quota;
//   * Verify re-reads everything and finds nothing corrupt.
// Then the Oracle is resynchronised to what the daemon holds.
//
// Thread safety: call with no load running.
#ifndef KVTIER_TESTS_CRASH_RESTART_CHECK_H_
#define KVTIER_TESTS_CRASH_RESTART_CHECK_H_

#include <cstdint>
#include <string>

#include "client/client.h"
#include "tests/crash/failure_log.h"
#include "tests/crash/oracle.h"

namespace kvtier::crash {

struct RestartCheckOptions {
  int cycle = 0;
  uint64_t profile_id = 0;
  std::string tenant;  // the load's tenant name
  uint64_t retained_quota_bytes = 0;
  std::string nvme_dir;
  uint32_t nvme_file_count = 0;
  uint64_t nvme_file_size_bytes = 0;
  uint64_t probe_seed = 0;  // picks the never-put probe ids
};

struct RestartFigures {
  uint64_t blocks_listed = 0;      // blocks the daemon holds after the restart
  uint64_t ids_read = 0;           // oracle ids + probes
  uint64_t must_exist = 0;         // acknowledged durable + retained, present
  uint64_t durable_evicted = 0;    // acknowledged durable, not retained, gone
  uint64_t non_durable_kept = 0;   // acknowledged non-durable, present (demoted before the kill)
  uint64_t uncertain_present = 0;  // in flight at the kill, present
  uint64_t uncertain_absent = 0;
  uint64_t retained_blocks = 0;
  void Add(const RestartFigures& o);
};

RestartFigures CheckAfterRestart(Client* client, const RestartCheckOptions& options, Oracle* oracle,
                                 FailureLog* failures);

}  // namespace kvtier::crash

#endif  // KVTIER_TESTS_CRASH_RESTART_CHECK_H_
