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

// This machine's host name ("localhost" if it has none).
std::string HostName();

}  // namespace trainctl
