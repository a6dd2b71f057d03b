#include "store/etcd/etcd_store.h"

#include <httplib.h>
#include <signal.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/strings.h"
#include "store/memory/memory_store.h"
#include "store/tcp/tcp_store.h"

namespace trainctl {
namespace {

using nlohmann::json;

// How long one member has to answer an idempotent request before the next is tried.
constexpr Duration kAttempt = std::chrono::seconds(2);

constexpr const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// Polls `probe` (true: done) with backoff from 2 ms to 50 ms until `deadline`.
template <typename F>
Result<bool> PollUntil(Clock::time_point deadline, F probe) {
  Duration pause(2);
  while (true) {
    ASSIGN_OR_RETURN(bool done, probe());
    if (done) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::min(pause, Remaining(deadline)));
    pause = std::min(pause * 2, Duration(50));
  }
}

}  // namespace

std::string Base64Encode(const std::string& in) {
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v =
        static_cast<uint8_t>(in[i]) << 16 | static_cast<uint8_t>(in[i + 1]) << 8 | static_cast<uint8_t>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint8_t>(in[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(const std::string& in) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const char* p = std::strchr(kAlphabet, c);
    if (!p || c == '\0') return InvalidArgument("invalid base64 from etcd");
    v = v << 6 | static_cast<uint32_t>(p - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 0xff);
    }
  }
  return out;
}

EtcdStore::EtcdStore(EtcdStoreOptions options) : options_(std::move(options)) {}
EtcdStore::~EtcdStore() = default;

Result<std::unique_ptr<EtcdStore>> EtcdStore::Connect(const EtcdStoreOptions& options) {
  if (options.endpoints.empty()) return InvalidArgument("no etcd endpoints given");
  // OpenSSL writes to the socket with write(): a member that drops the connection would end the
  // process with SIGPIPE instead of giving an error to retry on.
  if (options.tls) ::signal(SIGPIPE, SIG_IGN);
  for (const auto& e : options.endpoints) {
    std::string host;
    uint16_t port;
    RETURN_IF_ERROR(ParseHostPort(e, &host, &port));
  }
  std::unique_ptr<EtcdStore> store(new EtcdStore(options));
  // The gateway answers a range only once the member serves requests: retries over all members,
  // bounded by connect_timeout, in rounds of at most half a second that a stop ends.
  const auto deadline = Clock::now() + options.connect_timeout;
  while (true) {
    auto probe = store->PostBy("kv/range", json{{"key", Base64Encode("/trainctl/")}}.dump(),
                               std::min(deadline, Clock::now() + std::chrono::milliseconds(500)));
    if (probe.ok()) return store;
    if (probe.status().code() == Code::kPermissionDenied) return probe.status();
    if (options.stop && options.stop()) {
      return Aborted("stopped while connecting to etcd at " + Join(options.endpoints, ", "));
    }
    if (Clock::now() >= deadline) {
      return Unavailable("cannot reach etcd at " + Join(options.endpoints, ", ") + ": " + probe.status().message());
    }
  }
}

Status EtcdStore::Authenticate(std::chrono::microseconds attempt) {
  // Without the old token: etcd refuses an authentication that carries a token it no longer
  // knows ("invalid auth token"), which is why a new one is wanted.
  client_->set_default_headers({});
  client_->set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(options_.request_timeout));
  auto res = client_->Post("/v3/auth/authenticate",
                           json{{"name", options_.user}, {"password", options_.password}}.dump(), "application/json");
  client_->set_read_timeout(attempt);
  if (!res) return Unavailable("etcd authentication: " + httplib::to_string(res.error()));
  if (res->status != 200) {
    return PermissionDenied("etcd refused user " + options_.user + ": " + res->body);
  }
  try {
    auth_token_ = json::parse(res->body).at("token").get<std::string>();
  } catch (const json::exception& e) {
    return Internal(std::string("etcd's authentication reply: ") + e.what());
  }
  return Status::Ok();
}

Result<std::string> EtcdStore::Post(const std::string& path, const std::string& body) {
  return PostBy(path, body, Clock::now() + options_.request_timeout);
}

Result<std::string> EtcdStore::PostBy(const std::string& path, const std::string& body, Clock::time_point deadline) {
  // A transaction whose reply was lost may have been applied: retrying it could apply it twice.
  // Everything else here is idempotent, and a request refused or never delivered is safe to
  // resend; those go round the members until request_timeout (a leader election takes ~1 s).
  const bool idempotent = path != "kv/txn";
  std::lock_guard<std::mutex> lock(mu_);
  std::string last_error;
  while (true) {
    const std::string& endpoint = options_.endpoints[current_];
    // A member that accepts but does not answer (stopped, or cut off from the quorum) is left
    // after kAttempt for the next one; a transaction, which cannot be resent, waits it out.
    const auto attempt = std::chrono::duration_cast<std::chrono::microseconds>(
        std::max(Duration(1), idempotent ? std::min(kAttempt, Remaining(deadline)) : Remaining(deadline)));
    const bool fresh = !client_;
    if (fresh) {
      std::string host;
      uint16_t port = 0;
      RETURN_IF_ERROR(ParseHostPort(endpoint, &host, &port));
      if (options_.tls) {
        client_ = options_.cert_file.empty()
                      ? std::make_unique<httplib::Client>("https://" + endpoint)
                      : std::make_unique<httplib::Client>("https://" + endpoint, options_.cert_file, options_.key_file);
        client_->enable_server_certificate_verification(true);
        if (!options_.ca_file.empty()) client_->set_ca_cert_path(options_.ca_file.c_str());
      } else {
        client_ = std::make_unique<httplib::Client>(host, port);
      }
      client_->set_connection_timeout(attempt);
      client_->set_keep_alive(true);  // one connection (one TLS handshake) per member, not per request
      client_->set_tcp_nodelay(true);
    }
    client_->set_read_timeout(attempt);
    client_->set_write_timeout(attempt);
    if (fresh && !options_.user.empty() && path != "auth/authenticate") {
      if (auth_token_.empty()) {
        if (Status st = Authenticate(attempt); st.code() == Code::kPermissionDenied) return st;
      }
      client_->set_default_headers({{"Authorization", auth_token_}});
    }
    auto res = client_->Post(("/v3/" + path).c_str(), body, "application/json");
    if (res && res->status == 200) return res->body;
    if (res && !options_.user.empty() && path != "auth/authenticate" &&
        res->body.find("invalid auth token") != std::string::npos) {
      // Expired (etcd's simple tokens live 5 minutes) or forgotten (auth disabled and enabled
      // again, a restarted member): a new one, once.
      auth_token_.clear();
      if (Status st = Authenticate(attempt); !st.ok()) {
        client_.reset();  // a reply cut off by its timeout leaves the connection unusable
        return st;
      }
      client_->set_default_headers({{"Authorization", auth_token_}});
      res = client_->Post(("/v3/" + path).c_str(), body, "application/json");
      if (res && res->status == 200) return res->body;
    }
    if (res && (res->status == 401 || res->status == 403)) {
      return PermissionDenied("etcd at " + endpoint + " refused the request: " + res->body);
    }
    bool delivered_maybe = !res && res.error() != httplib::Error::Connection;
    last_error = endpoint + ": " +
                 (res ? "HTTP " + std::to_string(res->status) + " " + res->body : httplib::to_string(res.error()));
    client_.reset();  // next time, the next member
    current_ = (current_ + 1) % options_.endpoints.size();
    if ((delivered_maybe && !idempotent) || Clock::now() >= deadline) break;
    if (current_ == 0) std::this_thread::sleep_for(std::min(Duration(100), Remaining(deadline)));
  }
  return Unavailable("etcd request " + path + " failed: " + last_error);
}

Result<EtcdStore::Value> EtcdStore::Range(const std::string& key) {
  ASSIGN_OR_RETURN(std::string reply, Post("kv/range", json{{"key", Base64Encode(key)}}.dump()));
  Value v;
  try {
    json j = json::parse(reply);
    if (!j.contains("kvs") || j["kvs"].empty()) return v;
    const json& kv = j["kvs"][0];
    v.exists = true;
    v.mod_revision = kv.at("mod_revision").get<std::string>();
    if (kv.contains("value")) {
      ASSIGN_OR_RETURN(v.data, Base64Decode(kv["value"].get<std::string>()));
    }
  } catch (const json::exception& e) {
    return Internal(std::string("unexpected reply from etcd: ") + e.what());
  }
  return v;
}

Result<bool> EtcdStore::PutIf(const std::string& key, const Value& seen, const std::string& value) {
  json compare =
      seen.exists
          ? json{{"key", Base64Encode(key)},
                 {"target", "MOD"},
                 {"result", "EQUAL"},
                 {"mod_revision", seen.mod_revision}}
          : json{{"key", Base64Encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}};
  json txn = {
      {"compare", json::array({compare})},
      {"success", json::array({{{"request_put", {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}}}}})}};
  ASSIGN_OR_RETURN(std::string reply, Post("kv/txn", txn.dump()));
  try {
    json j = json::parse(reply);
    return j.value("succeeded", false);
  } catch (const json::exception& e) {
    return Internal(std::string("unexpected reply from etcd: ") + e.what());
  }
}

Status EtcdStore::Set(const std::string& key, const std::string& value) {
  auto r = Post("kv/put", json{{"key", Base64Encode(key)}, {"value", Base64Encode(value)}}.dump());
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::optional<std::string>> EtcdStore::TryGet(const std::string& key) {
  ASSIGN_OR_RETURN(Value v, Range(key));
  if (!v.exists) return std::optional<std::string>();
  return std::optional<std::string>(std::move(v.data));
}

Result<std::string> EtcdStore::Get(const std::string& key, Duration timeout) {
  std::string value;
  ASSIGN_OR_RETURN(bool found, PollUntil(Clock::now() + timeout, [&]() -> Result<bool> {
                     ASSIGN_OR_RETURN(Value v, Range(key));
                     if (v.exists) value = std::move(v.data);
                     return v.exists;
                   }));
  if (!found) return KeysTimeout({key}, timeout);
  return value;
}

Result<int64_t> EtcdStore::Add(const std::string& key, int64_t delta) {
  while (true) {
    ASSIGN_OR_RETURN(Value v, Range(key));
    KvTable table;  // the shared integer rules, on this one value
    if (v.exists) table.Set(key, v.data);
    ASSIGN_OR_RETURN(int64_t next, table.Add(key, delta));
    ASSIGN_OR_RETURN(bool done, PutIf(key, v, std::to_string(next)));
    if (done) return next;
  }
}

Result<std::string> EtcdStore::CompareSet(const std::string& key, const std::string& expected,
                                          const std::string& desired) {
  while (true) {
    ASSIGN_OR_RETURN(Value v, Range(key));
    std::string current = v.exists ? v.data : "";
    if (current != expected) return current;
    ASSIGN_OR_RETURN(bool done, PutIf(key, v, desired));
    if (done) return desired;
  }
}

Status EtcdStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  auto all = PollUntil(Clock::now() + timeout, [&]() -> Result<bool> {
    for (const auto& k : keys) {
      ASSIGN_OR_RETURN(Value v, Range(k));
      if (!v.exists) return false;
    }
    return true;
  });
  if (!all.ok()) return all.status();
  return *all ? Status::Ok() : KeysTimeout(keys, timeout);
}

Result<bool> EtcdStore::Delete(const std::string& key) {
  ASSIGN_OR_RETURN(std::string reply, Post("kv/deleterange", json{{"key", Base64Encode(key)}}.dump()));
  try {
    json j = json::parse(reply);
    return j.contains("deleted") && j["deleted"].get<std::string>() != "0";
  } catch (const json::exception& e) {
    return Internal(std::string("unexpected reply from etcd: ") + e.what());
  }
}

}  // namespace trainctl

extern "C" __attribute__((visibility("default"))) void trainctl_etcd_connect(
    const trainctl::EtcdStoreOptions& options, trainctl::Result<std::unique_ptr<trainctl::Store>>* out) {
  auto store = trainctl::EtcdStore::Connect(options);
  if (store.ok()) {
    *out = std::unique_ptr<trainctl::Store>(std::move(*store));
  } else {
    *out = store.status();
  }
}
