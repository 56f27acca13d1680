#pragma once
// Which library carries host tensors: DTRAIN_CPU_OPERATIONS.
//
// Note [Choosing the host library]
// `auto`, the default, carries host tensors over Gloo where the job spans machines and over MPI
// within one machine. Across machines MPICH waits for its collectives by polling, on the core
// backward runs on, and Gloo waits in the kernel: on two network-namespace hosts ResNet-50 scales
// 0.57 over MPI and 0.75 over Gloo (docs/scaling.md). Within one machine MPI moves bytes through
// shared memory, where Gloo would take TCP over loopback. Machines, not hosts: DTRAIN_HOST_ID
// emulates hosts on one machine, whose bytes never cross a network. `auto` keeps MPI where
// hierarchical allreduce is asked for (Gloo's ring has no hierarchy), in a dtrain built without
// Gloo, and where Gloo cannot connect on some rank (no usable interface, a firewall): then every
// rank stays on MPI together, with a warning that says why. Only `gloo` makes these an error.
#include <mpi.h>

#include <memory>
#include <string>

#include <fmt/format.h>

#include "dtrain/comm/gloo_group.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/core/logging.hpp"
#include "dtrain/runtime/engine/agreement.hpp"

namespace dtrain::detail {

struct HostLibraryChoice {
  bool gloo = false;      // try Gloo
  bool required = false;  // and fail init where it cannot connect
  std::string why;        // for the log
};

// `machines`: Topology::machines. Every rank decides alike: the settings are agreed and the
// machines counted together.
inline HostLibraryChoice choose_host_library(const HostPathSettings& s, int machines,
                                             bool gloo_built) {
  if (s.cpu_operations == "gloo") return {true, true, "DTRAIN_CPU_OPERATIONS=gloo"};
  if (s.cpu_operations == "mpi") return {false, false, "DTRAIN_CPU_OPERATIONS=mpi"};
  if (machines < 2)
    return {false, false, "DTRAIN_CPU_OPERATIONS=auto and the job runs on one machine"};
  if (s.hierarchical_allreduce)
    return {false, false,
            "DTRAIN_CPU_OPERATIONS=auto and DTRAIN_HIERARCHICAL_ALLREDUCE=1, which Gloo has not"};
  if (!gloo_built)
    return {false, false, "DTRAIN_CPU_OPERATIONS=auto and this dtrain was built without Gloo"};
  return {true, false,
          fmt::format("DTRAIN_CPU_OPERATIONS=auto and the job spans {} machines", machines)};
}

// Collective over `data`: connects `gloo` where `choice` says, agreeing with every rank over
// `control` whether each did. Returns the error init must fail with (empty: none); an `auto` that
// could not connect leaves `gloo` empty on every rank, which then stays on MPI.
inline std::string connect_host_library(const HostLibraryChoice& choice,
                                        std::shared_ptr<GlooGroup>& gloo, MPI_Comm data,
                                        MPI_Comm control, const std::string& iface,
                                        double timeout_seconds) {
  int rank = 0;
  MPI_Comm_rank(control, &rank);
  std::string failed;
  if (choice.gloo)
    failed = agree_on_failures(try_connect_gloo(gloo, data, iface, timeout_seconds), control);
  if (!failed.empty()) {
    if (choice.required) return failed;
    gloo.reset();
    if (rank == 0)
      log(LogLevel::warning, "dtrain: {}, but Gloo could not connect, so host tensors go over "
          "MPI: {}", choice.why, failed);
  }
  if (rank == 0)
    log(LogLevel::info, "dtrain: host tensors go over {} ({})", gloo ? "Gloo" : "MPI", choice.why);
  return {};
}

}  // namespace dtrain::detail
