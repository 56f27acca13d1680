#pragma once
// The ranks' side of dtrainrun's notification protocol (Note [Elastic notification protocol] in
// tools/dtrain_launcher/elastic_notify.py; docs/elastic.md): one TCP round trip, `GEN\n` out,
// `GEN <target> <size>\n` back, bounded by a deadline. No MPI: rank 0 asks, State broadcasts.
//
// Note [Asking the launcher]
// The question is asked at a commit, while every other rank waits for the answer's broadcast, so
// it must never take long: the connection is non-blocking and every wait (connect, send, the
// answer's bytes) polls against one deadline. Whatever goes wrong (no route, refused, a silent
// peer, a line that is not an answer) is a missing answer, and a missing answer is not a resize:
// the world carries on, as the protocol says. The address is resolved once (it is normally an
// IPv4 literal; a host name is possible when dtrainrun found no route) and kept.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

namespace dtrain::detail {

inline constexpr std::size_t launcher_max_line_bytes = 64;  // MAX_REQUEST_BYTES, both ways

struct NotifyAddress {
  std::string host;
  std::uint16_t port = 0;
};

struct LauncherAnswer {
  std::int64_t target = 0;  // the generation dtrainrun wants running
  std::int64_t size = 0;    // ranks the next world would have (for messages)
};

template <class T>
bool parse_decimal(std::string_view text, T& value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

// "<address>:<port>", split at the last ':'; nothing when it is not that.
inline std::optional<NotifyAddress> parse_notify_address(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  unsigned port = 0;
  if (!parse_decimal(text.substr(colon + 1), port) || port == 0 || port > 65535)
    return std::nullopt;
  return NotifyAddress{std::string(text.substr(0, colon)), static_cast<std::uint16_t>(port)};
}

// "GEN <target> <size>" (the newline and a '\r' before it already stripped).
inline std::optional<LauncherAnswer> parse_launcher_answer(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (!line.starts_with("GEN ")) return std::nullopt;
  line.remove_prefix(4);
  const auto space = line.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  LauncherAnswer a;
  if (!parse_decimal(line.substr(0, space), a.target) ||
      !parse_decimal(line.substr(space + 1), a.size) || a.target < 0 || a.size < 0)
    return std::nullopt;
  return a;
}

// A file descriptor closed on scope exit.
class SocketFd {
 public:
  explicit SocketFd(int fd) noexcept : fd_(fd) {}
  SocketFd(const SocketFd&) = delete;
  SocketFd& operator=(const SocketFd&) = delete;
  ~SocketFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// The answer, or why there is none (for a warning).
struct AskOutcome {
  std::optional<LauncherAnswer> answer;
  std::string problem;
};

class LauncherClient {
 public:
  using Clock = std::chrono::steady_clock;

  LauncherClient(NotifyAddress address, std::chrono::milliseconds timeout)
      : address_(std::move(address)), timeout_(timeout) {}

  // One request and its answer (Note [Asking the launcher]).
  AskOutcome ask() {
    const auto deadline = Clock::now() + timeout_;
    if (!resolved_) {
      if (std::string why = resolve(); !why.empty()) return {std::nullopt, why};
    }
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return {std::nullopt, fmt::format("socket: {}", std::strerror(errno))};
    SocketFd socket(fd);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&peer_), sizeof peer_) != 0) {
      if (errno != EINPROGRESS)
        return {std::nullopt, fmt::format("connect: {}", std::strerror(errno))};
      if (!wait_for(fd, POLLOUT, deadline)) return {std::nullopt, "no connection in time"};
      int error = 0;
      socklen_t length = sizeof error;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) return {std::nullopt, fmt::format("connect: {}", std::strerror(error))};
    }
    constexpr std::string_view request = "GEN\n";
    std::size_t sent = 0;
    while (sent < request.size()) {
      const ::ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!wait_for(fd, POLLOUT, deadline))
          return {std::nullopt, "the request did not go out in time"};
      } else {
        return {std::nullopt, fmt::format("send: {}", std::strerror(errno))};
      }
    }
    std::string line;
    char buffer[launcher_max_line_bytes];
    while (line.find('\n') == std::string::npos) {
      if (line.size() > launcher_max_line_bytes)
        return {std::nullopt, "the answer is longer than a line of the protocol"};
      const ::ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n > 0) {
        line.append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0) {
        return {std::nullopt, line.empty() ? "the connection closed without an answer"
                                           : fmt::format("an incomplete answer '{}'", line)};
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_for(fd, POLLIN, deadline)) return {std::nullopt, "no answer in time"};
      } else {
        return {std::nullopt, fmt::format("recv: {}", std::strerror(errno))};
      }
    }
    line.resize(line.find('\n'));
    if (auto answer = parse_launcher_answer(line)) return {answer, {}};
    return {std::nullopt, fmt::format("the answer '{}' is not 'GEN <target> <size>'", line)};
  }

  const NotifyAddress& address() const noexcept { return address_; }

 private:
  std::string resolve() {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(address_.port);
    const int rc = ::getaddrinfo(address_.host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0 || found == nullptr)
      return fmt::format("cannot resolve '{}': {}", address_.host, ::gai_strerror(rc));
    std::memcpy(&peer_, found->ai_addr, sizeof peer_);
    ::freeaddrinfo(found);
    resolved_ = true;
    return {};
  }

  static bool wait_for(int fd, short events, Clock::time_point deadline) {
    for (;;) {
      // Rounded up: a poll that returned a fraction of a millisecond early would end the wait.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, events, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(left.count()));
      if (rc > 0) return true;
      if (rc < 0 && errno != EINTR) return false;
    }
  }

  NotifyAddress address_;
  std::chrono::milliseconds timeout_;
  sockaddr_in peer_{};
  bool resolved_ = false;
};

}  // namespace dtrain::detail
