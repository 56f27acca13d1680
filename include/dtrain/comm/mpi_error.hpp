#pragma once
// Turns MPI return codes into dtrain::CommunicationError. dtrain's communicators use
// MPI_ERRORS_RETURN so a failing call reports here instead of aborting the job.
#include <mpi.h>

#include <string>
#include <string_view>

#include "dtrain/core/error.hpp"

namespace dtrain::detail {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

inline void mpi_check(int code, std::string_view call) {
  if (code != MPI_SUCCESS)
    throw CommunicationError("dtrain: " + std::string(call) + " failed: " + mpi_error_string(code));
}

}  // namespace dtrain::detail
