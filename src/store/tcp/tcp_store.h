// The embedded TCP store: a server that the launcher runs (one thread, epoll) and a client that
// implements Store. The server binds loopback unless told otherwise (or a Unix socket, for a
// local job) and refuses any connection that does not present the job's token first.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/address.h"
#include "store/store.h"

namespace trainctl {

struct TcpStoreServerOptions {
  std::string host = "127.0.0.1";  // "0.0.0.0" to serve other hosts
  uint16_t port = 0;               // 0: any free port (see port())
  // Serve on a Unix-domain socket in the abstract namespace, a name the kernel picks, instead of
  // host:port: for a job whose processes all run here (requests take 0.65-0.8 of loopback TCP's
  // time). Only this user's (and root's) processes may connect; they still present the token.
  bool unix_socket = false;
  std::string token;  // required; clients must present it
  // Connections at once (also kept under the open-file limit, with room for the process's own).
  int max_connections = 1024;
  // Connections that have not presented the token yet, at once: when one more arrives, the
  // oldest of them is closed, so a flood of them never crowds out the job's own clients (which
  // say hello at once). Each may send one hello of at most 4 KiB, within auth_timeout.
  int max_unauthenticated = 64;
  Duration auth_timeout = std::chrono::seconds(10);  // close connections that never say hello
};

class TcpStoreServer {
 public:
  // Binds, listens and starts the serving thread.
  static Result<std::unique_ptr<TcpStoreServer>> Start(const TcpStoreServerOptions& options);
  ~TcpStoreServer();  // Stop()s
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }
  const std::string& host() const { return options_.host; }
  // Where clients connect, as OpenStore takes it: tcp://host:port, or unix:@name.
  std::string url() const;
  // Closes every connection (clients see kUnavailable) and joins the thread. Idempotent.
  void Stop();

 private:
  struct State;
  TcpStoreServer(TcpStoreServerOptions options, int listen_fd, int wake_fd[2], uint16_t port, std::string unix_name);
  void Serve();

  TcpStoreServerOptions options_;
  int listen_fd_;
  int wake_read_, wake_write_;
  uint16_t port_;
  std::string unix_name_;  // "@name" when serving on a Unix socket
  std::unique_ptr<State> state_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

// The job's store as a launcher or node 0's agent serves it: room for `clients` connections (every
// agent and task of the job) and then some, within an open-file limit raised to fit; on a Unix
// socket when `options` asks for one and this system allows it, else on TCP at options.host.
Result<std::unique_ptr<TcpStoreServer>> ServeJobStore(TcpStoreServerOptions options, int clients);

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string unix_path;  // when set, the server's Unix socket instead of host:port ("@name": abstract)
  std::string token;
  Duration connect_timeout = std::chrono::seconds(30);  // retried until then (server starting)
  Duration io_timeout = std::chrono::seconds(30);       // for calls that do not wait
  // While Connect() retries and greets: asked every 100 ms or sooner; true ends it with kAborted
  // (a stop signal came). Not asked once connected.
  std::function<bool()> stop;
  // While a call waits on the server for keys (Get, Wait, WaitAny), this fd becoming readable
  // ends it with kAborted and drops the connection (the server would answer the wait first; the
  // next call makes a new one): an agent's pending stop signal (StopSignalFd), which so never
  // waits out a long wait. -1: none.
  int interrupt_fd = -1;
};

class TcpStore : public Store {
 public:
  // Connects and authenticates; kPermissionDenied when the token is refused.
  static Result<std::unique_ptr<TcpStore>> Connect(const TcpStoreOptions& options);
  ~TcpStore() override;

  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, Duration timeout) override;
  Result<std::optional<std::string>> TryGet(const std::string& key) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;
  Result<std::string> CompareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) override;
  Status Wait(const std::vector<std::string>& keys, Duration timeout) override;
  Result<bool> Delete(const std::string& key) override;
  // These send their requests in one go and read the replies together: one round trip.
  Status MultiSet(const std::vector<std::pair<std::string, std::string>>& pairs) override;
  Result<std::vector<std::optional<std::string>>> TryGetMany(const std::vector<std::string>& keys) override;
  // One round trip, answered by the server as soon as one of the keys is set.
  Result<std::pair<size_t, std::string>> WaitAny(const std::vector<std::string>& keys, Duration timeout) override;

 private:
  explicit TcpStore(TcpStoreOptions options) : options_(std::move(options)) {}
  Status EnsureConnected();
  int ConnectOnce(Clock::time_point deadline) const;  // to host:port or unix_path; fd or -errno
  using RawReply = std::pair<uint8_t, std::string>;   // a reply's Reply byte and the fields after it
  // Sends the request frames and reads `replies` replies, within `wait` plus the io timeout. On
  // any transport error the connection is dropped; the next call reconnects.
  Result<std::vector<RawReply>> CallMany(const std::string& frames, Duration wait, size_t replies);
  Result<RawReply> Call(const std::string& frame, Duration wait);  // one request, one reply
  // Reads one reply frame's body: 1; 0 when the server closed the connection, -1 when `deadline`
  // passed, -2 on a receive error, -3 for a malformed frame, -4 when options_.stop said so (only
  // while connecting), -5 when options_.interrupt_fd did (only with `interruptible`). One poll and one recv for a reply
  // that arrives whole (the usual case), where reading the length first took two of each.
  int ReadFrame(std::string* body, Clock::time_point deadline, bool interruptible = false);
  bool Stopping() const { return connecting_ && options_.stop && options_.stop(); }
  std::string Where() const;

  TcpStoreOptions options_;
  std::mutex mu_;
  int fd_ = -1;
  bool greeted_ = false;
  bool connecting_ = false;  // in Connect(): options_.stop is asked
  std::string in_;           // received bytes not yet taken as a frame
};

}  // namespace trainctl
