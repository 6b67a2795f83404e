// Formatting helpers for kvtierctl's human-readable output.
#ifndef KVTIER_CLIENT_KVTIERCTL_FORMAT_H_
#define KVTIER_CLIENT_KVTIERCTL_FORMAT_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "kvtier/v1/types.pb.h"

namespace google::protobuf {
class Message;
}

namespace kvtier::ctl {

// 0 -> "0 B", 1536 -> "1.5 KiB", 256<<20 -> "256 MiB".
std::string HumanBytes(uint64_t bytes);
// 3725 -> "1h2m5s".
std::string HumanDuration(uint64_t seconds);
// "device", "host", "nvme" or "?".
const char* TierLabel(v1::Tier tier);
// Pretty JSON with proto field names and default values; returns the exit
// code (0, or 1 after printing why to err).
// Block ids (fields block_id, block_ids, *_block_ids) are written in hex,
// like every table of the CLI, not in protobuf's base64.
int PrintJson(const google::protobuf::Message& message, std::ostream& out, std::ostream& err);
// The same on one line (for newline-delimited streams such as `top --json`).
int PrintJsonCompact(const google::protobuf::Message& message, std::ostream& out,
                     std::ostream& err);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_FORMAT_H_
