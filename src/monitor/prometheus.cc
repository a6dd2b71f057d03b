#include "monitor/prometheus.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/plugin.h"
#include "common/strings.h"
#include "job/paths.h"
#include "monitor/http_service.h"
#include "monitor/view.h"

namespace trainctl::monitor {

namespace {

// Upper bounds of the step-duration histogram, in seconds.
const std::vector<double> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

std::string Number(double v) { return ShortestNumber(v); }

}  // namespace

std::string EscapeLabel(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void MetricsExporter::Update(Totals* t, const std::string& path) {
  // The first read, or a path that changed (the run's files moved to previous/): from nothing.
  auto start_over = [t] {
    static_cast<Figures&>(*t) = Figures{};
    t->buckets.assign(kBounds.size(), 0);
  };
  t->file.Read(path, start_over, [t](const nlohmann::json& j) {
    auto num = [&](const char* key, double* out) {
      if (j.contains(key) && j[key].is_number()) {
        *out = j[key].get<double>();
        return true;
      }
      return false;
    };
    double v = 0;
    if (num("step", &v)) t->steps = std::max(t->steps, v);
    if (num("loss", &v)) t->loss = v;
    if (num("restart", &v)) t->restart = v;
    if (num("test_accuracy", &v)) t->accuracy = v;
    double secs = 0, steps = 0, rate = 0;
    if (num("window_seconds", &secs) && num("window_steps", &steps) && steps > 0) {
      if (num("samples_per_s", &rate)) t->samples += rate * secs;
      if (num("comm_seconds", &v)) t->comm += v;
      if (num("data_seconds", &v)) t->data += v;
      // The window's mean step duration, once per step in it.
      const double each = secs / steps;
      for (size_t b = 0; b < kBounds.size(); ++b) {
        if (each <= kBounds[b]) t->buckets[b] += steps;
      }
      t->count += steps;
      t->sum += secs;
    }
  });
}

std::string MetricsExporter::Render(const std::vector<runs::RunEntry>& entries) {
  std::lock_guard<std::mutex> lock(mu_);
  struct Family {
    std::string name, type, help, lines;
  };
  std::vector<Family> families = {
      {"trainctl_job_running", "gauge", "Whether the run is running (1) or has ended (0).", ""},
      {"trainctl_job_tasks", "gauge", "Tasks (worker processes) of the run at full size.", ""},
      {"trainctl_job_restarts_total", "counter", "Worker-group restarts of the run so far.", ""},
      {"trainctl_job_failed", "gauge", "Whether the run ended failed, lost or timed out (1).", ""},
      {"trainctl_train_steps_total", "counter", "Optimizer steps of the built-in trainer.", ""},
      {"trainctl_train_samples_total", "counter", "Training samples processed (all workers).", ""},
      {"trainctl_train_loss", "gauge", "Training loss of the newest metrics window.", ""},
      {"trainctl_train_data_wait_seconds_total", "counter", "Time rank 0 waited for input batches.", ""},
      {"trainctl_train_communication_wait_seconds_total", "counter",
       "Time rank 0 waited for the other ranks' gradients or the parameter servers.", ""},
      {"trainctl_train_step_duration_seconds", "histogram",
       "Duration of a training step (each metrics window's mean, once per step).", ""},
      {"trainctl_test_accuracy", "gauge", "Newest test-set accuracy (0 to 1).", ""},
  };
  auto add = [&](size_t family, const std::string& labels, double value, const std::string& suffix = "") {
    families[family].lines += families[family].name + suffix + "{" + labels + "} " + Number(value) + "\n";
  };
  for (const auto& e : entries) {
    const RunView v = View(e);
    const std::string labels = "job=\"" + EscapeLabel(e.name) + "\",run_id=\"" + EscapeLabel(e.run_id) + "\"";
    Totals& t = totals_[e.run_id];
    Update(&t, paths::MetricsJsonl(v.dir));
    double restarts = t.restart;
    if (v.status.restarts) restarts = *v.status.restarts;
    add(0, labels, v.alive ? 1 : 0);
    add(1, labels, e.tasks);
    add(2, labels, restarts);
    add(3, labels, JobFailed(v.state) ? 1 : 0);
    if (t.file.offset() == 0) continue;  // not the built-in trainer, or nothing logged yet
    add(4, labels, t.steps);
    add(5, labels, t.samples);
    if (t.loss >= 0) add(6, labels, t.loss);
    add(7, labels, t.data);
    add(8, labels, t.comm);
    for (size_t b = 0; b < kBounds.size(); ++b)
      add(9, labels + ",le=\"" + Number(kBounds[b]) + "\"", t.buckets[b], "_bucket");
    add(9, labels + ",le=\"+Inf\"", t.count, "_bucket");
    add(9, labels, t.sum, "_sum");
    add(9, labels, t.count, "_count");
    if (t.accuracy >= 0) add(10, labels, t.accuracy);
  }
  std::string out;
  for (const auto& f : families) {
    out += "# HELP " + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n" + f.lines;
  }
  return out;
}

struct MetricsServer::Impl {
  std::unique_ptr<HttpService> service;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host, int port, const std::string& token,
                                                            std::function<std::string()> render) {
  if (token.empty()) return InvalidArgument("serving metrics needs the job's token");
  ASSIGN_OR_RETURN(auto serve, PluginFunction<ServeMetricsEntry>(kHttpPlugin, kServeMetricsEntry));
  ServiceResult service = Unavailable("not started");
  serve(host, port, token, std::move(render), &service);
  if (!service.ok()) return service.status();
  auto impl = std::make_unique<Impl>();
  impl->service = std::move(*service);
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const { return impl_->service->port(); }

}  // namespace trainctl::monitor
