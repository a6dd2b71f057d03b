#include "store/open_store.h"

#include <cstdlib>

#include "common/plugin.h"
#include "store/etcd/etcd_store.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {
namespace {

constexpr const char* kTcp = "tcp://";
constexpr const char* kUnix = "unix:";

}  // namespace

Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const std::string& token, Duration connect_timeout,
                                         const std::function<bool()>& stop, int interrupt_fd) {
  if (IsEtcdUrl(url)) {
    ASSIGN_OR_RETURN(EtcdUrl parsed, ParseEtcdUrl(url));
    EtcdStoreOptions o;
    o.endpoints = parsed.endpoints;
    o.tls = parsed.tls;
    o.ca_file = parsed.ca;
    o.cert_file = parsed.cert;
    o.key_file = parsed.key;
    o.user = parsed.user;
    if (!o.user.empty()) {
      const char* password = std::getenv(kEnvEtcdPassword);
      if (!password) {
        return InvalidArgument(std::string("etcd user ") + o.user + ": set " + kEnvEtcdPassword +
                               " to its password (it is never taken from the URL or the spec)");
      }
      o.password = password;
    }
    o.connect_timeout = connect_timeout;
    o.stop = stop;
    ASSIGN_OR_RETURN(auto connect, PluginFunction<EtcdConnectEntry>(kHttpPlugin, kEtcdConnectEntry));
    Result<std::unique_ptr<Store>> store = Unavailable("not connected");
    connect(o, &store);
    return store;
  }
  TcpStoreOptions o;
  if (url.rfind(kUnix, 0) == 0) {
    o.unix_path = url.substr(std::string(kUnix).size());
  } else {
    RETURN_IF_ERROR(
        ParseHostPort(url.rfind(kTcp, 0) == 0 ? url.substr(std::string(kTcp).size()) : url, &o.host, &o.port));
  }
  o.token = token;
  o.connect_timeout = connect_timeout;
  o.stop = stop;
  o.interrupt_fd = interrupt_fd;
  ASSIGN_OR_RETURN(auto store, TcpStore::Connect(o));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace trainctl
