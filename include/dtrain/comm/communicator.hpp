#pragma once
// An MPI communicator with one owner.
//
// Note [Owned communicators]
// Every communicator dtrain makes (its duplicate of the world, the engine's control and data
// communicators, the host communicators, each process set's) belongs to exactly one
// Communicator, which frees it when it is destroyed or reset: move-only, so a copy can never
// free it twice, and a failed init frees what it made by unwinding. Two things a destructor
// cannot know stay explicit:
// - the order: a process set's communicators are split from the engine's, and the peer monitor
//   must drain its heartbeats before its communicator goes, so the engine releases them in its
//   own order (Engine::release_communicators);
// - when not to free: after a peer was lost, or with the engine thread blocked inside MPI, a
//   collective free could wait for ranks that will never come; abandon() then lets the handle go
//   unfreed, as MPI allows at exit. After MPI_Finalize nothing is freed (MPI forbids the call).
#include <mpi.h>

#include <string_view>
#include <utility>

#include "dtrain/comm/mpi_error.hpp"

namespace dtrain::detail {

class Communicator {
 public:
  Communicator() = default;
  // Takes ownership of `comm` and makes its errors return (mpi_check reports them).
  explicit Communicator(MPI_Comm comm) noexcept : comm_(comm) {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  Communicator(Communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator() { reset(); }

  // MPI_Comm_dup of `of`. Collective over `of`.
  static Communicator duplicate(MPI_Comm of) {
    MPI_Comm comm = MPI_COMM_NULL;
    mpi_check(MPI_Comm_dup(of, &comm), "MPI_Comm_dup");
    return Communicator(comm);
  }
  // MPI_Comm_split of `of`; empty for color MPI_UNDEFINED. Collective over `of`.
  static Communicator split(MPI_Comm of, int color, int key,
                            std::string_view call = "MPI_Comm_split") {
    MPI_Comm comm = MPI_COMM_NULL;
    mpi_check(MPI_Comm_split(of, color, key, &comm), call);
    return Communicator(comm);
  }

  MPI_Comm get() const noexcept { return comm_; }
  explicit operator bool() const noexcept { return comm_ != MPI_COMM_NULL; }

  // Frees the communicator now (Note [Owned communicators]: the engine's release order).
  void reset() noexcept {
    if (comm_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }
  // Lets the communicator go without freeing it (Note [Owned communicators]: when not to free).
  void abandon() noexcept { comm_ = MPI_COMM_NULL; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace dtrain::detail
