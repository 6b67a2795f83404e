// Test certificates made in memory with OpenSSL: a CA, and certificates it
// issues (server or client) with a chosen common name and validity window.
// For TLS and mTLS tests only; keys are EC P-256, signatures SHA-256.
//
// Thread safety: free functions, no shared state.
#ifndef KVTIER_TESTS_TESTUTIL_TLS_CERTS_H_
#define KVTIER_TESTS_TESTUTIL_TLS_CERTS_H_

#include <string>

namespace kvtier::testing {

struct PemPair {
  std::string cert;  // PEM certificate
  std::string key;   // PEM private key (PKCS#8)
};

// A self-signed CA named `common_name`, valid from now for a day.
PemPair MakeCa(const std::string& common_name);

// A certificate for `common_name` signed by `ca`, valid from
// now + not_before_s to now + not_after_s (negative: in the past). The
// subject alternative names are DNS:localhost and IP:127.0.0.1, so a server
// certificate verifies for either.
PemPair IssueCert(const PemPair& ca, const std::string& common_name, long not_before_s = -60,
                  long not_after_s = 86400);

// Writes `text` to `path` (mode 0600); false on failure.
bool WriteFile(const std::string& path, const std::string& text);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTUTIL_TLS_CERTS_H_
