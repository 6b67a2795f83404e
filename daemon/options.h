// The options of the daemon's parts, derived from its Config in one place,
// so that tools replaying the daemon's behaviour (the quality harness) build
// exactly what kvtierd builds from the same configuration.
//
// Thread safety: pure functions.
#ifndef KVTIER_DAEMON_OPTIONS_H_
#define KVTIER_DAEMON_OPTIONS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/context_manager.h"
#include "daemon/summarizer.h"
#include "index/select/scorer.h"
#include "index/select/selector.h"
#include "storage/remote/remote_store.h"

namespace kvtier::daemon {

SummarizerOptions SummarizerOptionsOf(const Config& config);
// With tiers.device.backend auto or cuda the options carry a GPU level
// scorer factory (index/select/gpu_scoring.h; the CPU scores when it fails).
index::SelectorOptions SelectorOptionsOf(const Config& config);
// store-independent parts of the context manager's options.
ContextManagerOptions ContextManagerOptionsOf(const Config& config);

// Bit (1 << ScorerKind) set for every scorer in select.stability_scorers.
uint32_t StabilityScorersOf(const Config& config);

// Threads that store the blocks of one PutBlocks message:
// server.put_parallelism, or min(4, cores) when it is 0.
size_t PutParallelismOf(const Config& config);

// tiers.remote.*: the seeds split on commas, the password read from
// password_file (its first line; INVALID_ARGUMENT naming the key when it
// cannot be read or is empty). Warnings go to spdlog.
absl::StatusOr<remote::RemoteTierOptions> RemoteOptionsOf(const Config& config);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_OPTIONS_H_
