// Tier identifiers shared by storage, the daemon and the admin tools.
#ifndef KVTIER_STORAGE_TIER_H_
#define KVTIER_STORAGE_TIER_H_

#include <cstdint>
#include <string_view>

namespace kvtier {

// Ordered fastest first; demotion moves a block to the next larger value.
// kRemote is the shared tier on a Redis Cluster (storage/remote/); it is
// outside kNumTiers, which counts the local tiers every per-tier array is
// sized by: only reads report it (the tier a block was served from).
enum class TierId : uint8_t { kDevice = 0, kHost = 1, kNvme = 2, kRemote = 3 };
inline constexpr int kNumTiers = 3;

// "device", "host" or "nvme". Thread-safe.
std::string_view TierName(TierId tier);

}  // namespace kvtier

#endif  // KVTIER_STORAGE_TIER_H_
