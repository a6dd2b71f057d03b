// A real etcd (Debian's etcd-server) for tests, on free loopback ports: one per test process,
// started on first use (call Get() from the test's main thread: see SpawnOptions::die_with_parent).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tests/test_util.h"

namespace trainctl::testing {

// A real etcd (Debian's etcd-server) on free loopback ports, one for the whole test binary;
// every client gets a fresh key prefix so tests never see each other's keys.
class EtcdServer {
 public:
  static EtcdServer& Get() {
    static EtcdServer server;
    return server;
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  ~EtcdServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }

 private:
  static int FreePort() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }
  EtcdServer() {
    client_port_ = FreePort();
    int peer_port = FreePort();
    std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    SpawnOptions o;
    o.argv = {"etcd", "--name", "test", "--data-dir", scratch_.path("etcd"),
              "--listen-client-urls", client, "--advertise-client-urls", client,
              "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
              "--initial-cluster", "test=" + peer, "--logger", "zap", "--log-outputs",
              scratch_.path("etcd.log")};
    o.env = CurrentEnvironment();
    int out = ::open(scratch_.path("etcd.out").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    o.output_fd = out;  // etcd's own chatter stays out of the test output
    auto pid = Spawn(o);
    ::close(out);
    if (!pid.ok()) {
      ADD_FAILURE() << pid.status().ToString() << " (apt-get install etcd-server)";
      return;
    }
    pid_ = *pid;
  }
  Scratch scratch_;
  int client_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace trainctl::testing
