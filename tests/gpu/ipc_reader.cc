// Second process of the IPC test: opens the daemon's arena from its
// descriptor (client/cuda/cuda_arena_view.h), copies one block to the host
// and writes it to a file.
//
//   kvtier_gpu_ipc_reader HANDLE_HEX UUID ARENA_ID ARENA_BYTES OFFSET SIZE OUT [BLOCK_ARENA_ID]
//
// UUID is 32 hex digits or the "GPU-..." form. BLOCK_ARENA_ID (default
// ARENA_ID) is the arena id of the block handle, to exercise stale handles.
// Exit: 0 ok, 1 usage, 2 open failed, 3 block refused, 4 copy failed,
// 5 output failed. Errors go to stderr.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "client/cuda/cuda_arena_view.h"

namespace {

bool FromHex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    char* end = nullptr;
    const std::string pair = hex.substr(i, 2);
    const long value = std::strtol(pair.c_str(), &end, 16);
    if (end != pair.c_str() + 2) return false;
    out->push_back(static_cast<char>(value));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8 && argc != 9) {
    std::cerr << "usage: " << argv[0]
              << " HANDLE_HEX UUID ARENA_ID ARENA_BYTES OFFSET SIZE OUT [BLOCK_ARENA_ID]\n";
    return 1;
  }
  kvtier::client::CudaArenaDescriptor descriptor;
  if (!FromHex(argv[1], &descriptor.ipc_handle)) {
    std::cerr << "HANDLE_HEX is not hex\n";
    return 1;
  }
  descriptor.device_uuid = argv[2];
  descriptor.arena_id = std::strtoull(argv[3], nullptr, 10);
  descriptor.size_bytes = std::strtoull(argv[4], nullptr, 10);
  const uint64_t offset = std::strtoull(argv[5], nullptr, 10);
  const uint64_t size = std::strtoull(argv[6], nullptr, 10);
  const std::string out_path = argv[7];
  const uint64_t block_arena_id =
      argc == 9 ? std::strtoull(argv[8], nullptr, 10) : descriptor.arena_id;

  std::string error;
  auto view = kvtier::client::CudaArenaView::Open(descriptor, &error);
  if (view == nullptr) {
    std::cerr << "open: " << error << "\n";
    return 2;
  }
  const kvtier::client::DeviceRange block = view->Block(block_arena_id, offset, size, &error);
  if (block.data == nullptr) {
    std::cerr << "block: " << error << "\n";
    return 3;
  }
  std::vector<char> bytes(size);
  const cudaError_t err = cudaMemcpy(bytes.data(), block.data, size, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    std::cerr << "cudaMemcpy: " << cudaGetErrorString(err) << "\n";
    return 4;
  }
  std::ofstream out(out_path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::cerr << "cannot write " << out_path << "\n";
    return 5;
  }
  return 0;
}
