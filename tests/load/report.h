// The load test's report: everything one run measured, as a JSON document
// (KVTIER_LOAD_REPORT=path) and as a readable table for stdout.
//
// JSON layout (one object):
//   settings   {name: string}        knobs and the daemon's --set values
//   wall_s, calls, calls_per_s
//   ops        {op: {count, p50_us, p99_us, max_us, mean_us,
//                    calls: {code: n}, items: {code: n}}}   codes: google.rpc
//   counters   {name: n}             StreamCounters, summed over streams
//   evicted_blocks                   Stats.evicted_blocks gained during the run
//   samples    [{t_s, rss_bytes, rss_anon_bytes, rss_shmem_bytes, fds,
//                threads, pinned_bytes, device_pinned_bytes, *_used_bytes,
//                *_blocks, active_leases, open_contexts, staging_slots,
//                evicted_blocks}]    one a second while the load ran
//   after      {...}                 one sample once every stream stopped
//   flat       [{what, start, end, limit, ok}]
//   failures   [string]              the first messages; passed: bool
//
// Both sort report.ops's samples in place (OpStats::Summarize), hence the
// non-const reference. Thread safety: none beyond that; one caller.
#ifndef KVTIER_TESTS_LOAD_REPORT_H_
#define KVTIER_TESTS_LOAD_REPORT_H_

#include <map>
#include <string>
#include <vector>

#include "tests/load/op_stats.h"
#include "tests/load/resource_sampler.h"
#include "tests/load/streams.h"

namespace kvtier::load {

struct LoadReport {
  std::map<std::string, std::string> settings;
  double wall_s = 0;
  uint64_t calls = 0;
  OpStats ops;  // every stream's and the sampler's, merged
  StreamCounters counters;
  uint64_t evicted_blocks = 0;
  std::vector<ResourceSample> samples;
  ResourceSample after;
  std::vector<FlatCheck> flat;
  std::vector<std::string> failures;
  bool passed = false;
};

std::string ReportJson(LoadReport& report);
std::string ReportTable(LoadReport& report);

}  // namespace kvtier::load

#endif  // KVTIER_TESTS_LOAD_REPORT_H_
