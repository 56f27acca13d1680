#pragma once
// A stand-in for dtrainrun's notification server (Note [Elastic notification protocol] in
// tools/dtrain_launcher/elastic_notify.py) on 127.0.0.1: it counts the requests it reads and
// answers each as its mode says, so tests can steer what the ranks hear.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace elastic_test {

class FakeLauncher {
 public:
  enum class Mode {
    answer,   // the answer line
    garbage,  // a line that is not an answer
    silent,   // reads the request and says nothing, keeping the connection open
    close,    // reads the request and closes the connection
  };

  explicit FakeLauncher(std::string answer = "GEN 0 1\n") : answer_(std::move(answer)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      throw std::runtime_error("FakeLauncher: cannot listen on 127.0.0.1");
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  FakeLauncher(const FakeLauncher&) = delete;
  FakeLauncher& operator=(const FakeLauncher&) = delete;
  ~FakeLauncher() {
    stop_ = true;
    thread_.join();
    for (int fd : held_) ::close(fd);
    ::close(listener_);
  }

  int port() const { return port_; }
  int requests() const { return requests_; }
  void set(Mode mode, std::string answer = {}) {
    std::lock_guard lock(mutex_);
    mode_ = mode;
    if (!answer.empty()) answer_ = std::move(answer);
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::string line;
      char c = 0;
      while (!stop_ && line.find('\n') == std::string::npos) {
        pollfd q{fd, POLLIN, 0};
        if (::poll(&q, 1, 20) <= 0) continue;
        if (::read(fd, &c, 1) != 1) break;
        line += c;
      }
      ++requests_;
      Mode mode;
      std::string answer;
      {
        std::lock_guard lock(mutex_);
        mode = mode_;
        answer = answer_;
      }
      if (mode == Mode::silent) {
        held_.push_back(fd);
        continue;
      }
      if (mode == Mode::answer) (void)!::write(fd, answer.data(), answer.size());
      if (mode == Mode::garbage) (void)!::write(fd, "HELLO\n", 6);
      ::close(fd);
    }
  }

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::mutex mutex_;
  Mode mode_ = Mode::answer;
  std::string answer_;
  std::vector<int> held_;
  std::thread thread_;
};

}  // namespace elastic_test
