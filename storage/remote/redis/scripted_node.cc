#include "storage/remote/redis/scripted_node.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace kvtier::remote {
namespace {

constexpr int kPollMs = 20;  // how often blocked threads look at stop_

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::abort();
}

bool SendAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

ScriptedNode::ScriptedNode(Handler handler) : handler_(std::move(handler)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    Die("bind/listen 127.0.0.1:0");
  }
  port_ = ntohs(addr.sin_port);
  address_ = absl::StrCat("127.0.0.1:", port_);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ScriptedNode::~ScriptedNode() {
  stop_.store(true);
  acceptor_.join();
  std::vector<std::thread> workers;
  {
    absl::MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  for (std::thread& worker : workers) worker.join();
  ::close(listen_fd_);
}

void ScriptedNode::AcceptLoop() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, kPollMs) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    ++connections_;
    workers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void ScriptedNode::Serve(int fd) {
  redisReader* reader = redisReaderCreate();
  char buffer[64 * 1024];
  bool open = true;
  while (open && !stop_.load()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kPollMs) <= 0) continue;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    redisReaderFeed(reader, buffer, static_cast<size_t>(n));
    while (open) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader, &raw) != REDIS_OK) {
        open = false;
        break;
      }
      if (raw == nullptr) break;  // need more bytes
      const redisReply* command = static_cast<redisReply*>(raw);
      std::vector<std::string> argv;
      if (command->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < command->elements; ++i) {
          argv.emplace_back(command->element[i]->str, command->element[i]->len);
        }
      }
      freeReplyObject(raw);
      std::string answer;
      {
        absl::MutexLock lock(&mu_);
        commands_.push_back(argv);
        answer = handler_(argv);
      }
      if (answer == kClose) {
        open = false;
      } else if (answer != kNoReply && !SendAll(fd, answer)) {
        open = false;
      }
    }
  }
  redisReaderFree(reader);
  ::close(fd);
}

int ScriptedNode::connections() const {
  absl::MutexLock lock(&mu_);
  return connections_;
}

std::vector<std::vector<std::string>> ScriptedNode::commands() const {
  absl::MutexLock lock(&mu_);
  return commands_;
}

std::string ScriptedNode::Bulk(const std::string& bytes) {
  return absl::StrCat("$", bytes.size(), "\r\n", bytes, "\r\n");
}

std::string ScriptedNode::AllSlotsTo(const std::string& host, int port) {
  return absl::StrCat("*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n", Bulk(host), ":", port, "\r\n",
                      Bulk("0123456789abcdef0123456789abcdef01234567"));
}

}  // namespace kvtier::remote
