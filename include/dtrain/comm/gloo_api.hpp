#pragma once
// The table of functions dtrain's Gloo plugin (libdtrain_gloo.so, src/gloo_plugin.cpp) exports, and
// the engine calls (comm/gloo_group.hpp): a C interface, so no C++ type or exception crosses the
// boundary of a library loaded with RTLD_DEEPBIND (Note [Gloo behind dlopen]). Each call returns 0,
// or 1 with the cause in `error` (at most `capacity` bytes, terminated).
#include <mpi.h>

#include <cstddef>
#include <cstdint>

extern "C" {

struct DtrainGlooGroup;  // one communicator's Gloo connections

#define DTRAIN_GLOO_API_VERSION 1

struct DtrainGlooApi {
  int version;  // DTRAIN_GLOO_API_VERSION of the plugin
  // Collective over `comm`; null on failure. `iface` empty: the plugin's default interface.
  DtrainGlooGroup* (*connect)(MPI_Comm comm, const char* iface, std::int64_t timeout_ms,
                              char* error, std::size_t capacity);
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
};

// The plugin's one exported symbol.
const DtrainGlooApi* dtrain_gloo_api();
}
