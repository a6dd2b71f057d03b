// The HTTP servers of the monitor module (the dashboard, the agents' /metrics) run the same way:
// bound first, so a busy port is an error at once, then served on a thread of their own until
// stopped. Internal to monitor/.
#pragma once

#include <string>
#include <thread>

#include <httplib.h>

namespace trainctl::monitor {

// Binds `server` to host:port (0: any free port) and serves it on `*thread`. The port, or -1.
inline int ListenInBackground(httplib::Server& server, const std::string& host, int port, std::thread* thread) {
  server.set_tcp_nodelay(true);
  const int bound = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (bound > 0) *thread = std::thread([&server] { server.listen_after_bind(); });
  return bound;
}

// Stops `server` and joins its thread.
inline void StopServing(httplib::Server& server, std::thread* thread) {
  server.stop();
  if (thread->joinable()) thread->join();
}

}  // namespace trainctl::monitor
