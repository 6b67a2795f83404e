// Entry: the in-memory metadata of one stored block (internal to the block
// store). Guarded by the block store's mutex.
#ifndef KVTIER_STORAGE_STORE_ENTRY_H_
#define KVTIER_STORAGE_STORE_ENTRY_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>

#include "storage/catalog/records.h"
#include "storage/host/host_tier.h"
#include "storage/nvme/nvme_tier.h"
#include "storage/tier.h"

namespace kvtier {

struct DeviceSlot {
  uint64_t offset = 0;
  uint64_t size_bytes = 0;
  uint64_t generation = 0;
};

// Where and why a quarantined entry's bad copy was found.
struct QuarantineNote {
  TierId tier = TierId::kNvme;
  std::string location;
  std::string reason;
  int64_t found_micros = 0;
};

struct Entry {
  BlockKey key;
  uint64_t size_bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 of the payload
  int64_t created_micros = 0;
  std::string summary;  // key summary from BlockStoreOptions::summarize

  std::optional<DeviceSlot> device;
  std::optional<HostSlot> host;
  std::optional<NvmeLocation> nvme;
  bool durable = false;      // nvme copy synced and catalog record synced
  bool quarantined = false;  // checksum mismatch seen; never served
  bool retained = false;     // never evicted (the writer asked); only deleted
  bool writing = true;       // put in progress: not yet visible
  bool persisting = false;   // an NVMe write of it is in progress
  // Deferred summary (BlockStoreOptions::defer_summaries): kQueued from an
  // acknowledged put until the summary thread takes it (kComputing), then
  // kNone with the summary set. While not kNone the entry is busy (its
  // host copy stays in place).
  enum class SummaryState : uint8_t { kNone, kQueued, kComputing };
  SummaryState summary_state = SummaryState::kNone;

  std::unique_ptr<QuarantineNote> quarantine;  // set when quarantined in this run

  uint32_t pins = 0;  // leases holding its device copy
  uint32_t busy = 0;  // operations reading/writing its copies right now

  uint64_t last_access_micros = 0;  // monotonic
  // When a selection last wanted it (BlockStore::MarkWanted), monotonic;
  // 0 = never, or the placement policy ignores wants (it keeps this).
  uint64_t last_wanted_micros = 0;
  // Position in the placement policy's per-tier order.
  std::list<Entry*>::iterator order[kNumTiers];
  bool in_order[kNumTiers] = {false, false, false};

  bool Has(TierId tier) const {
    switch (tier) {
      case TierId::kDevice:
        return device.has_value();
      case TierId::kHost:
        return host.has_value();
      case TierId::kNvme:
        return nvme.has_value();
      case TierId::kRemote:
        return false;
    }
    return false;
  }
  int Copies() const { return Has(TierId::kDevice) + Has(TierId::kHost) + Has(TierId::kNvme); }
  std::optional<TierId> Fastest() const {
    for (TierId t : {TierId::kDevice, TierId::kHost, TierId::kNvme}) {
      if (Has(t)) return t;
    }
    return std::nullopt;
  }
};

}  // namespace kvtier

#endif  // KVTIER_STORAGE_STORE_ENTRY_H_
