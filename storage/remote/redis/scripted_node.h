// ScriptedNode: a fake Redis node for client tests. It listens on a free
// 127.0.0.1 port, parses every command it receives (RESP arrays, with
// hiredis's reader) and answers with whatever the test's handler returns,
// so tests can make a node redirect, stall, fail or close on cue.
//
// Test-only: linked into kvtier_redis_cluster_test, not into the library.
//
// Thread safety: the handler runs on the node's connection threads (one per
// connection), under the node's mutex, so handlers need no locking of their
// own; address(), connections() and commands() may be called from any
// thread.
#ifndef KVTIER_STORAGE_REMOTE_REDIS_SCRIPTED_NODE_H_
#define KVTIER_STORAGE_REMOTE_REDIS_SCRIPTED_NODE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvtier::remote {

class ScriptedNode {
 public:
  // What the handler returns: raw RESP bytes to send back (e.g. "+OK\r\n"),
  // or one of these.
  static constexpr const char* kNoReply = "<no reply>";  // say nothing
  static constexpr const char* kClose = "<close>";       // close the connection
  using Handler = std::function<std::string(const std::vector<std::string>& argv)>;

  // Listens on 127.0.0.1:<free port>; aborts the test binary if it cannot.
  explicit ScriptedNode(Handler handler);
  ScriptedNode(const ScriptedNode&) = delete;
  ScriptedNode& operator=(const ScriptedNode&) = delete;
  ~ScriptedNode();  // stops listening, closes every connection, joins threads

  const std::string& address() const { return address_; }  // "127.0.0.1:<port>"
  int port() const { return port_; }
  int connections() const;  // accepted so far
  // Every command received so far, in order of arrival.
  std::vector<std::vector<std::string>> commands() const;

  // RESP helpers for handlers.
  static std::string Bulk(const std::string& bytes);  // "$<n>\r\n<bytes>\r\n"
  // CLUSTER SLOTS reply with one range 0..16383 served by host:port.
  static std::string AllSlotsTo(const std::string& host, int port);

 private:
  void AcceptLoop();
  void Serve(int fd);

  const Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;

  mutable absl::Mutex mu_;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<std::string>> commands_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier::remote

#endif  // KVTIER_STORAGE_REMOTE_REDIS_SCRIPTED_NODE_H_
