#pragma once
// Runtime settings: one struct, filled from DTRAIN_* environment variables (HOROVOD_* accepted as
// aliases) and adjustable in code before init(config). The knob table (core/config_knobs.hpp) is
// the single place that names each setting, its variable, its range and its help text; parsing,
// validation and typo detection all read it. docs/configuration.md documents the same table.
#include <cstdint>
#include <string>

#include "dtrain/core/build_mode.hpp"
#include "dtrain/core/log_level.hpp"

namespace dtrain {

struct Config {
  std::int64_t fusion_threshold_bytes = 134217728;  // DTRAIN_FUSION_THRESHOLD; 0 disables fusion
  double cycle_time_ms = 1.0;                        // DTRAIN_CYCLE_TIME
  std::int64_t cache_capacity = 1024;                // DTRAIN_CACHE_CAPACITY; 0 disables the cache
  bool hierarchical_allreduce = false;               // DTRAIN_HIERARCHICAL_ALLREDUCE
  std::string timeline_path;                         // DTRAIN_TIMELINE; empty = off
  bool timeline_mark_cycles = false;                 // DTRAIN_TIMELINE_MARK_CYCLES
  std::int64_t timeline_max_bytes = 1073741824;      // DTRAIN_TIMELINE_MAX_BYTES; 0 = no cap
  bool autotune = false;                             // DTRAIN_AUTOTUNE
  std::string autotune_log;                          // DTRAIN_AUTOTUNE_LOG
  std::string autotune_cache;                        // DTRAIN_AUTOTUNE_CACHE
  int autotune_warmup_samples = 3;                   // DTRAIN_AUTOTUNE_WARMUP_SAMPLES
  int autotune_steps_per_sample = 10;                // DTRAIN_AUTOTUNE_STEPS_PER_SAMPLE
  int autotune_bayes_opt_max_samples = 20;           // DTRAIN_AUTOTUNE_BAYES_OPT_MAX_SAMPLES
  double autotune_gaussian_process_noise = 0.8;      // DTRAIN_AUTOTUNE_GAUSSIAN_PROCESS_NOISE
  bool stall_check_disable = false;                  // DTRAIN_STALL_CHECK_DISABLE
  double stall_check_time_seconds = 60;              // DTRAIN_STALL_CHECK_TIME_SECONDS
  double stall_shutdown_time_seconds = 0;            // DTRAIN_STALL_SHUTDOWN_TIME_SECONDS; 0 = never
  LogLevel log_level = LogLevel::warning;            // DTRAIN_LOG_LEVEL
  int num_nccl_streams = 1;                          // DTRAIN_NUM_NCCL_STREAMS
  std::string profile_dir;                           // DTRAIN_PROFILE; empty = off
  double profile_interval_ms = 500;                  // DTRAIN_PROFILE_INTERVAL_MS
  // dtrain additions (not in Horovod):
  double op_timeout_seconds = 600;                   // DTRAIN_OP_TIMEOUT_SECONDS; 0 = no deadline
  double peer_timeout_seconds = 60;                  // DTRAIN_PEER_TIMEOUT_SECONDS; 0 = never
  std::int64_t mpi_chunk_bytes = 16777216;           // DTRAIN_MPI_CHUNK_BYTES
  int mpi_pieces_in_flight = 2;                      // DTRAIN_MPI_PIECES_IN_FLIGHT
  double wait_max_sleep_us = 500;                    // DTRAIN_WAIT_MAX_SLEEP_US; 0 = never sleep
  bool mpi_nonblocking = false;                      // DTRAIN_MPI_NONBLOCKING
  bool fusion_pipeline = true;                       // DTRAIN_FUSION_PIPELINE
  std::string cpu_operations = "mpi";                // DTRAIN_CPU_OPERATIONS: mpi or gloo
  std::string gloo_iface;                            // DTRAIN_GLOO_IFACE; empty = first up, non-loopback
  std::string host_id;                               // DTRAIN_HOST_ID; empty = real host name

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
