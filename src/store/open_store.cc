#include "store/open_store.h"

#include "store/etcd/etcd_store.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {
namespace {

constexpr const char* kEtcd = "etcd://";
constexpr const char* kTcp = "tcp://";

}  // namespace

Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const std::string& token,
                                         Duration connect_timeout) {
  if (url.rfind(kEtcd, 0) == 0) {
    EtcdStoreOptions o;
    ASSIGN_OR_RETURN(o.endpoints, ParseEtcdUrl(url));
    o.connect_timeout = connect_timeout;
    ASSIGN_OR_RETURN(auto store, EtcdStore::Connect(o));
    return std::unique_ptr<Store>(std::move(store));
  }
  std::string address = url.rfind(kTcp, 0) == 0 ? url.substr(std::string(kTcp).size()) : url;
  TcpStoreOptions o;
  RETURN_IF_ERROR(ParseHostPort(address, &o.host, &o.port));
  o.token = token;
  o.connect_timeout = connect_timeout;
  ASSIGN_OR_RETURN(auto store, TcpStore::Connect(o));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace trainctl
