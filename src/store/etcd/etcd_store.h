// EtcdStore: the Store interface on an etcd v3 cluster, through etcd's JSON gateway
// (POST /v3/kv/range, /put, /txn, /deleterange). Add and CompareSet are optimistic transactions
// on the key's mod_revision, retried on conflict, so concurrent agents never lose an update; Get
// and Wait poll with backoff until their deadline.
//
// Thread-safe (one HTTP connection behind a mutex, held per request, never across a wait).
// Several endpoints may be given; a request that cannot reach one tries the next, so a cluster
// keeps serving while a member is down. TLS (with a client certificate when etcd asks for one) and
// etcd's user/password auth (a token from /v3/auth/authenticate, renewed when etcd says it
// expired) are options.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/store.h"

namespace httplib {
class Client;
}

namespace trainctl {

struct EtcdStoreOptions {
  std::vector<std::string> endpoints;                   // "host:port" client URLs
  bool tls = false;                                     // https, verifying the server
  std::string ca_file;                                  // its CA ("": the system's)
  std::string cert_file, key_file;                      // a client certificate ("": none)
  std::string user, password;                           // etcd's auth ("": none)
  Duration connect_timeout = std::chrono::seconds(30);  // Connect() retries until then
  Duration request_timeout = std::chrono::seconds(10);  // one request, on whichever members answer
  // While Connect() retries: asked at least every half second; true ends it with kAborted (a
  // stop signal came).
  std::function<bool()> stop;
};

class EtcdStore : public Store {
 public:
  // Connects to the first endpoint that answers, retrying until connect_timeout.
  static Result<std::unique_ptr<EtcdStore>> Connect(const EtcdStoreOptions& options);
  ~EtcdStore() override;

  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, Duration timeout) override;
  Result<std::optional<std::string>> TryGet(const std::string& key) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;
  Result<std::string> CompareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  Result<bool> Delete(const std::string& key) override;

 private:
  struct Value {
    bool exists = false;
    std::string data;
    std::string mod_revision;
  };
  explicit EtcdStore(EtcdStoreOptions options);
  // POSTs a JSON body to /v3/<path> and returns the reply text, going round the members on
  // failures that are safe to retry until request_timeout (PostBy: until `deadline`).
  Result<std::string> Post(const std::string& path, const std::string& body);
  Result<std::string> PostBy(const std::string& path, const std::string& body, Clock::time_point deadline);
  Result<Value> Range(const std::string& key);
  // Sets key to `value` if it still has `seen` (absent, or the same mod_revision).
  Result<bool> PutIf(const std::string& key, const Value& seen, const std::string& value);

  // Asks etcd for an auth token (mu_ held); kPermissionDenied for a wrong user or password.
  // A new token for options_.user, waited for up to request_timeout (etcd checks the password with
  // bcrypt: a busy member takes longer than one of a request's attempts), then the client's read
  // timeout set back to `attempt`.
  Status Authenticate(std::chrono::microseconds attempt);

  EtcdStoreOptions options_;
  std::string auth_token_;
  std::mutex mu_;
  size_t current_ = 0;
  std::unique_ptr<httplib::Client> client_;
};

// The store's code, with cpp-httplib and OpenSSL, lives in the plugin trainctl-http.so
// (common/plugin.h); OpenStore reaches EtcdStore::Connect through this entry point.
using EtcdConnectEntry = void (*)(const EtcdStoreOptions& options, Result<std::unique_ptr<Store>>* out);
inline constexpr const char* kEtcdConnectEntry = "trainctl_etcd_connect";

// Standard base64, as etcd's gateway encodes keys and values.
std::string Base64Encode(const std::string& in);
Result<std::string> Base64Decode(const std::string& in);

}  // namespace trainctl
