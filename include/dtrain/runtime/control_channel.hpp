#pragma once
// The engine's control channel: requests from every rank to the coordinator (rank 0) and ordered
// responses back, as encoded messages on the control communicator (a duplicate of the world, so
// neither data collectives nor the user's own MPI calls can match them). Sends are non-blocking
// and their bytes live until MPI is done with them; receives probe and never block. Engine
// thread only.
#include <mpi.h>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/runtime/messages.hpp"

namespace dtrain::detail {

inline constexpr int kRequestTag = 1;
inline constexpr int kResponseTag = 2;

class ControlChannel {
 public:
  explicit ControlChannel(MPI_Comm comm) : comm_(comm) {}
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  void send_request(const RequestMessage& m) {
    isend(std::make_shared<std::vector<char>>(encode(m)), 0, kRequestTag);
  }
  // One encoding, shared by the sends to ranks 1 .. size-1.
  void send_response(const ResponseMessage& m, int size) {
    auto bytes = std::make_shared<std::vector<char>>(encode(m));
    for (int r = 1; r < size; ++r) isend(bytes, r, kResponseTag);
  }

  // The next request that has arrived from any rank, if any (rank 0).
  std::optional<RequestMessage> receive_request() {
    if (!receive(MPI_ANY_SOURCE, kRequestTag)) return std::nullopt;
    return decode<RequestMessage>(buffer_);
  }
  // The next message from the coordinator, if one has arrived.
  std::optional<ResponseMessage> receive_response() {
    if (!receive(0, kResponseTag)) return std::nullopt;
    return decode<ResponseMessage>(buffer_);
  }

  // Sends still in progress.
  bool sending() const noexcept { return !sends_.empty(); }

  void progress() {
    std::erase_if(sends_, [](Send& s) {
      int done = 0;
      MPI_Test(&s.request, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
  }

  void drain() {
    // Control messages are small and already matched or buffered by the peer's probe; give them a
    // bounded time to complete, then let them go.
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < deadline) {
      progress();
      if (sends_.empty()) return;
    }
    for (auto& s : sends_) MPI_Request_free(&s.request);
    sends_.clear();
  }

 private:
  struct Send {
    MPI_Request request;
    std::shared_ptr<std::vector<char>> bytes;
  };

  bool receive(int source, int tag) {
    int flag = 0;
    MPI_Message handle;
    MPI_Status status;
    mpi_check(MPI_Improbe(source, tag, comm_, &flag, &handle, &status), "MPI_Improbe");
    if (!flag) return false;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    buffer_.resize(static_cast<std::size_t>(count));
    mpi_check(MPI_Mrecv(buffer_.data(), count, MPI_BYTE, &handle, MPI_STATUS_IGNORE), "MPI_Mrecv");
    return true;
  }

  void isend(std::shared_ptr<std::vector<char>> bytes, int to, int tag) {
    MPI_Request req;
    mpi_check(MPI_Isend(bytes->data(), static_cast<int>(bytes->size()), MPI_BYTE, to, tag, comm_,
                        &req),
              "MPI_Isend");
    sends_.push_back({req, std::move(bytes)});
  }

  MPI_Comm comm_;
  std::vector<Send> sends_;
  std::vector<char> buffer_;
};

}  // namespace dtrain::detail
