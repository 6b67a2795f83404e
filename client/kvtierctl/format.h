// Formatting helpers for kvtierctl's human-readable output.
#ifndef KVTIER_CLIENT_KVTIERCTL_FORMAT_H_
#define KVTIER_CLIENT_KVTIERCTL_FORMAT_H_

#include <cstdint>
#include <string>

namespace kvtier::ctl {

// 0 -> "0 B", 1536 -> "1.5 KiB", 256<<20 -> "256 MiB".
std::string HumanBytes(uint64_t bytes);
// 3725 -> "1h2m5s".
std::string HumanDuration(uint64_t seconds);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_FORMAT_H_
