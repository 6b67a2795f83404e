// The end-to-end backend: the daemon's scorers served by kvtierd over gRPC
// (backend.h). `endpoint` is a daemon address (whose select.* and index.*
// settings must equal config's: docs/QUALITY.md lists them) or "inprocess":
// a daemon started in this process with config's settings, one per distinct
// configuration, shared by every backend of the process until
// StopInProcessDaemons. Either way the daemon must store summaries in fp32
// (index.summary_encoding) so that they equal the in-process ones.
//
// Each backend registers the profile, puts its blocks (ids derived from the
// payload), opens one context, appends blocks as the replay completes them
// and sends one ContextSelect per step on its own Select stream.
//
// Thread safety: a backend is used by one thread; starting in-process
// daemons is serialised.
#ifndef KVTIER_BENCH_QUALITY_DAEMON_BACKEND_H_
#define KVTIER_BENCH_QUALITY_DAEMON_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bench/quality/backend.h"
#include "kvtier/v1/types.pb.h"

namespace kvtier::quality {

// Errors: the daemon's (configuration, connection, RPC) with the endpoint
// named; InvalidArgument for a configuration kvtierd cannot take.
absl::StatusOr<std::unique_ptr<SelectionBackend>> MakeKvtierdBackend(const BackendConfig& config,
                                                                     const std::string& endpoint);

// The BackendConfig of kvtierd's embedded defaults (deploy/kvtierd.toml)
// for `layout`, from the same option builders the daemon uses
// (daemon/options.h).
absl::StatusOr<BackendConfig> ShippedDefaults(const index::BlockLayout& layout);

// The calibration as RegisterProfile carries it (the fields left at their
// defaults are not set).
v1::SelectionCalibration CalibrationToProto(const index::SelectionCalibration& c);

// Installs MakeKvtierdBackend and ShippedDefaults as the harness's
// factories (SetDaemonBackendFactory, SetShippedDefaultsFactory).
void InstallDaemonBackend();

// Shuts the in-process daemons down and removes their data folders. Every
// backend using them must have been destroyed.
void StopInProcessDaemons();

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_DAEMON_BACKEND_H_
