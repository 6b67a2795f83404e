// Process-wide logging set-up (spdlog to stderr, which journald captures).
#ifndef KVTIER_DAEMON_LOGGING_H_
#define KVTIER_DAEMON_LOGGING_H_

#include <string>

namespace kvtier::daemon {

// level: trace..off; format: "text" (timestamp level message) or "json" (one
// object per line with time, level, msg; msg JSON-escaped). Call once from
// main before other threads log. Unknown values fall back to info/text.
void InitLogging(const std::string& level, const std::string& format);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_LOGGING_H_
