#pragma once
// Library version and a description of what this binary was built with.
#include <string>

#include <fmt/format.h>

#include "dtrain/core/build_mode.hpp"

namespace dtrain {

inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;

inline std::string version() {
  return fmt::format("{}.{}.{}", version_major, version_minor, version_patch);
}

struct BuildInfo {
  std::string dtrain_version;
  std::string mpi_flavor;      // "mpich", "openmpi" or "unknown" (from the headers compiled against)
  std::string mpi_library;     // MPI_Get_library_version() of the library actually loaded
  bool cuda = false;           // built with the CUDA/NCCL device path
  std::string nccl_version;    // "none" without CUDA

  std::string to_string() const {
    return fmt::format("dtrain {}\n  MPI: {} ({})\n  CUDA: {}\n  NCCL: {}", dtrain_version,
                       mpi_flavor, mpi_library, cuda ? "yes" : "no", nccl_version);
  }
};

namespace detail {
// Set by <dtrain/cuda.hpp> so build_info() can report NCCL without the host build needing it.
inline std::string (*&nccl_version_provider() noexcept)() {
  static std::string (*provider)() = nullptr;
  return provider;
}
}  // namespace detail

// What this binary was built with; callable before init().
DTRAIN_API BuildInfo build_info();

}  // namespace dtrain

#ifdef DTRAIN_HEADER_ONLY
#include "dtrain/core/version_impl.hpp"
#endif
