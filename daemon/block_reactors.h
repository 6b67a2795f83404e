// Streaming reactors of the block RPCs: PutBlocks (client stream) and
// GetBlocks (server stream, get_blocks_reactor.cc). Each reactor owns its call's state and deletes
// itself in OnDone.
//
// Block I/O (memcpy, NVMe reads and writes, catalog syncs) runs on the
// runtime's BlockingPool, one message of a call at a time: the next read
// (PutBlocks) or write (GetBlocks) starts after the previous message was
// processed, so a call is never processed by two threads at once and has
// at most one item queued.
#ifndef KVTIER_DAEMON_BLOCK_REACTORS_H_
#define KVTIER_DAEMON_BLOCK_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include "daemon/runtime.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::daemon {

// Most results one PutBlocks stream may produce (its response holds one
// per block).
inline constexpr uint64_t kMaxPutResultsPerStream = 1 << 16;

// PutBlocks as a raw method (block_reactors.cc): every request message is a
// serialised PutBlocksRequest, parsed in place so that each block's data is
// copied once, from the slices gRPC received into the store's host tier;
// a message that does not parse fails the call with INVALID_ARGUMENT
// naming the message, field and byte. The response is a serialised
// PutBlocksResponse.
grpc::ServerReadReactor<grpc::ByteBuffer>* NewPutBlocksReactor(Runtime* runtime,
                                                               grpc::CallbackServerContext* ctx,
                                                               grpc::ByteBuffer* response);

// GetBlocks as a raw method (get_blocks_reactor.cc): the request is a
// serialised GetBlocksRequest and every response message a serialised
// GetBlocksResponse, whose blocks' bytes are sent from their host-tier
// copies in place (BlockStore::View) instead of being copied into a
// message.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewGetBlocksReactor(Runtime* runtime,
                                                                grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* request);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_BLOCK_REACTORS_H_
