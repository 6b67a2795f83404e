#ifndef KVTIER_DAEMON_VERSION_H_
#define KVTIER_DAEMON_VERSION_H_

namespace kvtier {
// Set by CMake from project(VERSION).
inline constexpr const char kVersion[] = KVTIER_VERSION_STRING;
}  // namespace kvtier

#endif  // KVTIER_DAEMON_VERSION_H_
