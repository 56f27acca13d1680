#pragma once
// Definition of build_info() (core/version.hpp): the MPI library is asked at run time, so it is
// compiled where MPI is (Note [Build modes] in core/build_mode.hpp).
#include <mpi.h>

#include <string>

#include "dtrain/core/version.hpp"

namespace dtrain {

DTRAIN_API BuildInfo build_info() {
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
