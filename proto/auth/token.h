// Bearer tokens: how they are made and how the tenants file stores them.
// Shared by the daemon (checking) and kvtierctl (`tenants add`); depends
// only on OpenSSL and abseil strings.
//
// Thread safety: all functions are thread-safe.
#ifndef KVTIER_PROTO_AUTH_TOKEN_H_
#define KVTIER_PROTO_AUTH_TOKEN_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kvtier::auth {

// SHA-256 of the token as 64 lowercase hex digits (the tenants file's
// token_sha256 values).
std::string HashToken(absl::string_view token);

// A new random bearer token: 256 bits from the OpenSSL CSPRNG, 43
// URL-safe base64 characters. Empty only if the CSPRNG fails.
std::string NewToken();

// The tenants file's rules, shared so kvtierctl writes only what the
// daemon loads: a token_sha256 value is 64 lowercase hex digits; a tenant
// name is 1..64 bytes of [A-Za-z0-9._-].
inline constexpr size_t kMaxTenantNameBytes = 64;
bool IsTokenHash(absl::string_view hex);
bool IsTenantName(absl::string_view name);

}  // namespace kvtier::auth

#endif  // KVTIER_PROTO_AUTH_TOKEN_H_
