#include "tests/load/resource_sampler.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier::load {
namespace {

// "VmRSS:	  123456 kB" -> bytes; the field's value in its unit.
bool ProcStatusField(const std::string& text, const std::string& key, uint64_t* value) {
  const size_t at = text.find("\n" + key + ":");
  if (at == std::string::npos) return false;
  std::istringstream line(text.substr(at + key.size() + 2, 64));
  uint64_t n = 0;
  std::string unit;
  if (!(line >> n)) return false;
  line >> unit;
  *value = unit == "kB" ? n * 1024 : n;
  return true;
}

bool ReadProc(pid_t pid, ResourceSample* s, std::string* error) {
  const std::string base = absl::StrCat("/proc/", pid);
  std::ifstream in(base + "/status");
  if (!in) {
    *error = absl::StrCat("cannot read ", base, "/status");
    return false;
  }
  std::string text = "\n" + std::string(std::istreambuf_iterator<char>(in), {});
  if (!ProcStatusField(text, "VmRSS", &s->rss_bytes) ||
      !ProcStatusField(text, "Threads", &s->threads)) {
    *error = absl::StrCat(base, "/status has no VmRSS or Threads");
    return false;
  }
  ProcStatusField(text, "RssAnon", &s->rss_anon_bytes);
  ProcStatusField(text, "RssShmem", &s->rss_shmem_bytes);
  {
    // Fields after the ")" closing the command name: state is field 3,
    // utime 14, stime 15 (proc(5)), in clock ticks.
    std::ifstream stat_in(base + "/stat");
    std::string stat(std::istreambuf_iterator<char>(stat_in), {});
    const size_t close = stat.rfind(')');
    std::istringstream fields(close == std::string::npos ? "" : stat.substr(close + 1));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14 && !absl::SimpleAtoi(field, &utime)) utime = 0;
      if (i == 15 && !absl::SimpleAtoi(field, &stime)) stime = 0;
    }
    s->cpu_s = static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  }
  DIR* dir = ::opendir((base + "/fd").c_str());
  if (dir == nullptr) {
    *error = absl::StrCat("cannot list ", base, "/fd");
    return false;
  }
  uint64_t fds = 0;
  while (const dirent* e = ::readdir(dir)) fds += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(dir);
  s->fds = fds;
  return true;
}

void FromStats(const v1::StatsResponse& stats, ResourceSample* s) {
  for (const v1::TierStats& t : stats.tiers()) {
    s->pinned_bytes += t.pinned_bytes();
    switch (t.tier()) {
      case v1::TIER_DEVICE:
        s->device_pinned_bytes = t.pinned_bytes();
        s->device_used_bytes = t.used_bytes();
        s->device_blocks = t.blocks();
        break;
      case v1::TIER_HOST:
        s->host_used_bytes = t.used_bytes();
        s->host_blocks = t.blocks();
        break;
      case v1::TIER_NVME:
        s->nvme_used_bytes = t.used_bytes();
        s->nvme_blocks = t.blocks();
        break;
      default:
        break;
    }
  }
  s->active_leases = stats.active_leases();
  s->open_contexts = stats.open_contexts();
  s->staging_slots = stats.staging_slots();
  s->evicted_blocks = stats.evicted_blocks();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void TakeSample(pid_t pid, Client* client, ResourceSample* s, std::string* error) {
  error->clear();
  s->proc_ok = ReadProc(pid, s, error);
  auto stats = client->Stats();
  s->stats_ok = stats.ok();
  if (stats.ok()) {
    FromStats(*stats, s);
  } else {
    absl::StrAppend(error, error->empty() ? "" : "; ", "Stats: ", stats.status().ToString());
  }
}

ResourceSampler::ResourceSampler(pid_t pid, Client* client, std::chrono::milliseconds period)
    : pid_(pid), client_(client), period_(period) {}

ResourceSampler::~ResourceSampler() { Stop(); }

void ResourceSampler::Start() {
  start_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { Run(); });
}

void ResourceSampler::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

std::vector<std::string> ResourceSampler::errors() const {
  absl::MutexLock lock(&mu_);
  return errors_;
}

void ResourceSampler::SampleOnce() {
  ResourceSample s;
  s.t_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string error;
  {
    ScopedTimer timer(&latency_, Op::kStats);
    TakeSample(pid_, client_, &s, &error);
  }
  latency_.CallCode(Op::kStats, s.stats_ok ? 0 : -1);
  samples_.push_back(s);
  if (!error.empty()) {
    absl::MutexLock lock(&mu_);
    errors_.push_back(absl::StrCat("sample at ", s.t_s, " s: ", error));
  }
}

void ResourceSampler::Run() {
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    SampleOnce();
    next += period_;
    absl::MutexLock lock(&mu_);
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    // A timer, not a synchronisation: wake at the next period or on Stop.
    const absl::Duration wait = absl::FromChrono(next - std::chrono::steady_clock::now());
    if (mu_.AwaitWithTimeout(absl::Condition(&stopped), wait)) {
      break;
    }
  }
}

std::vector<FlatCheck> CheckFlat(const std::vector<ResourceSample>& samples, double load_end_s,
                                 const FlatLimits& limits, std::string* error) {
  std::vector<const ResourceSample*> in;
  for (const ResourceSample& s : samples) {
    if (s.t_s >= limits.warmup_s && s.t_s <= load_end_s && s.proc_ok && s.stats_ok)
      in.push_back(&s);
  }
  if (in.size() < 2 * kMinWindowSamples) {
    *error = absl::StrCat(in.size(), " usable samples after the ", limits.warmup_s,
                          " s warm-up; the flat check needs ", 2 * kMinWindowSamples);
    return {};
  }
  const size_t width = std::max(kMinWindowSamples, in.size() / 10);
  auto window = [&](bool end, uint64_t ResourceSample::*field) {
    std::vector<double> v;
    for (size_t i = 0; i < width; ++i) {
      const ResourceSample* s = end ? in[in.size() - 1 - i] : in[i];
      v.push_back(static_cast<double>(s->*field));
    }
    return Median(v);
  };
  std::vector<FlatCheck> out;
  auto check = [&](const char* what, uint64_t ResourceSample::*field, double slack) {
    FlatCheck c;
    c.what = what;
    c.start = window(false, field);
    c.end = window(true, field);
    c.limit = c.start + slack;
    c.ok = c.end <= c.limit;
    out.push_back(c);
  };
  const double rss_start = window(false, &ResourceSample::rss_bytes);
  check("rss_bytes", &ResourceSample::rss_bytes,
        std::max<double>(static_cast<double>(limits.rss_slack_bytes),
                         limits.rss_slack_fraction * rss_start));
  check("fds", &ResourceSample::fds, static_cast<double>(limits.fd_slack));
  check("threads", &ResourceSample::threads, static_cast<double>(limits.thread_slack));
  check("device_pinned_bytes", &ResourceSample::device_pinned_bytes,
        static_cast<double>(limits.pinned_slack_bytes));
  return out;
}

}  // namespace kvtier::load
