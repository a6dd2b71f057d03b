// Opens a job's store from its URL, the one form in which launchers hand it to agents:
//   tcp://host:port        the embedded TCP store (token required)
//   unix:@name, unix:PATH  the same on a Unix socket, abstract or a file (a local job's store)
//   etcd://host:port[,host:port...]   an etcd v3 cluster (the spec's `rendezvous:`); etcds://
//                          with TLS and options (common/address.h)
// A bare "host:port" means tcp.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "store/store.h"

namespace trainctl {

// The password of the etcd user that an etcd URL names (?user=NAME), for every process of the job.
inline constexpr const char* kEnvEtcdPassword = "TRAINCTL_ETCD_PASSWORD";

// Retries until `connect_timeout` while the store is not there yet; `stop`, when given, is asked
// meanwhile (at least every half second): true ends the wait with kAborted. The TCP store's waits
// on keys end with kAborted as `interrupt_fd` becomes readable (TcpStoreOptions::interrupt_fd).
Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const std::string& token,
                                         Duration connect_timeout = std::chrono::seconds(30),
                                         const std::function<bool()>& stop = nullptr, int interrupt_fd = -1);

}  // namespace trainctl
