// Shared memory a tenant holds a descriptor of is client-controlled: these
// tests play a hostile tenant with the descriptors the fd socket hands out
// and check that the daemon neither faults on the memory (SIGBUS) nor lets
// it grow outside the tenant's quota (docs/SECURITY.md, "Client-controlled memory").
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "client/shm/fd_fetch.h"
#include "client/shm/shm_mapping.h"
#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

class SharedMemoryTest : public TwoTenantTest {
 protected:
  // Tenant a's staging descriptor, as a client gets it through the socket.
  client::FetchedFd StagingFd(const v1::ReserveSlotsResponse& slots) {
    client::FetchedFd fd = client::FetchSharedFd(
        slots.fd_socket_path(), client::SharedFileKind::kStaging, tokens_["a"], 3000);
    EXPECT_OK(fd) << fd.ToString();
    return fd;
  }

  // Tenant b still stores and reads its blocks: the daemon is up and b's
  // memory was not taken.
  void ExpectOtherTenantServed(const std::string& tag) {
    const auto ids = Ids(tag, 2);
    EXPECT_EQ(Put(b_.get(), pb_, ids, 500), (std::vector<int>{0, 0}));
    v1::GetBlocksRequest get;
    get.set_profile_id(pb_);
    for (const auto& id : ids) get.add_block_ids(id);
    auto got = b_->GetBlocks(get);
    ASSERT_OK(got);
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ((*got)[0].data(), Payload(500));
    EXPECT_OK(b_->OpenArena());
    EXPECT_OK(b_->ReserveSlots(pb_, 1));
  }
};

// Finding 1 (high): the tenant truncated its staging file to 0 bytes and
// named a reserved slot in PutBlocks; the daemon's copy out of its mapping
// died with SIGBUS, taking every tenant's non-durable blocks with it.
TEST_F(SharedMemoryTest, TruncatingTheStagingFileCannotCrashTheDaemon) {
  auto slots = a_->ReserveSlots(pa_, 2);
  ASSERT_OK(slots);
  EXPECT_TRUE(slots->staging_path().empty()) << "staging files must have no path";
  client::FetchedFd fd = StagingFd(*slots);
  ASSERT_OK(fd);
  const uint64_t size = slots->staging_size_bytes();
  ASSERT_GT(size, 0u);

  const std::string payload = Payload(7);
  const v1::SlotRef& slot = slots->slots(0);
  ASSERT_EQ(
      ::pwrite(fd.fd(), payload.data(), payload.size(), static_cast<off_t>(slot.offset_bytes())),
      static_cast<ssize_t>(payload.size()));

  // The attack, as the probe ran it: shrink the file to nothing.
  EXPECT_NE(::ftruncate(fd.fd(), 0), 0) << "the staging file could be shrunk";
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(fd.fd(), static_cast<off_t>(slot.offset_bytes())), 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);

  // ... then name the slot: the put completes with the bytes written.
  v1::PutBlocksRequest req;
  req.set_profile_id(pa_);
  const auto ids = Ids("trunc", 1);
  v1::BlockPut* b = req.add_blocks();
  b->set_block_id(ids[0]);
  *b->mutable_slot() = slot;
  auto put = a_->PutBlocks({req});
  ASSERT_OK(put);
  ASSERT_EQ(put->results_size(), 1);
  EXPECT_EQ(put->results(0).status().code(), 0) << put->results(0).status().message();
  v1::GetBlocksRequest get;
  get.set_profile_id(pa_);
  get.add_block_ids(ids[0]);
  auto got = a_->GetBlocks(get);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].data(), payload);
  ExpectOtherTenantServed("after-trunc");
}

// Finding 2 (medium): with the same descriptor a tenant with a small staging
// quota grew its file to gigabytes of shared memory, and other tenants'
// arenas and slots then failed for lack of memory.
TEST_F(SharedMemoryTest, StagingFileCannotGrowPastItsQuota) {
  auto slots = a_->ReserveSlots(pa_, 1);
  ASSERT_OK(slots);
  client::FetchedFd fd = StagingFd(*slots);
  ASSERT_OK(fd);
  const uint64_t size = slots->staging_size_bytes();
  EXPECT_EQ(size, 256u * 1024) << "auth.tenant_staging_bytes";

  EXPECT_NE(::posix_fallocate(fd.fd(), 0, off_t{4} << 30), 0) << "grew to 4 GiB";
  EXPECT_NE(::ftruncate(fd.fd(), off_t{4} << 30), 0) << "grew to 4 GiB (sparse)";
  const char byte = 1;
  EXPECT_NE(::pwrite(fd.fd(), &byte, 1, static_cast<off_t>(size)), 1) << "wrote past the end";
  struct stat st {};
  ASSERT_EQ(::fstat(fd.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, size) << "memory beyond the quota";
  // Nor can the tenant lift the seals, or add a write seal the daemon's
  // later slots would then fail on.
  EXPECT_NE(::fcntl(fd.fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  const int seals = ::fcntl(fd.fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  ExpectOtherTenantServed("after-grow");
}

// The arena's descriptor is read-only: it can be neither resized nor
// written, so the daemon's copies into it cannot fault either.
TEST_F(SharedMemoryTest, ArenaDescriptorCannotResizeOrWriteTheArena) {
  auto arena = a_->OpenArena();
  ASSERT_OK(arena);
  client::FetchedFd fd = client::FetchSharedFd(arena->fd_socket_path(),
                                               client::SharedFileKind::kArena, tokens_["a"], 3000);
  ASSERT_OK(fd) << fd.ToString();
  EXPECT_EQ(::fcntl(fd.fd(), F_GETFL) & O_ACCMODE, O_RDONLY);
  EXPECT_NE(::ftruncate(fd.fd(), 0), 0);
  EXPECT_NE(::posix_fallocate(fd.fd(), 0, off_t{1} << 30), 0);
  const char byte = 1;
  EXPECT_NE(::pwrite(fd.fd(), &byte, 1, 0), 1);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd(), 0), MAP_FAILED);
  struct stat st {};
  ASSERT_EQ(::fstat(fd.fd(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), arena->size_bytes());

  // Blocks still come back through the arena as handles.
  const auto ids = Ids("arena", 1);
  ASSERT_EQ(Put(a_.get(), pa_, ids, 900), (std::vector<int>{0}));
  v1::GetBlocksRequest get;
  get.set_profile_id(pa_);
  get.set_mode(v1::RETURN_MODE_HANDLES);
  get.add_block_ids(ids[0]);
  auto got = a_->GetBlocks(get);
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].status().code(), 0) << (*got)[0].status().message();
  ExpectOtherTenantServed("after-arena");
}

}  // namespace
}  // namespace kvtier::security
