#pragma once
// A local in-flight op: what the user submitted (metadata, memory, completion state).
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "dtrain/runtime/handle.hpp"
#include "dtrain/runtime/messages.hpp"
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
  void* stream = nullptr;            // device ops: producer stream
  std::shared_ptr<OpState> state;
};

// Executes responses for one kind of memory. entries[i] is this rank's entry for
// response.names[i], or nullptr when this rank joined and contributes nothing of its own.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual void execute(const Response& response, std::span<Entry* const> entries) = 0;
};

}  // namespace dtrain::detail
