#pragma once
// Note [Horovod's other knobs]: dtrain reads every setting of its knob table under its Horovod
// spelling too (HOROVOD_CYCLE_TIME is DTRAIN_CYCLE_TIME), but Horovod reads more variables than
// that: build options its pip install takes from the environment (and container images keep
// set), variables horovodrun hands its Gloo ranks, and runtime switches for parts dtrain does not
// have. A job script migrated from Horovod keeps them, and dtrain ignores them; this table says,
// for each, what dtrain does instead, so the warning that it is ignored also says what to do.
// Internal: read by core/config_knobs.hpp's warnings about the environment; docs/horovod.md lists
// the same table.
#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/env.hpp"

namespace dtrain::detail {

struct HorovodKnob {
  std::string_view name;
  std::string_view instead;  // what dtrain does instead, one sentence without a final period
};

namespace horovod_instead {
inline constexpr std::string_view build =
    "Horovod's pip install reads it; dtrain is built with CMake, which finds MPI, CUDA, NCCL and "
    "libtorch itself (README, docs/device.md)";
inline constexpr std::string_view gpu_ops =
    "Horovod's build reads it; dtrain sends device tensors through NCCL, or through pinned host "
    "staging over MPI where NCCL cannot serve (docs/device.md)";
inline constexpr std::string_view gloo =
    "dtrain starts its ranks and negotiates with MPI, which is also the rendezvous of its Gloo "
    "host path (DTRAIN_CPU_OPERATIONS=gloo); DTRAIN_OP_TIMEOUT_SECONDS bounds each op";
inline constexpr std::string_view gloo_rank =
    "horovodrun sets it for Gloo ranks; dtrain takes ranks and hosts from MPI (DTRAIN_HOST_ID "
    "emulates hosts)";
inline constexpr std::string_view nvtx =
    "dtrain marks no NVTX ranges; DTRAIN_TIMELINE and DTRAIN_PROFILE record its ops";
}  // namespace horovod_instead

// Sorted by name. A name here is never one of the knob table's suffixes (Horovod spellings of
// dtrain settings are read, not ignored).
inline constexpr HorovodKnob horovod_unmapped_knobs[] = {
    {"HOROVOD_ADASUM_MPI_CHUNK_SIZE",
     "DTRAIN_MPI_CHUNK_BYTES bounds every MPI call of a reduction, Adasum's exchanges included"},
    {"HOROVOD_ALLOW_MIXED_GPU_IMPL", horovod_instead::gpu_ops},
    {"HOROVOD_BATCH_D2D_MEMCOPIES",
     "dtrain always packs the tensors of a fused device op with batched kernels"},
    {"HOROVOD_BUILD_ARCH_FLAGS", horovod_instead::build},
    {"HOROVOD_BUILD_CUDA_CC_LIST", horovod_instead::build},
    {"HOROVOD_CCL_CACHE", "dtrain has no oneCCL backend; host tensors go through MPI or Gloo (DTRAIN_CPU_OPERATIONS)"},
    {"HOROVOD_CMAKE", horovod_instead::build},
    {"HOROVOD_CONTROLLER", "MPI is dtrain's only controller; there is nothing to choose"},
    {"HOROVOD_CROSS_RANK", horovod_instead::gloo_rank},
    {"HOROVOD_CROSS_SIZE", horovod_instead::gloo_rank},
    {"HOROVOD_CUDA_HOME", horovod_instead::build},
    {"HOROVOD_DEBUG", horovod_instead::build},
    {"HOROVOD_DISABLE_GROUP_FUSION",
     "a group's members become ready together and dtrain fuses them like any other ready ops; "
     "there is no switch"},
    {"HOROVOD_DISABLE_NVTX_RANGES", horovod_instead::nvtx},
    {"HOROVOD_DYNAMIC_PROCESS_SETS",
     "dtrain::add_process_set() works at any time after init(), with no switch (docs/horovod.md)"},
    {"HOROVOD_ELASTIC",
     "horovodrun sets it in elastic mode; dtrainrun's elastic mode sets DTRAIN_ELASTIC itself "
     "(docs/elastic.md)"},
    {"HOROVOD_ELASTIC_TIMEOUT", "use dtrainrun --elastic-timeout (docs/elastic.md)"},
    {"HOROVOD_ENABLE_ASYNC_COMPLETION",
     "dtrain's engine completes each device op before the next; your threads and streams keep "
     "running meanwhile (docs/device.md)"},
    {"HOROVOD_ENABLE_XLA_OPS", "dtrain has no TensorFlow or XLA integration"},
    {"HOROVOD_GLOO_RENDEZVOUS_ADDR", horovod_instead::gloo},
    {"HOROVOD_GLOO_RENDEZVOUS_PORT", horovod_instead::gloo},
    {"HOROVOD_GLOO_TIMEOUT_SECONDS", horovod_instead::gloo},
    {"HOROVOD_GPU", horovod_instead::build},
    {"HOROVOD_GPU_ALLGATHER", horovod_instead::gpu_ops},
    {"HOROVOD_GPU_ALLREDUCE", horovod_instead::gpu_ops},
    {"HOROVOD_GPU_ALLTOALL", horovod_instead::gpu_ops},
    {"HOROVOD_GPU_BROADCAST", horovod_instead::gpu_ops},
    {"HOROVOD_GPU_OPERATIONS", horovod_instead::gpu_ops},
    {"HOROVOD_GPU_REDUCESCATTER", horovod_instead::gpu_ops},
    {"HOROVOD_HIERARCHICAL_ALLGATHER",
     "dtrain fuses ready allgathers instead (docs/performance.md); DTRAIN_HIERARCHICAL_ALLREDUCE "
     "is for allreduce"},
    {"HOROVOD_HOSTNAME", horovod_instead::gloo_rank},
    {"HOROVOD_LOCAL_RANK", horovod_instead::gloo_rank},
    {"HOROVOD_LOCAL_SIZE", horovod_instead::gloo_rank},
    {"HOROVOD_LOG_HIDE_TIME", "dtrain's log lines always carry the time and the rank"},
    {"HOROVOD_MPI_THREADS_DISABLE",
     "dtrain's engine thread needs MPI_THREAD_MULTIPLE; init() says how to get it where the MPI "
     "lacks it"},
    {"HOROVOD_NCCL_HOME", horovod_instead::build},
    {"HOROVOD_NCCL_INCLUDE", horovod_instead::build},
    {"HOROVOD_NCCL_LIB", horovod_instead::build},
    {"HOROVOD_NCCL_LINK", horovod_instead::build},
    {"HOROVOD_RANK", horovod_instead::gloo_rank},
    {"HOROVOD_ROCM_HOME", horovod_instead::build},
    {"HOROVOD_SECRET_KEY", "horovodrun's own; dtrainrun starts ranks through the MPI launcher"},
    {"HOROVOD_SIZE", horovod_instead::gloo_rank},
    {"HOROVOD_START_TIMEOUT", "use dtrainrun --start-timeout (docs/running.md)"},
    {"HOROVOD_THREAD_AFFINITY",
     "bind ranks with the MPI launcher (for example mpiexec -bind-to core); dtrain's threads "
     "inherit the binding"},
    {"HOROVOD_TORUS_ALLREDUCE",
     "DTRAIN_HIERARCHICAL_ALLREDUCE=1 is dtrain's multi-host allreduce"},
    {"HOROVOD_WITHOUT_GLOO", horovod_instead::build},
    {"HOROVOD_WITHOUT_MPI", horovod_instead::build},
    {"HOROVOD_WITHOUT_MXNET", horovod_instead::build},
    {"HOROVOD_WITHOUT_NVTX", horovod_instead::build},
    {"HOROVOD_WITHOUT_PYTORCH", horovod_instead::build},
    {"HOROVOD_WITHOUT_TENSORFLOW", horovod_instead::build},
    {"HOROVOD_WITH_GLOO", horovod_instead::build},
    {"HOROVOD_WITH_MPI", horovod_instead::build},
    {"HOROVOD_WITH_MXNET", horovod_instead::build},
    {"HOROVOD_WITH_NVTX", horovod_instead::build},
    {"HOROVOD_WITH_PYTORCH", horovod_instead::build},
    {"HOROVOD_WITH_TENSORFLOW", horovod_instead::build},
};

// The entry for `name`, or null when Horovod has no such knob that dtrain ignores.
inline const HorovodKnob* find_horovod_unmapped_knob(std::string_view name) {
  for (const HorovodKnob& knob : horovod_unmapped_knobs) {
    if (knob.name == name) return &knob;
  }
  return nullptr;
}

// A HOROVOD_ name that is neither a setting's Horovod spelling nor one of Horovod's knobs that
// dtrain ignores (Note [Horovod's other knobs]).
inline std::string unknown_horovod_warning(const std::string& name,
                                           const std::vector<std::string>& aliases) {
  std::vector<std::string> candidates = aliases;
  for (const HorovodKnob& knob : horovod_unmapped_knobs) candidates.emplace_back(knob.name);
  const std::optional<std::string> best = typo_of(name, env_alias_prefix, candidates);
  if (!best) {
    return fmt::format(
        "{} is not a dtrain setting and is ignored (docs/configuration.md lists the HOROVOD_ "
        "spellings dtrain reads, docs/horovod.md the Horovod settings it does not use)",
        name);
  }
  if (const HorovodKnob* knob = find_horovod_unmapped_knob(*best)) {
    return fmt::format(
        "{} is not a dtrain setting and is ignored; did you mean {}? dtrain would ignore that "
        "Horovod setting too: {}",
        name, knob->name, knob->instead);
  }
  return fmt::format("{} is not a dtrain setting and is ignored; did you mean {}?", name, *best);
}

}  // namespace dtrain::detail
