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
#include <thread>
#include <vector>

#include "dtrain/comm/mpi_error.hpp"
#include "dtrain/runtime/negotiation/messages.hpp"

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

// Note [Settling a failed job]
// When the coordinator ends the job (a stall shutdown, a rank that ended it), every engine stops
// with requests perhaps still on their way to rank 0: a rank's own reason to end the job, sent
// before it learnt another rank's came first. Unreceived, they outlive the control communicator,
// and MPI may hand its context to the next dtrain::init()'s communicator, whose coordinator
// would then read a stale request as new (measured: a restarted job failed with the previous
// job's cause). So each rank's last control message says it is the last, and rank 0 reads and
// drops requests until every rank's last one has come, for at most a few seconds (a rank that
// died or hangs does not answer).
inline void settle_after_job_failure(ControlChannel& channel, int rank, int size,
                                     bool coordinator) {
  if (size == 1) return;
  if (!coordinator) {
    RequestMessage last;
    last.rank = rank;
    last.last = true;
    channel.send_request(last);
    return;
  }
  std::vector<bool> heard(static_cast<std::size_t>(size), false);
  int missing = size - 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
    auto m = channel.receive_request();
    if (!m) {
      channel.progress();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    const auto r = static_cast<std::size_t>(m->rank);
    if (m->last && r < heard.size() && !heard[r]) {
      heard[r] = true;
      --missing;
    }
  }
}

}  // namespace dtrain::detail
