// Network addresses as users write them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl {

// Parses "host:port" (or "[v6]:port").
Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port);
// "host:port", an IPv6 address in brackets: what ParseHostPort reads.
std::string JoinHostPort(const std::string& host, int port);
// Whether `host` names this machine's loopback (127.x.y.z, ::1, localhost): only local processes
// reach a server bound there.
bool IsLoopbackHost(const std::string& host);
// Whether `host` (a name or an address) is this machine: loopback, its host name, or an address
// of one of its interfaces.
bool IsThisMachine(const std::string& host);
// An etcd cluster as a spec's `rendezvous` names it:
//   etcd://host:port[,host:port...]            plain HTTP
//   etcds://host:port[,...]?ca=FILE&cert=FILE&key=FILE&user=NAME
// etcds is TLS, checked against `ca` (the system's CAs without it); `cert` and `key` are a client
// certificate (etcd's --client-cert-auth); `user` is etcd's own auth, whose password comes from
// the environment (TRAINCTL_ETCD_PASSWORD), never the URL. Each option also works with etcd://
// except the certificate files.
struct EtcdUrl {
  std::vector<std::string> endpoints;  // "host:port"
  bool tls = false;
  std::string ca, cert, key, user;
};
Result<EtcdUrl> ParseEtcdUrl(const std::string& url);
bool IsEtcdUrl(const std::string& url);

// Ports handed to tasks that bind them moments later (torch's TCPStore, TensorFlow's servers; as
// torchrun and Kubeflow hand them out). Each is free on the host when chosen and drawn at random
// below the kernel's range for the local ports of outgoing connections
// (net.ipv4.ip_local_port_range), so that no connection a task opens meanwhile takes one. While
// the lease lives, each port is also claimed host-wide (an abstract Unix socket named after it,
// which the kernel drops with the process): other trainctl agents on the host, of this job or
// another, skip it. Where the range leaves too little room, the kernel's own choices (port 0).
class PortLease {
 public:
  PortLease() = default;
  PortLease(PortLease&& other) noexcept;
  PortLease& operator=(PortLease&& other) noexcept;
  PortLease(const PortLease&) = delete;
  PortLease& operator=(const PortLease&) = delete;
  ~PortLease();

  const std::vector<int>& ports() const { return ports_; }

 private:
  friend Result<PortLease> LeasePorts(const std::string& host, size_t n);
  void Release();
  std::vector<int> ports_;
  std::vector<int> claims_;  // the abstract sockets, one per port
};

// n distinct ports on `host`.
Result<PortLease> LeasePorts(const std::string& host, size_t n);

// This machine's host name ("localhost" if it has none).
std::string HostName();

}  // namespace trainctl
