#include "tests/testutil/tls_certs.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace kvtier::testing {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "tls_certs: %s failed\n", what);
  std::abort();
}

Pkey NewKey() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key == nullptr) Die("EVP_EC_gen");
  return Pkey(key);
}

std::string KeyPem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    Die("PEM_write_bio_PrivateKey");
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

std::string CertPem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (PEM_write_bio_X509(bio, cert) != 1) Die("PEM_write_bio_X509");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

Pkey ParseKey(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (key == nullptr) Die("PEM_read_bio_PrivateKey");
  return Pkey(key);
}

Cert ParseCert(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) Die("PEM_read_bio_X509");
  return Cert(cert);
}

void AddExt(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr || X509_add_ext(cert, ext, -1) != 1) Die("X509_add_ext");
  X509_EXTENSION_free(ext);
}

Cert NewCert(EVP_PKEY* key, const std::string& cn, long not_before_s, long not_after_s) {
  static std::atomic<long> serial{1};
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), not_before_s);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), not_after_s);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

}  // namespace

PemPair MakeCa(const std::string& common_name) {
  Pkey key = NewKey();
  Cert cert = NewCert(key.get(), common_name, -60, 86400);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  AddExt(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE");
  AddExt(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  AddExt(cert.get(), cert.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) Die("X509_sign");
  return {CertPem(cert.get()), KeyPem(key.get())};
}

PemPair IssueCert(const PemPair& ca, const std::string& common_name, long not_before_s,
                  long not_after_s) {
  Pkey ca_key = ParseKey(ca.key);
  Cert ca_cert = ParseCert(ca.cert);
  Pkey key = NewKey();
  Cert cert = NewCert(key.get(), common_name, not_before_s, not_after_s);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
  AddExt(cert.get(), ca_cert.get(), NID_basic_constraints, "CA:FALSE");
  AddExt(cert.get(), ca_cert.get(), NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
  AddExt(cert.get(), ca_cert.get(), NID_ext_key_usage, "serverAuth,clientAuth");
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0) Die("X509_sign");
  return {CertPem(cert.get()), KeyPem(key.get())};
}

bool WriteFile(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return ::close(fd) == 0 && ok;
}

}  // namespace kvtier::testing
