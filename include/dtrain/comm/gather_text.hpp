#pragma once
// Every rank's text, gathered on every rank: how init() compares settings, host names and errors
// across ranks. Whole texts of any length (a fixed-size slot would cut some and merge others).
#include <mpi.h>

#include <string>
#include <string_view>
#include <vector>

#include "dtrain/comm/mpi_error.hpp"

namespace dtrain::detail {

// Collective over `comm`: element r is rank r's `mine`.
inline std::vector<std::string> allgather_text(std::string_view mine, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(size));
  std::vector<int> offsets(static_cast<std::size_t>(size), 0);
  mpi_check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm), "MPI_Allgather");
  for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<std::size_t>(offsets.back() + lengths.back()), '\0');
  mpi_check(MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                           offsets.data(), MPI_CHAR, comm),
            "MPI_Allgatherv");
  std::vector<std::string> out;
  out.reserve(lengths.size());
  for (int r = 0; r < size; ++r) out.push_back(all.substr(offsets[r], lengths[r]));
  return out;
}

}  // namespace dtrain::detail
