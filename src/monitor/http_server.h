// The dashboard's and the agents' /metrics HTTP server: GET only, one request per connection,
// built to stay up for the clients with the token while any number of others misbehave. A
// connection's request head (request line and headers) must arrive whole within `head_deadline`,
// in at most `max_head` bytes and `max_headers` lines; a request with a body, or of another method,
// is refused without reading the body. Heads are read by one event loop (poll), so slow clients
// hold no thread; complete requests are served by a few worker threads, each response written
// within `write_timeout`. Past `max_connections` open, the oldest unfinished connection is closed.
// Plugin side (trainctl-http.so); internal to monitor/.
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "monitor/http_service.h"

namespace trainctl::monitor {

struct HttpRequest {
  std::string method, path;                    // path without its query
  std::map<std::string, std::string> params;   // the query, decoded
  std::map<std::string, std::string> headers;  // names in lower case
  std::vector<std::string> matches;            // the route's regex groups; [0] the whole path
  bool has_param(const std::string& k) const { return params.count(k) > 0; }
  std::string get_param_value(const std::string& k) const;
  std::string get_header_value(const std::string& name) const;  // any case
};

struct HttpResponse {
  int status = 200;
  std::string body, content_type = "text/plain";
  std::vector<std::pair<std::string, std::string>> headers;
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  void set_header(std::string k, std::string v) { headers.emplace_back(std::move(k), std::move(v)); }
};

class HttpServer : public HttpService {
 public:
  struct Limits {
    size_t max_head = 16 << 10;
    int max_headers = 64;
    Duration head_deadline = std::chrono::seconds(10);
    Duration write_timeout = std::chrono::seconds(10);
    size_t max_connections = 1024;  // unfinished heads at once
    int workers = 8;
  };
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  // Runs before routing; true when it answered (a 401).
  using Filter = std::function<bool(const HttpRequest&, HttpResponse&)>;

  HttpServer() = default;
  explicit HttpServer(Limits limits) : limits_(limits) {}
  ~HttpServer() override { Stop(); }
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes (before Listen): `pattern` must match the whole path.
  void Get(const std::string& pattern, Handler handler);
  void Before(Filter filter) { filter_ = std::move(filter); }
  // Binds host:port (0: any free port) and serves on threads of its own; false when it cannot bind.
  bool Listen(const std::string& host, int port);
  // Stops serving, closes every connection and joins the threads. A subclass whose handlers use
  // its own members calls it from its destructor. Idempotent.
  void Stop();
  int port() const override { return port_; }

 private:
  struct Pending {
    int fd;
    Clock::time_point deadline;
    std::string head;
    size_t dropped = 0;  // bytes read and dropped after a refusal
  };
  // The accepting thread: reads each connection's head (within its deadline, of bounded size) and
  // queues the request for the workers, or refuses it. Its state is its own (pending_, lingering_).
  void Loop();
  void Refuse(int fd, int status, const std::string& why);  // answers, then lingers until closed
  void ReadLingering(const pollfd* revents);                // one per lingering_ connection
  void ReadHeads(const pollfd* revents);                    // one per pending_ connection
  void AcceptAll();
  void Work();
  // Parses a complete head; a status other than 0 refuses it (with `why`).
  int Parse(const std::string& head, HttpRequest* req, std::string* why) const;
  void Serve(int fd, HttpRequest req);
  void Answer(int fd, const HttpResponse& res);

  Limits limits_;
  std::deque<Pending> pending_;      // heads not whole yet, oldest first
  std::deque<Pending> lingering_;    // answered and refused: read until the client closes
  Clock::time_point resting_until_;  // out of descriptors: the listener rests until then
  std::vector<std::pair<std::regex, Handler>> routes_;
  Filter filter_;
  int listen_fd_ = -1, wake_[2] = {-1, -1};
  int port_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread loop_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::pair<int, HttpRequest>> queue_;
};

}  // namespace trainctl::monitor
