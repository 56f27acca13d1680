#pragma once
// A local in-flight op: what the user submitted (metadata, memory, completion state).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "dtrain/runtime/handle.hpp"
#include "dtrain/runtime/negotiation/request.hpp"
#include "dtrain/tensor/traits.hpp"

namespace dtrain::detail {

struct Entry {
  Request request;
  void* data = nullptr;              // in-place ops (allreduce, broadcast)
  const void* input = nullptr;       // ops with a new output (allgather, alltoall, reducescatter)
  std::vector<std::int64_t> splits;  // alltoall: rows sent to each rank
  // Ops with a new output: allocate it (engine thread) and return its memory.
  std::function<void*(const Shape&)> make_output;
  std::function<void(std::vector<std::int64_t>)> set_received_splits;  // alltoall
  std::function<void(int)> set_last_joined;  // join: the last rank to join
  std::function<void(std::int32_t)> set_created;  // add_process_set: the new set's id
  void* stream = nullptr;            // device ops: producer stream
  std::chrono::steady_clock::time_point submitted;  // when the engine took it (negotiation time)
  std::thread::id submitter;         // the thread that submitted it (Note [In-flight table])
  std::shared_ptr<OpState> state;
};

}  // namespace dtrain::detail
