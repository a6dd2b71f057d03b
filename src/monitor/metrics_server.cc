// The agents' /metrics server (MetricsServer, monitor/prometheus.h). Built into trainctl-http.so.
#include "common/strings.h"
#include "monitor/http_server.h"

extern "C" __attribute__((visibility("default"))) void trainctl_serve_metrics(const std::string& host, int port,
                                                                              const std::string& token,
                                                                              std::function<std::string()> render,
                                                                              trainctl::monitor::ServiceResult* out) {
  using namespace trainctl::monitor;
  auto service = std::make_unique<HttpServer>();
  service->Get("/metrics", [token, render](const HttpRequest& req, HttpResponse& res) {
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) != 0 || !trainctl::ConstantTimeEquals(auth.substr(7), token)) {
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("trainctl metrics: this needs the job's token as a bearer token\n", "text/plain");
      return;
    }
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (!service->Listen(host, port)) {
    *out = trainctl::Unavailable("cannot listen on " + host + ":" + std::to_string(port) + " for /metrics");
    return;
  }
  *out = std::unique_ptr<HttpService>(std::move(service));
}
