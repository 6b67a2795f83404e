#include "storage/nvme/nvme_tier.h"

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/common/checksum.h"
#include "storage/common/status_macros.h"

namespace kvtier {
namespace {

constexpr uint32_t kMaxFiles = 1000;  // Three-digit file names.
constexpr uint32_t kMaxQueueDepth = 4096;
constexpr uint32_t kMaxIoThreads = 64;
constexpr char kFilePrefix[] = "nvme-";

absl::Status InvalidOption(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("NvmeTierOptions.", field, " ", why));
}

}  // namespace

uint64_t NvmeChecksum(absl::Span<const uint8_t> data) { return BlockChecksum(data); }

std::string NvmeLocation::ToString() const {
  return absl::StrCat(NvmeTier::FileName(file_index), "@", offset_bytes, "+", length_bytes);
}

struct NvmeTier::File {
  std::unique_ptr<BlockFile> file;
  // Written since the last Sync; set after a write completed, cleared by the
  // Sync that covers it.
  std::atomic<bool> dirty{false};
};

// The requests of one call and their completion queue. The worker threads
// push finished requests; the calling thread waits and takes them.
class NvmeTier::Batch final : public IoCompletion {
 public:
  explicit Batch(size_t size) : requests_(size), staging_(size) {}

  IoRequest& request(size_t i) { return requests_[i]; }
  absl::Span<uint8_t>& staging(size_t i) { return staging_[i]; }
  size_t size() const { return requests_.size(); }

  void OnIoDone(IoRequest* request) override {
    absl::MutexLock lock(&mu_);
    done_.push_back(static_cast<size_t>(request - requests_.data()));
  }

  // Blocks until at least one request finished; replaces *indices with the
  // indices of the finished requests.
  void WaitSome(std::vector<size_t>* indices) {
    indices->clear();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::vector<size_t>* done) { return !done->empty(); }, &done_));
    indices->swap(done_);
  }

 private:
  std::vector<IoRequest> requests_;
  std::vector<absl::Span<uint8_t>> staging_;
  absl::Mutex mu_;
  std::vector<size_t> done_ ABSL_GUARDED_BY(mu_);
};

std::string NvmeTier::FileName(uint32_t file_index) {
  return absl::StrFormat("%s%03u.dat", kFilePrefix, file_index);
}

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Open(const NvmeTierOptions& options) {
  Env* env = options.env != nullptr ? options.env : Env::Default();
  std::unique_ptr<NvmeTier> tier(new NvmeTier(options, env));
  KVTIER_RETURN_IF_ERROR(tier->Init());
  return tier;
}

NvmeTier::NvmeTier(const NvmeTierOptions& options, Env* env) : options_(options), env_(env) {}

NvmeTier::~NvmeTier() {
  // Workers drain their rings before the files they point at close.
  workers_.clear();
}

absl::Status NvmeTier::Init() {
  const NvmeTierOptions& o = options_;
  if (o.directory.empty()) return InvalidOption("directory", "is empty");
  if (o.num_files == 0 || o.num_files > kMaxFiles) {
    return InvalidOption("num_files",
                         absl::StrCat("must be in [1, ", kMaxFiles, "], got ", o.num_files));
  }
  if (o.alignment_bytes != kDirectIoAlignmentBytes) {
    return InvalidOption("alignment_bytes", absl::StrCat("must be ", kDirectIoAlignmentBytes,
                                                         ", got ", o.alignment_bytes));
  }
  if (o.file_size_bytes == 0 || o.file_size_bytes % o.alignment_bytes != 0) {
    return InvalidOption("file_size_bytes",
                         absl::StrCat("must be a positive multiple of ", o.alignment_bytes,
                                      ", got ", o.file_size_bytes));
  }
  if (o.queue_depth == 0 || o.queue_depth > kMaxQueueDepth) {
    return InvalidOption("queue_depth",
                         absl::StrCat("must be in [1, ", kMaxQueueDepth, "], got ", o.queue_depth));
  }
  if (o.io_threads == 0 || o.io_threads > kMaxIoThreads) {
    return InvalidOption("io_threads",
                         absl::StrCat("must be in [1, ", kMaxIoThreads, "], got ", o.io_threads));
  }
  if (o.staging_bytes == 0) return InvalidOption("staging_bytes", "must be > 0");
  if (o.max_block_bytes == 0 || RoundUpToDirectIo(o.max_block_bytes) > o.staging_bytes ||
      o.max_block_bytes > o.file_size_bytes || o.max_block_bytes > kMaxIoRequestBytes) {
    return InvalidOption("max_block_bytes",
                         absl::StrCat("must be in [1, min(staging_bytes, file_size_bytes, ",
                                      kMaxIoRequestBytes, ")], got ", o.max_block_bytes));
  }

  KVTIER_RETURN_IF_ERROR(env_->CreateDir(o.directory, /*recursive=*/true));
  BlockFileOptions file_options;
  file_options.size_bytes = o.file_size_bytes;
  file_options.create_if_missing = true;
  file_options.direct_io = o.use_odirect;
  for (uint32_t i = 0; i < o.num_files; ++i) {
    const std::string path = absl::StrCat(o.directory, "/", FileName(i));
    absl::StatusOr<std::unique_ptr<BlockFile>> file = env_->OpenBlockFile(path, file_options);
    if (!file.ok()) {
      if (o.use_odirect && file.status().code() == absl::StatusCode::kFailedPrecondition &&
          absl::StrContains(file.status().message(), "O_DIRECT")) {
        return absl::FailedPreconditionError(
            absl::StrCat(file.status().message(), " (NvmeTierOptions.use_odirect = false)"));
      }
      return file.status();
    }
    auto entry = std::make_unique<File>();
    entry->file = std::move(file).value();
    files_.push_back(std::move(entry));
  }
  KVTIER_RETURN_IF_ERROR(env_->SyncDir(o.directory));
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t i = 0; i < o.num_files; ++i) {
      space_.emplace_back(o.file_size_bytes, o.alignment_bytes);
    }
    blocks_.resize(o.num_files);
  }

  KVTIER_ASSIGN_OR_RETURN(staging_, AlignedBufferPool::Create(o.staging_bytes));
  std::vector<absl::Span<uint8_t>> regions = {staging_->region()};
  regions.insert(regions.end(), o.registered_regions.begin(), o.registered_regions.end());
  registered_buffers_ = true;
  for (uint32_t t = 0; t < o.io_threads; ++t) {
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue,
                            env_->NewIoQueue(IoQueueOptions{o.queue_depth}));
    // Without registration the ring still works with ordinary buffers;
    // stats().registered_buffers reports it.
    if (!queue->RegisterBuffers(regions).ok()) registered_buffers_ = false;
    workers_.push_back(std::make_unique<IoWorker>(std::move(queue)));
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::CheckLocation(const NvmeLocation& location) const {
  if (location.file_index >= files_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("NvmeLocation.file_index ", location.file_index,
                                                   " >= num_files ", files_.size()));
  }
  if (location.length_bytes == 0 || location.length_bytes > options_.max_block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("NvmeLocation.length_bytes ", location.length_bytes,
                     " not in [1, max_block_bytes ", options_.max_block_bytes, "]"));
  }
  if (location.offset_bytes % options_.alignment_bytes != 0 ||
      location.offset_bytes > options_.file_size_bytes ||
      RoundUpToDirectIo(location.length_bytes) > options_.file_size_bytes - location.offset_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("NvmeLocation.offset_bytes ", location.offset_bytes,
                     " misaligned or beyond file_size_bytes ", options_.file_size_bytes, " for ",
                     location.ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<NvmeLocation> NvmeTier::Allocate(uint64_t length_bytes) {
  absl::MutexLock lock(&mu_);
  const uint32_t num_files = static_cast<uint32_t>(space_.size());
  // Rotate the starting file so consecutive blocks spread over the files.
  for (uint32_t k = 0; k < num_files; ++k) {
    const uint32_t f = (next_file_ + k) % num_files;
    std::optional<uint64_t> offset = space_[f].Allocate(length_bytes);
    if (!offset.has_value()) continue;
    blocks_[f][*offset] = length_bytes;
    next_file_ = (f + 1) % num_files;
    return NvmeLocation{f, *offset, length_bytes};
  }
  uint64_t used_bytes = 0;
  for (const ExtentAllocator& space : space_) used_bytes += space.used_bytes();
  absl::Status full = absl::ResourceExhaustedError(absl::StrCat(
      "nvme tier full: capacity_bytes=", uint64_t{num_files} * options_.file_size_bytes,
      " used_bytes=", used_bytes, ", no free extent of ", RoundUpToDirectIo(length_bytes),
      " bytes"));
  full.SetPayload(kTierFullPayload, absl::Cord("1"));
  return full;
}

bool NvmeTier::IsTierFull(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.GetPayload(kTierFullPayload).has_value();
}

void NvmeTier::Release(const NvmeLocation& location) {
  absl::MutexLock lock(&mu_);
  blocks_[location.file_index].erase(location.offset_bytes);
  space_[location.file_index].Free(location.offset_bytes, location.length_bytes);
}

void NvmeTier::Dispatch(absl::Span<IoRequest* const> requests) {
  const size_t num_workers = workers_.size();
  if (num_workers == 1 || requests.size() <= 1) {
    const uint32_t w = next_worker_.fetch_add(1, std::memory_order_relaxed);
    workers_[w % num_workers]->Submit(requests);
    return;
  }
  // Contiguous slices keep one submission per worker per round.
  const uint32_t first = next_worker_.fetch_add(1, std::memory_order_relaxed);
  const size_t per_worker = (requests.size() + num_workers - 1) / num_workers;
  for (size_t w = 0, begin = 0; begin < requests.size(); ++w) {
    const size_t count = std::min(per_worker, requests.size() - begin);
    workers_[(first + w) % num_workers]->Submit(requests.subspan(begin, count));
    begin += count;
  }
}

template <typename Stage, typename Done>
void NvmeTier::RunBatch(Batch& batch, const std::vector<bool>& active, Stage stage, Done done) {
  std::vector<IoRequest*> ready;
  std::vector<size_t> finished;
  size_t next = 0;
  size_t outstanding = 0;
  while (next < batch.size() || outstanding > 0) {
    ready.clear();
    for (; next < batch.size(); ++next) {
      if (!active[next]) continue;
      IoRequest& request = batch.request(next);
      if (request.op != IoOp::kSync && request.buffer == nullptr) {
        std::optional<absl::Span<uint8_t>> slice = staging_->TryAcquire(request.length);
        if (!slice.has_value()) {
          // Finish our own requests first; block only when holding nothing,
          // so waiting for staging cannot deadlock.
          if (outstanding + ready.size() > 0) break;
          slice = staging_->Acquire(request.length);
        }
        batch.staging(next) = *slice;
        request.buffer = slice->data();
        stage(next, *slice);
        stats_.Add(&NvmeTierStats::staged_ops);
      } else if (request.op != IoOp::kSync) {
        stats_.Add(&NvmeTierStats::zero_copy_ops);
      }
      request.user_data = static_cast<IoCompletion*>(&batch);
      ready.push_back(&request);
    }
    if (!ready.empty()) {
      outstanding += ready.size();
      Dispatch(ready);
    }
    if (outstanding == 0) break;
    batch.WaitSome(&finished);
    for (size_t i : finished) {
      --outstanding;
      done(i, batch.request(i), batch.staging(i));
      if (!batch.staging(i).empty()) {
        staging_->Release(batch.staging(i));
        batch.staging(i) = {};
      }
    }
  }
}

absl::StatusOr<NvmeLocation> NvmeTier::Write(absl::Span<const uint8_t> data) {
  return std::move(WriteBatch(absl::MakeConstSpan(&data, 1))[0]);
}

std::vector<absl::StatusOr<NvmeLocation>> NvmeTier::WriteBatch(
    absl::Span<const absl::Span<const uint8_t>> blocks) {
  const size_t n = blocks.size();
  std::vector<absl::StatusOr<NvmeLocation>> results(n, absl::UnknownError("not written"));
  std::vector<NvmeLocation> locations(n);
  std::vector<bool> active(n, false);
  Batch batch(n);
  for (size_t i = 0; i < n; ++i) {
    const absl::Span<const uint8_t> data = blocks[i];
    if (data.empty() || data.size() > options_.max_block_bytes) {
      results[i] = absl::InvalidArgumentError(absl::StrCat(
          "nvme write of ", data.size(), " bytes: size must be in [1, max_block_bytes ",
          options_.max_block_bytes, "]"));
      continue;
    }
    absl::StatusOr<NvmeLocation> location = Allocate(data.size());
    if (!location.ok()) {
      results[i] = location.status();
      continue;
    }
    locations[i] = *location;
    active[i] = true;
    IoRequest& request = batch.request(i);
    request.op = IoOp::kWrite;
    request.file = files_[location->file_index]->file.get();
    request.offset = location->offset_bytes;
    request.length = RoundUpToDirectIo(data.size());
    request.buffer =
        IsDirectIoAligned(data.data(), data.size()) ? const_cast<uint8_t*>(data.data()) : nullptr;
  }
  RunBatch(
      batch, active,
      [&](size_t i, absl::Span<uint8_t> staging) {
        const absl::Span<const uint8_t> data = blocks[i];
        std::memcpy(staging.data(), data.data(), data.size());
        std::memset(staging.data() + data.size(), 0, staging.size() - data.size());
      },
      [&](size_t i, const IoRequest& request, absl::Span<uint8_t>) {
        if (!request.status.ok()) {
          stats_.Add(&NvmeTierStats::io_errors);
          Release(locations[i]);
          results[i] = request.status;
          return;
        }
        files_[locations[i].file_index]->dirty.store(true, std::memory_order_release);
        stats_.Change([&](NvmeTierStats& s) {
          ++s.writes;
          s.write_bytes += locations[i].length_bytes;
        });
        results[i] = locations[i];
      });
  return results;
}

absl::Status NvmeTier::Read(const NvmeLocation& location, uint64_t expected_xxh3,
                            absl::Span<uint8_t> out) {
  const NvmeReadRequest request{location, expected_xxh3, out};
  return std::move(ReadBatch(absl::MakeConstSpan(&request, 1))[0]);
}

std::vector<absl::Status> NvmeTier::ReadBatch(absl::Span<const NvmeReadRequest> requests) {
  const size_t n = requests.size();
  std::vector<absl::Status> results(n);
  std::vector<bool> active(n, false);
  Batch batch(n);
  for (size_t i = 0; i < n; ++i) {
    const NvmeReadRequest& read = requests[i];
    absl::Status valid = CheckLocation(read.location);
    if (valid.ok() && read.out.size() != read.location.length_bytes) {
      valid = absl::InvalidArgumentError(absl::StrCat("NvmeReadRequest.out has ", read.out.size(),
                                                      " bytes, location ", read.location.ToString(),
                                                      " has ", read.location.length_bytes));
    }
    if (!valid.ok()) {
      results[i] = std::move(valid);
      std::memset(read.out.data(), 0, read.out.size());
      continue;
    }
    active[i] = true;
    IoRequest& request = batch.request(i);
    request.op = IoOp::kRead;
    request.file = files_[read.location.file_index]->file.get();
    request.offset = read.location.offset_bytes;
    request.length = RoundUpToDirectIo(read.location.length_bytes);
    request.buffer =
        IsDirectIoAligned(read.out.data(), read.out.size()) ? read.out.data() : nullptr;
  }
  RunBatch(
      batch, active, [](size_t, absl::Span<uint8_t>) {},
      [&](size_t i, const IoRequest& request, absl::Span<uint8_t> staging) {
        const NvmeReadRequest& read = requests[i];
        const uint64_t length = read.location.length_bytes;
        absl::Status status = request.status;
        if (!status.ok()) {
          stats_.Add(&NvmeTierStats::io_errors);
        } else {
          // Copy first, then hash the copy while it is still in cache: one
          // pass over memory fewer than hashing the staging slice. On a
          // mismatch the copy is wiped below.
          if (!staging.empty()) std::memcpy(read.out.data(), staging.data(), length);
          const uint64_t actual = NvmeChecksum(read.out);
          if (actual != read.expected_xxh3) {
            stats_.Add(&NvmeTierStats::checksum_failures);
            status = absl::DataLossError(
                absl::StrCat("nvme block ", read.location.ToString(), " in ", request.file->path(),
                             ": checksum mismatch (expected xxh3 ", absl::Hex(read.expected_xxh3),
                             ", read ", absl::Hex(actual), ")"));
          }
        }
        if (!status.ok()) {
          // Never leave bytes of a failed read where the caller looks.
          std::memset(read.out.data(), 0, read.out.size());
          results[i] = std::move(status);
          return;
        }
        stats_.Change([&](NvmeTierStats& s) {
          ++s.reads;
          s.read_bytes += length;
        });
      });
  return results;
}

absl::Status NvmeTier::Sync() {
  absl::MutexLock lock(&sync_mu_);
  Batch batch(files_.size());
  std::vector<bool> active(files_.size(), false);
  for (size_t f = 0; f < files_.size(); ++f) {
    // Cleared before the fdatasync is issued: a write completing meanwhile
    // sets it again and is covered by the next Sync.
    if (!files_[f]->dirty.exchange(false, std::memory_order_acq_rel)) continue;
    active[f] = true;
    IoRequest& request = batch.request(f);
    request.op = IoOp::kSync;
    request.file = files_[f]->file.get();
  }
  absl::Status first_error;
  RunBatch(
      batch, active, [](size_t, absl::Span<uint8_t>) {},
      [&](size_t, const IoRequest& request, absl::Span<uint8_t>) {
        stats_.Add(&NvmeTierStats::syncs);
        if (!request.status.ok() && first_error.ok()) {
          first_error = request.status;
        }
      });
  if (!first_error.ok()) {
    stats_.Add(&NvmeTierStats::io_errors);
    // Counted before the files are marked again: a caller that sees a
    // later Sync succeed also sees this failure.
    sync_failures_.fetch_add(1, std::memory_order_acq_rel);
    for (size_t f = 0; f < files_.size(); ++f) {
      if (active[f]) files_[f]->dirty.store(true, std::memory_order_release);
    }
    last_sync_error_ =
        absl::Status(first_error.code(), absl::StrCat("nvme Sync failed; blocks written since the "
                                                      "last successful Sync are not durable: ",
                                                      first_error.message()));
    return last_sync_error_;
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::last_sync_error() const {
  absl::MutexLock lock(&sync_mu_);
  return last_sync_error_;
}

absl::Status NvmeTier::Free(const NvmeLocation& location) {
  KVTIER_RETURN_IF_ERROR(CheckLocation(location));
  absl::MutexLock lock(&mu_);
  auto& blocks = blocks_[location.file_index];
  auto it = blocks.find(location.offset_bytes);
  if (it == blocks.end() || it->second != location.length_bytes) {
    return absl::NotFoundError(absl::StrCat("no nvme block allocated at ", location.ToString()));
  }
  blocks.erase(it);
  space_[location.file_index].Free(location.offset_bytes, location.length_bytes);
  return absl::OkStatus();
}

absl::Status NvmeTier::Reserve(const NvmeLocation& location) {
  KVTIER_RETURN_IF_ERROR(CheckLocation(location));
  absl::MutexLock lock(&mu_);
  if (!space_[location.file_index].Reserve(location.offset_bytes, location.length_bytes)) {
    return absl::AlreadyExistsError(
        absl::StrCat("nvme block ", location.ToString(), " overlaps an allocated block"));
  }
  blocks_[location.file_index][location.offset_bytes] = location.length_bytes;
  return absl::OkStatus();
}

absl::StatusOr<NvmeOrphanReport> NvmeTier::RemoveOrphanFiles() {
  KVTIER_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->ListDir(options_.directory));
  NvmeOrphanReport report;
  for (const std::string& name : names) {
    bool ours = false;
    for (uint32_t i = 0; i < files_.size() && !ours; ++i) {
      ours = name == FileName(i);
    }
    if (ours) continue;
    if (!absl::StartsWith(name, kFilePrefix)) {
      report.foreign.push_back(name);
      continue;
    }
    KVTIER_RETURN_IF_ERROR(env_->DeleteFile(absl::StrCat(options_.directory, "/", name)));
    report.removed.push_back(name);
  }
  if (!report.removed.empty()) {
    KVTIER_RETURN_IF_ERROR(env_->SyncDir(options_.directory));
  }
  return report;
}

std::vector<std::string> NvmeTier::FilePaths() const {
  std::vector<std::string> paths;
  for (const auto& file : files_) paths.push_back(file->file->path());
  return paths;
}

NvmeTierStats NvmeTier::stats() const {
  NvmeTierStats s = stats_.Get();  // the I/O counters
  s.files = static_cast<uint32_t>(files_.size());
  s.capacity_bytes = uint64_t{s.files} * options_.file_size_bytes;
  {
    absl::MutexLock lock(&mu_);
    for (const ExtentAllocator& space : space_) s.used_bytes += space.used_bytes();
    for (const auto& blocks : blocks_) s.blocks += blocks.size();
  }
  s.direct_io = options_.use_odirect;
  s.registered_buffers = registered_buffers_;
  for (const auto& worker : workers_) {
    const IoQueueStats q = worker->queue_stats();
    s.queue.submit_calls += q.submit_calls;
    s.queue.completed += q.completed;
    s.queue.fixed_buffer_ops += q.fixed_buffer_ops;
    s.queue.requeued_short += q.requeued_short;
    s.queue.requeued_again += q.requeued_again;
  }
  return s;
}

}  // namespace kvtier
