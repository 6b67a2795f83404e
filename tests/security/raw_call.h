// RawCall: calls any RPC by its full method name with one empty message,
// through grpc::GenericStub, so a test can sweep every method of a service
// descriptor (a method added later is covered without editing the test).
#ifndef KVTIER_TESTS_SECURITY_RAW_CALL_H_
#define KVTIER_TESTS_SECURITY_RAW_CALL_H_

#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

namespace kvtier::security {

// "/pkg.Service/Method" for every method of `service` ("kvtier.v1.KvTier").
inline std::vector<std::string> MethodsOf(const std::string& service) {
  std::vector<std::string> out;
  const auto* desc = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  if (desc == nullptr) return out;
  for (int i = 0; i < desc->method_count(); ++i) {
    out.push_back("/" + service + "/" + desc->method(i)->name());
  }
  return out;
}

// Sends one empty message (a valid encoding of every message type), half-
// closes, drains the replies and returns the call's status. `authorization`
// is sent as the metadata value when not empty.
inline grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel,
                            const std::string& method, const std::string& authorization) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  if (ok) {
    grpc::Slice empty("");
    grpc::ByteBuffer message(&empty, 1);
    call->Write(message, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  if (ok) {
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  }
  for (int i = 0; ok && i < 1000; ++i) {
    grpc::ByteBuffer reply;
    call->Read(&reply, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

}  // namespace kvtier::security

#endif  // KVTIER_TESTS_SECURITY_RAW_CALL_H_
