#pragma once
// Library version and a description of what this binary was built with.
#include <mpi.h>

#include <string>

#include <fmt/format.h>

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

inline BuildInfo build_info() {
  BuildInfo b;
  b.dtrain_version = version();
#if defined(MPICH_VERSION)
  b.mpi_flavor = "mpich";
#elif defined(OPEN_MPI)
  b.mpi_flavor = "openmpi";
#else
  b.mpi_flavor = "unknown";
#endif
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(lib, &len);  // callable before MPI_Init (MPI-3)
  std::string text(lib, static_cast<std::size_t>(len));
  if (auto nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\0')) text.pop_back();
  b.mpi_library = text;
  auto provider = detail::nccl_version_provider();
  b.cuda = provider != nullptr;
  b.nccl_version = provider ? provider() : "none";
  return b;
}

}  // namespace dtrain
