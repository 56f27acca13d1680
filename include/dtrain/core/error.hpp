#pragma once
// Error types. Every failure a user can see derives from dtrain::Error so one catch clause covers
// the library; the subclasses tell local misuse apart from cross-rank disagreement and failures.
#include <stdexcept>
#include <string>

namespace dtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A dtrain function was called before dtrain::init() or after dtrain::shutdown().
class NotInitializedError : public Error {
 public:
  explicit NotInitializedError(const std::string& what) : Error(what) {}
};

// Local misuse: bad root, wrong splits, null data with a non-zero count, invalid knob values.
class InvalidArgumentError : public Error {
 public:
  explicit InvalidArgumentError(const std::string& what) : Error(what) {}
};

// Ranks disagree about an op (kind, dtype, shape, root, reduce op, scale factors, device).
class MismatchError : public Error {
 public:
  explicit MismatchError(const std::string& what) : Error(what) {}
};

// An op or a wait did not complete in time.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

// The engine stopped. The message carries the first root cause, never a bare "shut down".
class ShutdownError : public Error {
 public:
  explicit ShutdownError(const std::string& what) : Error(what) {}
};

// A failure reported by the communication library (MPI or NCCL) itself.
class CommunicationError : public Error {
 public:
  explicit CommunicationError(const std::string& what) : Error(what) {}
};

}  // namespace dtrain
