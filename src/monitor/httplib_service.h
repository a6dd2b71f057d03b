// An HttpService on cpp-httplib: bound first, so that a busy port is an error at once, then
// served on a thread of its own until destroyed. Plugin side (trainctl-http.so); internal to monitor/.
#pragma once

#include <string>
#include <thread>

#include <httplib.h>

#include "monitor/http_service.h"

namespace trainctl::monitor {

class HttplibService : public HttpService {
 public:
  ~HttplibService() override { Stop(); }
  // Stops serving and joins the thread. A subclass whose handlers use its own members calls it
  // from its destructor, before they go.
  void Stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const override { return port_; }
  httplib::Server& server() { return server_; }
  // Binds host:port (0: any free port) and serves; false when it cannot bind. Routes first.
  bool Listen(const std::string& host, int port) {
    server_.set_tcp_nodelay(true);
    port_ = port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
    if (port_ <= 0) return false;
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    return true;
  }

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
};

}  // namespace trainctl::monitor
