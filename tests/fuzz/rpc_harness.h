// RpcHarness: the real kvtierd server (daemon::Server on a fresh directory,
// real BlockStore, Unix socket) in this process, and a generic gRPC client
// that sends arbitrary bytes as the request messages of any of its methods.
// Used by daemon_rpc_fuzz.cc and by make_seeds.cc.
//
// Input format (one fuzz input = a few calls made in order):
//
//   input = call ( kCallSeparator call )*          at most kMaxCalls calls
//   call  = method_byte message ( kMessageSeparator message )*
//
// method_byte % methods().size() picks the method. Unary and server-
// streaming methods send the first message only; client- and bidi-streaming
// ones send up to kMaxMessages. A message is sent as is, except that ids
// the daemon hands out at random are named by placeholders: when a request
// parses as its proto type, a uint64 field `context_id` or `lease_id` with
// a value k in 1..kMaxIds is replaced by the k-th such id a response of
// this input returned, and a SlotRef with slot_id k (generation 0) by the
// k-th slot ReserveSlots returned. At the end of an input the harness
// closes the contexts and releases the leases it saw, so inputs do not
// exhaust limits for later ones.
//
// Methods: every method of every service the server registers, found with
// its own reflection service (ListServices) and sorted by full name, so a
// service or method added to the daemon is fuzzed without editing this.
//
// Contract checked on every call (a violation abort()s, which libFuzzer and
// the corpus replay report): the status code is one of gRPC's 17; the call
// ends before its deadline (kDeadline: a daemon that stops answering is a
// hang); every response message parses as the method's output type; an OK
// unary call has exactly one response. The daemon itself must not crash.
//
// KVTIER_FUZZ_TRACE=1 prints every call's status and responses (to read
// what a reproducer does).
//
// Thread safety: one thread calls RunInput at a time.
#ifndef KVTIER_TESTS_FUZZ_RPC_HARNESS_H_
#define KVTIER_TESTS_FUZZ_RPC_HARNESS_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "daemon/server.h"

namespace kvtier::fuzz {

inline constexpr absl::string_view kCallSeparator = "@C@";
inline constexpr absl::string_view kMessageSeparator = "@M@";
inline constexpr size_t kMaxCalls = 8;
inline constexpr size_t kMaxMessages = 8;
inline constexpr size_t kMaxIds = 16;         // remembered ids of each kind
inline constexpr size_t kMaxResponses = 256;  // then the call is cancelled
inline constexpr std::chrono::seconds kDeadline{10};

struct Method {
  std::string path;  // "/kvtier.v1.KvTier/Lookup"
  const google::protobuf::MethodDescriptor* descriptor = nullptr;
};

struct CallResult {
  grpc::Status status;
  std::vector<std::string> responses;  // serialized response messages
};

// One call of an input, for building inputs (make_seeds.cc).
struct CallSpec {
  std::string method;  // full path
  std::vector<std::string> messages;
};

class RpcHarness {
 public:
  // Starts the daemon on a new directory under $TMPDIR (or /tmp) with
  // small tiers; aborts when it cannot.
  static std::unique_ptr<RpcHarness> Start();
  ~RpcHarness();  // stops the daemon, removes its directory

  const std::vector<Method>& methods() const { return methods_; }
  // Index of `path` in methods(), or -1.
  int MethodIndex(const std::string& path) const;

  // Runs every call of one input (format above), then cleans up.
  void RunInput(absl::string_view input);
  // The calls of an input in the format above.
  std::string Encode(const std::vector<CallSpec>& calls) const;

  // One call with the contract checks; placeholders are substituted and
  // returned ids recorded. Public for make_seeds.cc.
  CallResult Call(const Method& method, const std::vector<std::string>& messages);
  // Stops and starts the daemon on a fresh directory (no state kept).
  void Restart();

 private:
  RpcHarness() = default;
  void StartServer();
  void StopServer();
  void DiscoverMethods();
  std::string Substitute(const Method& method, const std::string& message);
  void Record(const google::protobuf::Message& response);
  void Cleanup();

  std::string dir_;
  std::unique_ptr<daemon::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::vector<Method> methods_;
  // Ids seen in responses of the current input, oldest first.
  std::vector<uint64_t> context_ids_;
  std::vector<uint64_t> lease_ids_;
  std::vector<std::string> slots_;  // serialized kvtier.v1.SlotRef
  int generation_ = 0;              // Restart count, names the directory
  // Calls per method and status code, and the first message of each;
  // printed by the destructor when KVTIER_FUZZ_STATS is set (which methods
  // get past validation).
  std::map<std::string, std::map<int, uint64_t>> stats_;
  std::map<std::string, std::map<int, std::string>> first_messages_;
};

}  // namespace kvtier::fuzz

#endif  // KVTIER_TESTS_FUZZ_RPC_HARNESS_H_
