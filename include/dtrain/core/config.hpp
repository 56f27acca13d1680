#pragma once
// Runtime settings: one struct (made of one struct per component: Note [Settings by component]),
// filled from DTRAIN_* environment variables (HOROVOD_* accepted as aliases) and adjustable in
// code before init(config). The knob table (core/config_knobs.hpp) is the single place that names
// each setting, its variable, its range and its help text; parsing, validation and typo detection
// all read it. docs/configuration.md documents the same table.
#include <cstdint>
#include <string>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/log_level.hpp"

namespace dtrain {

// Note [Settings by component]
// Config is the sum of one settings struct per part of dtrain that reads it; each part takes its
// own struct whole (the coordinator its NegotiationSettings, the host backend its
// HostPathSettings, ...), so a setting is never copied field by field from Config into a
// component's options, and a new setting reaches its component by being declared in its struct.
// Bases rather than members keep every setting one name away (config.cycle_time_ms), as the
// environment variables and Horovod's names have it.

// The stall inspector's: when ops that some ranks never submit are reported, and the job ended.
struct StallSettings {
  bool stall_check_disable = false;        // DTRAIN_STALL_CHECK_DISABLE
  double stall_check_time_seconds = 60;    // DTRAIN_STALL_CHECK_TIME_SECONDS
  double stall_shutdown_time_seconds = 0;  // DTRAIN_STALL_SHUTDOWN_TIME_SECONDS; 0 = never
};

// The coordinator's: how ops are batched, cached and watched for stalls.
struct NegotiationSettings : StallSettings {
  std::int64_t fusion_threshold_bytes = 134217728;  // DTRAIN_FUSION_THRESHOLD; 0 disables fusion
  double cycle_time_ms = 1.0;                        // DTRAIN_CYCLE_TIME
  std::int64_t cache_capacity = 1024;                // DTRAIN_CACHE_CAPACITY; 0 disables the cache
};

// How long an op and a silent peer may take before the job fails (dtrain additions).
struct DeadlineSettings {
  double op_timeout_seconds = 600;    // DTRAIN_OP_TIMEOUT_SECONDS; 0 = no deadline
  double peer_timeout_seconds = 60;   // DTRAIN_PEER_TIMEOUT_SECONDS; 0 = never
};

// How host tensors move: the MPI or Gloo host backend, its pieces and waits.
struct HostPathSettings {
  bool hierarchical_allreduce = false;      // DTRAIN_HIERARCHICAL_ALLREDUCE
  bool fusion_pipeline = true;              // DTRAIN_FUSION_PIPELINE
  std::int64_t mpi_chunk_bytes = 16777216;  // DTRAIN_MPI_CHUNK_BYTES
  int mpi_pieces_in_flight = 2;             // DTRAIN_MPI_PIECES_IN_FLIGHT
  double wait_max_sleep_us = 500;           // DTRAIN_WAIT_MAX_SLEEP_US; 0 = never sleep
  bool mpi_nonblocking = false;             // DTRAIN_MPI_NONBLOCKING
  std::string cpu_operations = "auto";      // DTRAIN_CPU_OPERATIONS: auto, mpi or gloo
  std::string gloo_iface;                   // DTRAIN_GLOO_IFACE; empty = first up, non-loopback
};

struct TimelineSettings {
  std::string timeline_path;                     // DTRAIN_TIMELINE; empty = off
  bool timeline_mark_cycles = false;             // DTRAIN_TIMELINE_MARK_CYCLES
  std::int64_t timeline_max_bytes = 1073741824;  // DTRAIN_TIMELINE_MAX_BYTES; 0 = no cap
};

struct AutotuneSettings {
  bool autotune = false;                         // DTRAIN_AUTOTUNE
  std::string autotune_log;                      // DTRAIN_AUTOTUNE_LOG
  std::string autotune_cache;                    // DTRAIN_AUTOTUNE_CACHE
  int autotune_warmup_samples = 3;               // DTRAIN_AUTOTUNE_WARMUP_SAMPLES
  int autotune_steps_per_sample = 10;            // DTRAIN_AUTOTUNE_STEPS_PER_SAMPLE
  int autotune_bayes_opt_max_samples = 20;       // DTRAIN_AUTOTUNE_BAYES_OPT_MAX_SAMPLES
  double autotune_gaussian_process_noise = 0.8;  // DTRAIN_AUTOTUNE_GAUSSIAN_PROCESS_NOISE
};

struct ProfileSettings {
  std::string profile_dir;           // DTRAIN_PROFILE; empty = off
  double profile_interval_ms = 500;  // DTRAIN_PROFILE_INTERVAL_MS
};

struct Config : NegotiationSettings,
                DeadlineSettings,
                HostPathSettings,
                TimelineSettings,
                AutotuneSettings,
                ProfileSettings {
  LogLevel log_level = LogLevel::warning;  // DTRAIN_LOG_LEVEL
  int num_nccl_streams = 1;                // DTRAIN_NUM_NCCL_STREAMS
  std::string host_id;                     // DTRAIN_HOST_ID; empty = real host name

  // Reads the process environment and validates. Throws InvalidArgumentError naming every bad
  // variable, its value and what is accepted.
  DTRAIN_API static Config from_env();
  // Throws InvalidArgumentError naming the field, its value and what is accepted.
  DTRAIN_API void validate() const;
};

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/core/config_impl.hpp"
#endif
