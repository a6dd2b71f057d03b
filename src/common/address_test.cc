#include "common/address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <set>

namespace trainctl {
namespace {

// A listener on 127.0.0.1:port, as a task binds the port it was handed; -1 if it is taken.
int Listen(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The ports handed to a round's tasks: distinct, bindable once handed out, and below the range
// the kernel gives outgoing connections, so that a task's connection to a peer cannot take a
// port another task is about to bind (a job of 7 TF_CONFIG tasks lost a round to that).
TEST(LeasePorts, DistinctBindableAndOutsideTheOutgoingRange) {
  int lo = 32768, hi = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  for (int round = 0; round < 20; ++round) {
    auto lease = LeasePorts("127.0.0.1", 16);
    ASSERT_TRUE(lease.ok()) << lease.status().message();
    const std::vector<int>* ports = &lease->ports();
    ASSERT_EQ(ports->size(), 16u);
    EXPECT_EQ(std::set<int>(ports->begin(), ports->end()).size(), 16u) << "a port handed out twice";
    std::vector<int> fds;
    for (int port : *ports) {
      if (lo - 10000 >= 1024) {
        EXPECT_TRUE(port >= 10000 && port < lo) << port << " is in the outgoing range " << lo << "-" << hi;
      }
      const int fd = Listen(port);
      EXPECT_GE(fd, 0) << "port " << port << " was not free";
      fds.push_back(fd);
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
}

// Whether another process could claim `port` as an agent does (the abstract Unix socket
// "trainctl-port-N").
bool Claimable(int port) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un name{};
  name.sun_family = AF_UNIX;
  const int chars = std::snprintf(name.sun_path + 1, sizeof name.sun_path - 1, "trainctl-port-%d", port);
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + chars);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&name), len) == 0;
  ::close(fd);
  return ok;
}

// While a lease lives its ports are claimed host-wide, so that another agent (of this job on
// another node of the host, or of another job) skips them even before the tasks bind them; the
// claims go with the lease.
TEST(LeasePorts, PortsStayClaimedWhileTheLeaseLives) {
  std::vector<int> ports;
  {
    auto lease = LeasePorts("127.0.0.1", 4);
    ASSERT_TRUE(lease.ok()) << lease.status().message();
    ports = lease->ports();
    for (int port : ports) EXPECT_FALSE(Claimable(port)) << port;
    PortLease moved = std::move(*lease);  // the agent keeps it for the round
    for (int port : ports) EXPECT_FALSE(Claimable(port)) << port;
  }
  for (int port : ports) EXPECT_TRUE(Claimable(port)) << port;
}

}  // namespace
}  // namespace trainctl
