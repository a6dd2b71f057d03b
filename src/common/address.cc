#include "common/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string_view>

namespace trainctl {

bool IsLoopbackHost(const std::string& host) {
  return host.rfind("127.", 0) == 0 || host == "::1" || host == "localhost";
}

bool IsThisMachine(const std::string& host) {
  if (IsLoopbackHost(host) || host == HostName()) return true;
  // An IPv4 or IPv6 address's bytes, to compare with the interfaces' ("" for other families).
  auto bytes = [](const sockaddr* a) -> std::string_view {
    if (a && a->sa_family == AF_INET)
      return {reinterpret_cast<const char*>(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr), 4};
    if (a && a->sa_family == AF_INET6)
      return {reinterpret_cast<const char*>(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr), 16};
    return {};
  };
  struct addrinfo hints {};
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  struct ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) ifs = nullptr;
  bool found = false;
  for (auto* ai = res; ai && !found; ai = ai->ai_next) {
    const std::string_view want = bytes(ai->ai_addr);
    if (want.empty()) continue;
    // A name for loopback (Debian's 127.0.1.1 for the host name), or an interface's address.
    found = ai->ai_family == AF_INET
                ? want[0] == 127
                : IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr);
    for (auto* i = ifs; i && !found; i = i->ifa_next) found = bytes(i->ifa_addr) == want;
  }
  if (ifs) ::freeifaddrs(ifs);
  ::freeaddrinfo(res);
  return found;
}

std::string JoinHostPort(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("expected host:port, got \"" + text + "\"");
  }
  std::string h = text.substr(0, colon);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  char* end = nullptr;
  long p = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) {
    return InvalidArgument("expected a port from 1 to 65535 in \"" + text + "\"");
  }
  *host = h;
  *port = static_cast<uint16_t>(p);
  return Status::Ok();
}

bool IsEtcdUrl(const std::string& url) { return url.rfind("etcd://", 0) == 0 || url.rfind("etcds://", 0) == 0; }

Result<EtcdUrl> ParseEtcdUrl(const std::string& url) {
  const std::string expected =
      "expected etcd://host:port[,host:port...] or etcds://... with "
      "?ca=FILE&cert=FILE&key=FILE&user=NAME, got \"" +
      url + "\"";
  EtcdUrl out;
  std::string rest;
  if (url.rfind("etcd://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("etcds://", 0) == 0) {
    rest = url.substr(8);
    out.tls = true;
  } else {
    return InvalidArgument(expected);
  }
  const size_t q = rest.find('?');
  const std::string hosts = rest.substr(0, q);
  size_t start = 0;
  while (start <= hosts.size()) {
    size_t comma = hosts.find(',', start);
    if (comma == std::string::npos) comma = hosts.size();
    std::string endpoint = hosts.substr(start, comma - start);
    std::string host;
    uint16_t port;
    if (!ParseHostPort(endpoint, &host, &port).ok()) return InvalidArgument(expected);
    out.endpoints.push_back(endpoint);
    start = comma + 1;
  }
  if (q != std::string::npos) {
    std::string query = rest.substr(q + 1);
    size_t pos = 0;
    while (pos <= query.size()) {
      size_t amp = query.find('&', pos);
      if (amp == std::string::npos) amp = query.size();
      const std::string item = query.substr(pos, amp - pos);
      const size_t eq = item.find('=');
      const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
      std::string* field = key == "ca"     ? &out.ca
                           : key == "cert" ? &out.cert
                           : key == "key"  ? &out.key
                           : key == "user" ? &out.user
                                           : nullptr;
      if (!field || value.empty()) {
        return InvalidArgument("etcd URL option \"" + item + "\": expected ca=FILE, cert=FILE, key=FILE or user=NAME");
      }
      if (field != &out.user && value[0] != '/') {
        return InvalidArgument("etcd URL option " + key + "=" + value + ": expected an absolute path");
      }
      *field = value;
      pos = amp + 1;
    }
  }
  if (!out.tls && (!out.ca.empty() || !out.cert.empty() || !out.key.empty())) {
    return InvalidArgument("etcd URL: ca, cert and key go with etcds:// (TLS), got \"" + url + "\"");
  }
  if (out.cert.empty() != out.key.empty()) {
    return InvalidArgument("etcd URL: a client certificate needs both cert and key, got \"" + url + "\"");
  }
  return out;
}

std::string HostName() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

namespace {

// The first port of the kernel's range for the local ports of outgoing connections (Linux's
// default range: 32768-60999).
int FirstEphemeralPort() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 32768;
  return f >> lo && lo >= 1 ? lo : 32768;
}

}  // namespace

PortLease::PortLease(PortLease&& other) noexcept : ports_(std::move(other.ports_)), claims_(std::move(other.claims_)) {
  other.claims_.clear();
}

PortLease& PortLease::operator=(PortLease&& other) noexcept {
  if (this != &other) {
    Release();
    ports_ = std::move(other.ports_);
    claims_ = std::move(other.claims_);
    other.claims_.clear();
  }
  return *this;
}

PortLease::~PortLease() { Release(); }

void PortLease::Release() {
  for (int fd : claims_) ::close(fd);
  claims_.clear();
  ports_.clear();
}

Result<PortLease> LeasePorts(const std::string& host, size_t n) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &res) != 0) {
    return InvalidArgument("cannot resolve this node's address " + host);
  }
  sockaddr_storage addr{};
  const socklen_t addr_len = res->ai_addrlen;
  std::memcpy(&addr, res->ai_addr, addr_len);
  ::freeaddrinfo(res);
  auto set_port = [&](int port) {
    if (addr.ss_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(static_cast<uint16_t>(port));
    } else {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(static_cast<uint16_t>(port));
    }
  };
  PortLease lease;
  std::vector<int> bound;  // the ports' own sockets, held until all are chosen
  auto fail = [&](const Status& st) {
    for (int fd : bound) ::close(fd);
    return st;
  };
  // Binds `port` (0: the kernel picks) and claims it; false if either is taken.
  auto take = [&](int port) -> Result<bool> {
    int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoStatus("cannot find a free port on " + host, errno);
    set_port(port);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EADDRINUSE || err == EACCES) return false;
      return ErrnoStatus("cannot find a free port on " + host, err);
    }
    sockaddr_storage got{};
    socklen_t len = sizeof got;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&got), &len);
    const int chosen = ntohs(got.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                                       : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    int claim = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un name{};
    name.sun_family = AF_UNIX;
    // Abstract (a leading NUL): no file, gone with the process.
    const int chars = std::snprintf(name.sun_path + 1, sizeof name.sun_path - 1, "trainctl-port-%d", chosen);
    const socklen_t name_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + chars);
    if (claim < 0 || ::bind(claim, reinterpret_cast<sockaddr*>(&name), name_len) != 0) {
      if (claim >= 0) ::close(claim);
      ::close(fd);
      return false;  // another agent holds it
    }
    bound.push_back(fd);
    lease.claims_.push_back(claim);
    lease.ports_.push_back(chosen);
    return true;
  };
  // Below the outgoing range, above the well-known services' (1024-9999).
  constexpr int kLowest = 10000;
  const int below = FirstEphemeralPort();
  if (below - kLowest >= 1024) {
    std::mt19937 rng{std::random_device{}()};
    std::uniform_int_distribution<int> pick(kLowest, below - 1);
    for (size_t tries = 0; lease.ports_.size() < n && tries < 64 * n; ++tries) {
      auto took = take(pick(rng));
      if (!took.ok()) return fail(took.status());
    }
  }
  for (size_t tries = 0; lease.ports_.size() < n; ++tries) {
    auto took = take(0);
    if (!took.ok()) return fail(took.status());
    if (!*took && tries >= 64 * n) return fail(Unavailable("cannot find a free port on " + host));
  }
  for (int fd : bound) ::close(fd);
  return lease;
}

}  // namespace trainctl
