// kvtierctl subcommands. Each returns the process exit code: 0 on success,
// 1 when the daemon answered with an error (or, for `tenants`, the file
// could not be read, parsed or written), 2 for usage errors, 3 when the
// daemon cannot be reached, 4 when verify found corrupt blocks.
#ifndef KVTIER_CLIENT_KVTIERCTL_COMMANDS_H_
#define KVTIER_CLIENT_KVTIERCTL_COMMANDS_H_

#include <iosfwd>
#include <string>
#include <vector>

#include "client/client.h"

namespace kvtier::ctl {

struct GlobalOptions {
  bool json = false;
};

struct LsOptions {
  uint64_t profile_id = 0;   // 0 = all
  uint32_t limit = 0;        // blocks to list individually; 0 = counts only
  bool quarantined = false;  // list quarantined blocks instead (every one)
  std::string tier;          // "" = all; device, host or nvme
};

// Blocks per (profile, tier), optionally the first `limit` blocks.
int RunLs(Client& client, const GlobalOptions& options, const LsOptions& ls, std::ostream& out,
          std::ostream& err);
// Re-reads and checksums every copy of every block, with a progress bar on
// err, then lists every quarantined block (found now or earlier). Exit
// status 4 when any block is quarantined.
struct VerifyOptions {
  uint64_t profile_id = 0;   // 0 = every profile
  bool is_terminal = false;  // err is a terminal: the progress bar redraws
};
int RunVerify(Client& client, const GlobalOptions& options, const VerifyOptions& verify,
              std::ostream& out, std::ostream& err);
// Demotes every block to NVMe (tier "" / "host" / "nvme"), or empties
// only the device tier (tier "device"), with a progress bar on err.
struct DrainOptions {
  std::string tier;
  bool is_terminal = false;  // as VerifyOptions
};
int RunDrain(Client& client, const GlobalOptions& options, const DrainOptions& drain,
             std::ostream& out, std::ostream& err);

// Registered model profiles: id, name, revision, shape, block size, blocks
// and bytes stored, the tenant that registered it first.
int RunProfiles(Client& client, const GlobalOptions& options, std::ostream& out, std::ostream& err);

struct EvictOptions {
  std::string tenant;  // "" = default
  uint64_t profile_id = 0;
  std::string tier;                        // device | host | nvme ("" = nvme)
  std::vector<std::string> block_ids_hex;  // as `ls` prints them
};
// Gives up the blocks' copies in one tier (Admin.Evict); one line per id.
// Exit 1 when any id failed (its status is printed).
int RunEvict(Client& client, const GlobalOptions& options, const EvictOptions& evict,
             std::ostream& out, std::ostream& err);

struct CompactOptions {
  uint64_t profile_id = 0;
  double retention = 0;                    // (0, 1]
  std::string importance;                  // "" | keydiff | snapkv
  std::string merge;                       // "" | gated | uniform | none
  std::string bias;                        // "" | ratio | none
  std::vector<std::string> block_ids_hex;  // the context's blocks, in token order
};
// Opens a context on the blocks, compacts it (CompactContext), closes it;
// prints the new version (or the stored one, when it existed) and its
// blocks. Progress on err.
int RunCompact(Client& client, const GlobalOptions& options, const CompactOptions& compact,
               std::ostream& out, std::ostream& err);
// The versions of one context (context_key in hex), or of every compacted
// context of the profile (empty key).
struct VersionsOptions {
  uint64_t profile_id = 0;
  std::string context_key_hex;
};
int RunVersions(Client& client, const GlobalOptions& options, const VersionsOptions& versions,
                std::ostream& out, std::ostream& err);
// Deletes one version's blocks (0 = the originals).
struct DropVersionOptions {
  uint64_t profile_id = 0;
  std::string context_key_hex;
  uint32_t version = 0;
};
int RunDropVersion(Client& client, const GlobalOptions& options, const DropVersionOptions& drop,
                   std::ostream& out, std::ostream& err);

// Open contexts, busiest first (most pinned blocks, then most recently
// stepped); context ids in hex in the table.
int RunContexts(Client& client, const GlobalOptions& options, std::ostream& out, std::ostream& err);

struct TopOptions {
  uint32_t interval_ms = 2000;  // between refreshes
  uint32_t iterations = 0;      // refreshes before exiting; 0 = until interrupted
  uint32_t limit = 20;          // busiest contexts shown
  bool is_terminal = false;     // out is a terminal: clear it between refreshes
};
// Live view: tiers and the busiest contexts, refreshed every interval
// (the screen is cleared between refreshes on a terminal). With --json, one
// JSON object per refresh and line: {"refresh":N,"stats":...,"contexts":[...]}.
int RunTop(Client& client, const GlobalOptions& options, const TopOptions& top, std::ostream& out,
           std::ostream& err);

// Prints version, uptime, each tier (capacity, use) and the configuration.
int RunStatus(Client& client, const GlobalOptions& options, std::ostream& out, std::ostream& err);

// `tenants`: edit the tenants file (auth.tenants_file) offline; the daemon
// applies it on SIGHUP. Tokens are printed once on out and stored only as
// SHA-256; hints go to err.
struct TenantAddOptions {
  std::string name;
  std::string file;
  std::string role = "data";
  std::vector<std::string> quotas;  // "key=value"
  std::vector<std::string> cert_names;
  std::vector<uint32_t> uids;  // local users (auth.peer_socket_path)
};
// Appends a tenant with one new token (creating the file, mode 0600).
int RunTenantsAdd(const TenantAddOptions& add, const GlobalOptions& options, std::ostream& out,
                  std::ostream& err);
// Name, role, token count, cert names and quotas of every tenant; never hashes.
int RunTenantsList(const std::string& file, const GlobalOptions& options, std::ostream& out,
                   std::ostream& err);
// Adds a new token to a tenant; revoke_others drops its other tokens.
struct TenantsRotateOptions {
  std::string name;
  std::string file;
  bool revoke_others = false;
};
int RunTenantsRotate(const TenantsRotateOptions& rotate, const GlobalOptions& options,
                     std::ostream& out, std::ostream& err);

// Exit code for a failed call: 3 for UNAVAILABLE / DEADLINE_EXCEEDED (no
// daemon), else 1; prints the status to err.
int ReportError(const absl::Status& status, const Client& client, std::ostream& err);

}  // namespace kvtier::ctl

#endif  // KVTIER_CLIENT_KVTIERCTL_COMMANDS_H_
