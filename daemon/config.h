// kvtierd configuration: embedded defaults (deploy/kvtierd.toml compiled in),
// an optional TOML file on top, then command-line overrides, then
// validation. Every error message names the offending key.
//
// Every field's initialiser is its embedded default (the value
// --print-default-config shows after loading; ConfigTest.
// StructInitialisersEqualTheEmbeddedDefaults checks each key), so a Config
// built in code is the shipped daemon's.
//
// Thread safety: a Config is a plain value; load once at start-up, then
// share it read-only.
#ifndef KVTIER_DAEMON_CONFIG_H_
#define KVTIER_DAEMON_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/select/scorer.h"

namespace kvtier::daemon {

// The enum-valued keys, parsed once at load into these (ConfigEnumNames
// lists each value's TOML name; --print-default-config writes the names).
enum class LogFormat : uint8_t { kText, kJson };                   // log.format
enum class DeviceBackendSetting : uint8_t { kAuto, kCuda, kShm };  // tiers.device.backend
enum class PublishPolicySetting : uint8_t {
  kWriteThrough,
  kWriteBack
};  // tiers.remote.publish_policy
enum class PlacementSetting : uint8_t { kStability, kKeyDiff, kLru };  // tiers.placement
enum class SummaryEncodingSetting : uint8_t { kFp16, kFp32 };          // index.summary_encoding
enum class LayerEncodingSetting : uint8_t { kInt8, kFloat };      // index.summary_layer_encoding
enum class SelectAlgorithmSetting : uint8_t { kDescent, kGemm };  // select.algorithm

template <typename E>
struct EnumName {
  absl::string_view name;
  E value;
};
inline constexpr EnumName<LogFormat> kLogFormatNames[] = {{"text", LogFormat::kText},
                                                          {"json", LogFormat::kJson}};
inline constexpr EnumName<DeviceBackendSetting> kDeviceBackendNames[] = {
    {"auto", DeviceBackendSetting::kAuto},
    {"cuda", DeviceBackendSetting::kCuda},
    {"shm", DeviceBackendSetting::kShm}};
inline constexpr EnumName<PublishPolicySetting> kPublishPolicyNames[] = {
    {"write-through", PublishPolicySetting::kWriteThrough},
    {"write-back", PublishPolicySetting::kWriteBack}};
inline constexpr EnumName<PlacementSetting> kPlacementNames[] = {
    {"stability", PlacementSetting::kStability},
    {"keydiff", PlacementSetting::kKeyDiff},
    {"lru", PlacementSetting::kLru}};
inline constexpr EnumName<SummaryEncodingSetting> kSummaryEncodingNames[] = {
    {"fp16", SummaryEncodingSetting::kFp16}, {"fp32", SummaryEncodingSetting::kFp32}};
inline constexpr EnumName<LayerEncodingSetting> kLayerEncodingNames[] = {
    {"int8", LayerEncodingSetting::kInt8}, {"float", LayerEncodingSetting::kFloat}};
inline constexpr EnumName<SelectAlgorithmSetting> kSelectAlgorithmNames[] = {
    {"descent", SelectAlgorithmSetting::kDescent}, {"gemm", SelectAlgorithmSetting::kGemm}};

// The TOML name of `value` in `names` ("" if absent, which a loaded Config
// never holds).
template <typename E, size_t N>
constexpr absl::string_view NameOf(const EnumName<E> (&names)[N], E value) {
  for (const EnumName<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return {};
}

struct Config {
  struct Server {
    std::string data_dir = "./var/kvtier";
    std::string socket_path = "./var/kvtier/kvtierd.sock";  // resolved: never empty after Load()
    uint32_t socket_mode = 0660;
    std::string tcp_address;         // empty = TCP off; requires tls_cert_file
    std::string tls_cert_file;       // PEM chain of the TCP listener
    std::string tls_key_file;        // PEM private key of tls_cert_file
    std::string tls_client_ca_file;  // set: mTLS, client certs verified against it
    uint64_t max_message_bytes = uint64_t{64} << 20;
    uint64_t shutdown_grace_ms = 5000;
    uint64_t max_concurrent_streams = 1024;
    uint64_t max_connections = 4096;                // gRPC connections of the Unix sockets, in all
    uint64_t max_connections_per_uid = 1024;        // ... of one peer uid (SO_PEERCRED)
    uint64_t max_pending_connections = 256;         // per socket, accepted but silent so far
    uint64_t max_tcp_connections = 1024;            // TCP connections (daemon/net/tcp_front.h)
    uint64_t max_tcp_connections_per_address = 64;  // ... from one peer IP address
    uint64_t connection_setup_ms = 2000;            // first bytes (or TLS handshake) within
    uint64_t connection_idle_ms = 600000;           // no call for this long: closed; 0 = never
    bool reflection = false;                        // the gRPC reflection service
    uint64_t max_streams_per_tenant = 256;          // open streaming calls of one tenant
    uint64_t max_streams = 4096;                    // ... of the daemon
    uint64_t stream_write_timeout_ms = 30000;       // an unread write is cancelled after
    // unread GetBlocks bytes of one tenant
    uint64_t max_queued_bytes_per_tenant = uint64_t{256} << 20;
    uint64_t max_queued_bytes = uint64_t{1} << 30;  // ... of the daemon
    uint64_t io_threads = 4;                        // 0: block I/O inline on gRPC threads
    uint64_t io_queue_limit = 4096;                 // calls waiting for an I/O thread
    uint64_t io_queue_limit_per_tenant = 0;         // 0: io_queue_limit / 4
    uint64_t io_threads_per_tenant = 0;             // 0: io_threads - 1 with auth on
    uint64_t put_parallelism = 0;  // threads storing one PutBlocks message; 0 = min(4, cores)
    bool defer_summaries = true;   // non-durable puts acknowledge before their summary
  } server;
  // metrics.*: the Prometheus endpoint (daemon/metrics/http_listener.h).
  struct Metrics {
    std::string listen_address;  // "" = off; "HOST:PORT" or ":PORT" (loopback)
  } metrics;
  // auth.*: tenants (daemon/auth/tenants.h). tenants_file empty = off.
  struct Auth {
    std::string tenants_file;
    std::string shm_dir;  // "" = a per-daemon directory in tiers.device.shm_dir
    std::string fd_socket_path =
        "./var/kvtier/kvtierd.sock.fd";  // resolved: never empty after Load()
    std::string peer_socket_path;        // "" = off; SO_PEERCRED uid -> tenant
    uint64_t tenant_arena_bytes = uint64_t{256} << 20;
    uint64_t tenant_staging_bytes = uint64_t{64} << 20;
    uint64_t tenant_max_leases = 4096;  // per tenant without a leases quota; 0 = none
  } auth;
  struct Log {
    std::string level = "info";
    LogFormat format = LogFormat::kText;
  } log;
  struct Device {
    DeviceBackendSetting backend = DeviceBackendSetting::kAuto;
    uint64_t capacity_bytes = uint64_t{256} << 20;
    std::string shm_dir = "/dev/shm";
  } device;
  struct Host {
    uint64_t capacity_bytes = uint64_t{1} << 30;
    std::string shm_dir = "/dev/shm";
    uint64_t staging_bytes = uint64_t{256} << 20;
    uint64_t max_in_flight_get_bytes = 0;  // 0 = capacity_bytes / 4
    bool prefault = true;
  } host;
  struct Nvme {
    std::string dir = "./var/kvtier/nvme";  // resolved: never empty after Load()
    uint64_t file_count = 4;
    uint64_t file_size_bytes = uint64_t{512} << 20;
    bool direct_io = true;
    uint64_t io_threads = 2;
    uint64_t queue_depth = 64;
    bool write_through = false;
  } nvme;
  // The shared remote tier (storage/remote/remote_store.h); off when
  // redis_cluster is empty.
  struct Remote {
    std::string redis_cluster;  // seed nodes, "host:port[,host:port...]"
    std::string password_file;  // first line = the AUTH password; "" = none
    uint64_t connect_timeout_ms = 100;
    uint64_t command_timeout_ms = 250;
    uint64_t down_backoff_ms = 500;
    bool read_from_replicas = false;  // promotions read replicas too
    bool publish = true;
    PublishPolicySetting publish_policy = PublishPolicySetting::kWriteThrough;
    uint64_t writeback_buffer_bytes = uint64_t{256} << 20;
    uint64_t publish_threads = 2;
    uint64_t publish_queue_blocks = 4096;
    uint64_t ttl_ms = 0;
    uint64_t miss_cache_ms = 2000;
  } remote;
  struct Leases {
    uint64_t default_ttl_ms = 30000;
    uint64_t max_ttl_ms = 600000;
  } leases;
  struct Limits {
    uint64_t max_batch_blocks = 4096;
    uint64_t max_contexts = 4096;
    uint64_t max_admin_operations = 2;  // Drain and Verify running at once
  } limits;
  // SelKV compaction (daemon/compaction/compactor.h).
  struct Compaction {
    uint64_t max_context_bytes = uint64_t{1} << 30;  // original payload one CompactContext may read
    uint64_t max_observation_rows = 4096;            // observation query rows per KV head
  } compaction;
  // tiers.placement, tiers.keydiff.* and tiers.stability.*: which copy a
  // full tier gives up (storage/store/placement.h).
  struct Placement {
    PlacementSetting policy = PlacementSetting::kStability;
    double redundancy_weight = 1.0;
    double age_weight = 0.5;
    uint64_t sample_blocks = 16;
    double newest_protected = 0.5;
    bool unwanted_first = false;  // tiers.stability.unwanted_first
  } placement;
  // index.*: block summaries computed at put time and context trees.
  struct Index {
    SummaryEncodingSetting summary_encoding = SummaryEncodingSetting::kFp16;
    bool summary_bounds = false;
    bool summary_weighted = false;
    bool summary_per_layer = false;
    // kFloat: per-layer summaries in summary_encoding.
    LayerEncodingSetting summary_layer_encoding = LayerEncodingSetting::kInt8;
    bool summary_per_layer_bounds = false;
    uint64_t head_weights_min_blocks = 64;
    uint64_t pages_per_chunk = 4;
    uint64_t chunks_per_grid = 16;
    bool keep_summaries = false;
    bool q8_page_rows = false;  // removed: accepted only as false (Validate)
  } index;
  // select.*: selector defaults and per-stream limits.
  struct Select {
    index::ScorerKind default_scorer = index::ScorerKind::kMass;  // by index::ScorerName
    SelectAlgorithmSetting algorithm = SelectAlgorithmSetting::kDescent;
    double grid_keep_fraction = 0.5;
    double chunk_keep_fraction = 0.2;
    double page_keep_fraction = 1.0;
    uint64_t sink_blocks = 1;
    uint64_t local_blocks = 1;
    uint64_t window_steps = 64;
    double theta = 0.8;
    double stability_weight = 0.5;
    double hold_threshold = 0.5;
    std::string stability_scorers =
        "keykey,keykey_weighted";  // comma-separated ScorerName values, or ""
    bool keykey_centered = true;
    double keykey_recency_weight = 0.5;
    uint64_t max_prefetch_blocks = 64;
    uint64_t inline_promotion_bytes = uint64_t{64} << 20;
    uint64_t max_contexts_per_request = 256;
    uint64_t max_queued_responses = 8;
    uint64_t batch_threads = 0;  // 0 = min(4, cores)
    // Threads that answer Select requests, shared by tenants in deficit
    // round robin (0: on gRPC's callback threads, first come first served).
    uint64_t threads = 4;
    uint64_t queue_limit = 4096;          // requests waiting for a thread
    uint64_t queue_limit_per_tenant = 0;  // 0: queue_limit / 4
    uint64_t threads_per_tenant = 0;      // 0: threads - 1 with auth on
    uint64_t mass_tree_min_blocks = 512;
    double mass_tree_max_read_fraction = 0.1;
    uint64_t mass_tree_recent_blocks = 32;
    uint64_t mass_tree_reuse_steps = 8;
    double mass_tree_reuse_min_cosine = 0.8;
  } select;

  uint64_t nvme_capacity_bytes() const { return nvme.file_count * nvme.file_size_bytes; }

  // Effective configuration as "section.key" -> printable value, every key.
  std::map<std::string, std::string> Flatten() const;
};

// The embedded default configuration text (deploy/kvtierd.toml).
const char* DefaultConfigToml();

// Builds a Config from the embedded defaults, then the TOML file at
// config_path (skipped when empty), then each override "section.key=value"
// in order. Returns INVALID_ARGUMENT naming the file, line or key on a
// syntax error, an unknown key, a value of the wrong type, or a value that
// fails validation; NOT_FOUND when config_path does not exist.
absl::StatusOr<Config> LoadConfig(const std::string& config_path,
                                  const std::vector<std::string>& overrides);

// Parses "4096", "64KiB", "64MiB", "4GiB", "1TiB" (also KB/MB/GB as powers
// of 1000). Returns INVALID_ARGUMENT on anything else.
absl::StatusOr<uint64_t> ParseSize(const std::string& text);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CONFIG_H_
