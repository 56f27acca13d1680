#pragma once
// This host's name, for messages, profiles and elastic commit folders.
#include <unistd.h>

#include <string>

namespace dtrain::detail {

// The kernel's host name, or "localhost" where it cannot be read.
inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// `host_id` where set (Config::host_id, DTRAIN_HOST_ID: hosts emulated on one machine), else the
// kernel's host name.
inline std::string host_label(const std::string& host_id) {
  return host_id.empty() ? host_name() : host_id;
}

}  // namespace dtrain::detail
