// Process-wide logging set-up (spdlog to stderr, which journald captures).
#ifndef KVTIER_DAEMON_LOGGING_H_
#define KVTIER_DAEMON_LOGGING_H_

#include <string>

#include "daemon/config.h"

namespace kvtier::daemon {

// level: trace..off (log.level; an unknown one falls back to info); format:
// kText (timestamp level message) or kJson (one object per line with time,
// level, msg; msg JSON-escaped). Call once from main before other threads
// log.
void InitLogging(const std::string& level, LogFormat format);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_LOGGING_H_
