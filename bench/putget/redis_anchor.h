// The Redis anchor of kvtier_putget_bench: a redis-server child process
// (no persistence, loopback only) and a hiredis client that SETs / GETs a
// working set with pipelined batches.
//
//   auto server = RedisServer::Start("/usr/bin/redis-server", dir, 10000ms);
//   auto tcp = RedisClient::ConnectTcp((*server)->port());
//   tcp->SetBlocks(ws, keys, 16);
//   (*server)->Stop();   // also done by the destructor
//
// Thread safety: none; use each object from one thread.
#ifndef KVTIER_BENCH_PUTGET_REDIS_ANCHOR_H_
#define KVTIER_BENCH_PUTGET_REDIS_ANCHOR_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/putget/bench_util.h"

struct redisContext;

namespace kvtier::bench {

class RedisServer {
 public:
  // Starts `binary --port P --bind 127.0.0.1 --unixsocket <dir>/redis.sock
  // --save "" --appendonly no --daemonize no` with P a free loopback port
  // (found by binding port 0), output to <dir>/redis.log, and the child set
  // to get SIGTERM if this process dies. Returns once it answers PING on
  // TCP, or an error (with the log's tail) when it exits or ready_timeout
  // passes; a port lost to a race is retried with a new port, 3 times.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(
      const std::string& binary, const std::string& dir, std::chrono::milliseconds ready_timeout);

  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer();  // Stop()

  // SIGTERM, then waitpid for up to 5 s, then SIGKILL and waitpid.
  // Returns the error when the child did not exit cleanly. Idempotent.
  absl::Status Stop();

  int port() const { return port_; }
  const std::string& unix_socket() const { return unix_socket_; }
  // INFO server's redis_version; empty when it did not say.
  const std::string& version() const { return version_; }

 private:
  RedisServer(pid_t pid, int port, std::string unix_socket, std::string log_path)
      : pid_(pid),
        port_(port),
        unix_socket_(std::move(unix_socket)),
        log_path_(std::move(log_path)) {}
  absl::Status WaitReady(std::chrono::milliseconds timeout);
  std::string LogTail() const;

  pid_t pid_ = -1;  // -1 once reaped
  const int port_;
  const std::string unix_socket_;
  const std::string log_path_;
  std::string version_;
};

class RedisClient {
 public:
  static absl::StatusOr<std::unique_ptr<RedisClient>> ConnectTcp(int port);
  static absl::StatusOr<std::unique_ptr<RedisClient>> ConnectUnix(const std::string& path);

  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;
  ~RedisClient();

  // SET keys[i] = block i of ws, batch commands appended
  // (redisAppendCommand) before the batch's replies are read. Every reply
  // must be +OK.
  absl::Status SetBlocks(const WorkingSet& ws, const std::vector<std::string>& keys,
                         uint32_t batch);
  // GET keys[i] into ws->dst(i), pipelined the same way. Every reply must
  // be a string of exactly block_bytes.
  absl::Status GetBlocks(WorkingSet* ws, const std::vector<std::string>& keys, uint32_t batch);
  // FLUSHALL (synchronous).
  absl::Status FlushAll();

 private:
  explicit RedisClient(redisContext* c) : c_(c) {}
  absl::Status ContextError(const std::string& what) const;

  redisContext* const c_;
};

}  // namespace kvtier::bench

#endif  // KVTIER_BENCH_PUTGET_REDIS_ANCHOR_H_
