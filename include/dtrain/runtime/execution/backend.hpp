#pragma once
// What executes a negotiated response: the Backend interface, the context the engine hands a
// device backend, the counters backends keep, and the rules every backend applies to a response
// (Average as Sum with a folded postscale).
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "dtrain/comm/hierarchical.hpp"
#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/comm/request_wait.hpp"
#include "dtrain/core/config.hpp"
#include "dtrain/runtime/device_registry.hpp"
#include "dtrain/runtime/execution/engine_counters.hpp"
#include "dtrain/runtime/execution/entry.hpp"
#include "dtrain/runtime/execution/op_deadline.hpp"
#include "dtrain/runtime/execution/timeline.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"

namespace dtrain::detail {

// Executes responses for one kind of memory. entries[i] is this rank's entry for
// response.names[i], or nullptr when this rank joined and contributes nothing of its own.
// `arrival`: when the response reached this rank (the end of the ops' queueing on the timeline).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual void execute(const Response& response, std::span<Entry* const> entries,
                       std::chrono::steady_clock::time_point arrival) = 0;
};

// Average becomes Sum with the division folded into the postscale.
inline double effective_postscale(const Response& r) {
  return r.reduce_op == ReduceOp::Average ? r.postscale / std::max(1, r.active_ranks) : r.postscale;
}
inline ReduceOp effective_op(const Response& r) {
  return r.reduce_op == ReduceOp::Average ? ReduceOp::Sum : r.reduce_op;
}

// What the engine hands a device backend: the data communicator (shared with the host backend;
// both run on the engine thread), the host hierarchy (engine-owned duplicates of the topology's
// communicators; invalid when the engine has no topology), counters, and the timeline (rank 0).
struct BackendContext {
  const Config* config = nullptr;
  // The op deadline every rank enforces, rank 0's DTRAIN_OP_TIMEOUT_SECONDS, and this process's
  // own pauses, which it does not count (Note [One op deadline] in
  // runtime/execution/op_deadline.hpp). Never config->op_timeout_seconds: that is this rank's own
  // value.
  double op_timeout_seconds = 0;
  const OwnPauses* own_pauses = nullptr;
  MPI_Comm data_comm = MPI_COMM_NULL;
  HierarchyComms hierarchy;
  EngineCounters* stats = nullptr;
  Timeline* timeline = nullptr;
};

// What an allgather gathers, from its response alone: every rank computes the same.
struct AllgatherLayout {
  std::vector<std::int64_t> counts;  // elements from each rank
  Shape out_shape;                   // the ranks' rows one after another
  std::int64_t total = 0;            // elements in all
};

inline AllgatherLayout allgather_layout(const Response& r) {
  AllgatherLayout l;
  const std::int64_t row = row_numel(r.shape);
  std::int64_t rows = 0;
  l.counts.reserve(r.rank_rows.size());
  for (std::int64_t n : r.rank_rows) {
    l.counts.push_back(n * row);
    rows += n;
  }
  l.out_shape = r.shape.empty() ? Shape{rows} : r.shape;
  l.out_shape[0] = rows;
  l.total = rows * row;
  return l;
}

// What an alltoall moves, once the ranks have told each other how many rows each sends each.
struct AlltoallCounts {
  std::vector<std::int64_t> recv_rows;    // rows received from each rank
  std::vector<std::int64_t> send_counts;  // elements sent to each rank
  std::vector<std::int64_t> recv_counts;  // elements received from each rank
  Shape out_shape;                        // the input's shape with dim 0 the rows received
};

// Every backend's alltoall starts with the same exchange: the splits (rows this rank sends to
// each rank) go out, the rows each rank sends here come back, over `comm` of `size` ranks.
// Joined ranks are rejected during negotiation, so every rank has its entry.
inline AlltoallCounts exchange_alltoall_counts(const Entry& e, int size, MPI_Comm comm,
                                               std::string_view call,
                                               const RequestWait& wait = RequestWait::hot()) {
  AlltoallCounts c;
  const std::int64_t row = e.request.row_numel();
  c.recv_rows.resize(size);
  MPI_Request request = MPI_REQUEST_NULL;
  mpi_check(MPI_Ialltoall(e.splits.data(), 1, MPI_INT64_T, c.recv_rows.data(), 1, MPI_INT64_T,
                          comm, &request),
            call);
  wait.wait(request, call);
  c.send_counts.resize(size);
  c.recv_counts.resize(size);
  std::int64_t total_rows = 0;
  for (int k = 0; k < size; ++k) {
    c.send_counts[k] = e.splits[k] * row;
    c.recv_counts[k] = c.recv_rows[k] * row;
    total_rows += c.recv_rows[k];
  }
  c.out_shape = e.request.shape;
  if (c.out_shape.empty()) c.out_shape.push_back(0);
  c.out_shape[0] = total_rows;
  return c;
}

}  // namespace dtrain::detail
