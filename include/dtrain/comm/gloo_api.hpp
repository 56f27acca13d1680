#pragma once
// The table of functions dtrain's Gloo plugin (libdtrain_gloo.so, src/gloo_plugin.cpp) exports, and
// the engine calls (comm/gloo_group.hpp): a C interface, so no C++ type or exception crosses the
// boundary of a library loaded with RTLD_DEEPBIND (Note [Gloo behind dlopen]), and no MPI: the
// engine exchanges the addresses. Each call returns 0, or 1 with the cause in `error` (at most
// `capacity` bytes, terminated).
#include <cstddef>
#include <cstdint>

extern "C" {

struct DtrainGlooGroup;  // one communicator's Gloo connections

#define DTRAIN_GLOO_API_VERSION 3

struct DtrainGlooApi {
  int version;  // DTRAIN_GLOO_API_VERSION of the plugin
  // Opens the device on `iface` (empty: the plugin's default) and listens for each peer; null on
  // failure. `timeout_ms`: how long connect() waits.
  DtrainGlooGroup* (*create)(const char* iface, int rank, int ranks, std::int64_t timeout_ms,
                             char* error, std::size_t capacity);
  // This rank's address for `peer` (valid until connect()).
  int (*address_for)(DtrainGlooGroup* group, int peer, const char** bytes, std::size_t* length);
  // addresses[k], lengths[k]: peer k's address for this rank (this rank's entry unused).
  int (*connect)(DtrainGlooGroup* group, const char* const* addresses, const std::size_t* lengths,
                 int ranks, char* error, std::size_t capacity);
  void (*destroy)(DtrainGlooGroup* group);
  const char* (*interface_of)(DtrainGlooGroup* group);
  // dtype: a dtrain::DataType, op: a dtrain::ReduceOp (not Average), as integers.
  int (*allreduce)(DtrainGlooGroup* group, void* buf, std::int64_t n, int dtype, int op,
                   char* error, std::size_t capacity);
  // send null: this rank's block is already in place in recv.
  int (*allgatherv)(DtrainGlooGroup* group, const void* send, void* recv,
                    const std::int64_t* counts, int ranks, int dtype, char* error,
                    std::size_t capacity);
  int (*broadcast)(DtrainGlooGroup* group, void* buf, std::int64_t n, int dtype, int root,
                   char* error, std::size_t capacity);
  int (*alltoallv)(DtrainGlooGroup* group, const void* send, const std::int64_t* send_counts,
                   void* recv, const std::int64_t* recv_counts, int ranks, int dtype, char* error,
                   std::size_t capacity);
  // counts[k] elements of the reduction of `send` to rank k; this rank's into `out`.
  int (*reduce_scatter)(DtrainGlooGroup* group, const void* send, void* out,
                        const std::int64_t* counts, int ranks, int dtype, int op, char* error,
                        std::size_t capacity);
};

// The plugin's one exported symbol.
const DtrainGlooApi* dtrain_gloo_api();
}
