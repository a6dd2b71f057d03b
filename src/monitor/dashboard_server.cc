// The dashboard's HTTP side (monitor/dashboard.h): its page, JSON API and /metrics (monitor/http_server.h).
// Built into trainctl-http.so.
#include <sys/stat.h>

#include <array>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/json_field.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "data/dataset.h"
#include "job/paths.h"
#include "monitor/assets.h"
#include "monitor/dashboard.h"
#include "monitor/http_server.h"
#include "monitor/prometheus.h"
#include "monitor/view.h"

namespace trainctl::monitor {

namespace {

using nlohmann::json;

json RunSummary(const RunView& v) {
  const runs::RunEntry& e = v.entry;
  return {{"name", e.name},
          {"run_id", e.run_id},
          {"state", RunStateName(v.state)},
          {"tasks", Tasks(e)},
          {"progress", Progress(v.dir)},
          {"elapsed", Elapsed(v)},
          {"output_dir", v.dir},
          {"host", e.host},
          {"started", e.started},
          {"alive", v.alive}};
}

// The curves of a run's metrics.jsonl, training windows and test accuracy, at most the newest
// 5000 points of each; kept between requests, so that each poll of the page parses only what the
// run appended since the last.
class Series {
 public:
  json Update(const std::string& path) {
    file_.Read(
        path, [this] { train_.clear(), test_.clear(); },
        [this](const json& j) {
          const double none = std::numeric_limits<double>::quiet_NaN();  // JSON has no NaN: missing
          const double step = JsonField(j, "step", none), loss = JsonField(j, "loss", none),
                       accuracy = JsonField(j, "test_accuracy", none);
          if (std::isnan(step)) return;
          if (!std::isnan(loss)) Keep(&train_, {step, loss, JsonField(j, "samples_per_s", 0.0)});
          if (!std::isnan(accuracy)) Keep(&test_, {step, accuracy, 0});
        });
    json train = {{"step", json::array()}, {"loss", json::array()}, {"samples_per_s", json::array()}};
    json test = {{"step", json::array()}, {"accuracy", json::array()}};
    for (const auto& p : train_) {
      train["step"].push_back(p[0]);
      train["loss"].push_back(p[1]);
      train["samples_per_s"].push_back(p[2]);
    }
    for (const auto& p : test_) {
      test["step"].push_back(p[0]);
      test["accuracy"].push_back(p[1]);
    }
    return {{"train", train}, {"test", test}};
  }

 private:
  using Point = std::array<double, 3>;
  static void Keep(std::deque<Point>* points, Point p) {
    points->push_back(p);
    if (points->size() > 5000) points->pop_front();
  }
  JsonLinesFollower file_;
  std::deque<Point> train_, test_;
};

class DashboardServer : public HttpServer {
 public:
  explicit DashboardServer(const DashboardOptions& options) : o(options) {}
  ~DashboardServer() override { Stop(); }

  DashboardOptions o;
  MetricsExporter metrics;
  std::mutex eval_mu;
  std::map<std::string, std::pair<int64_t, json>> evals;  // run id -> (model mtime, result)
  std::mutex series_mu;
  std::map<std::string, Series> series;  // run id -> its curves so far

  bool Authorized(const HttpRequest& req) const {
    if (req.has_param("token") && ConstantTimeEquals(req.get_param_value("token"), o.token)) return true;
    const std::string auth = req.get_header_value("Authorization");
    return auth.rfind("Bearer ", 0) == 0 && ConstantTimeEquals(auth.substr(7), o.token);
  }

  // Test-set results of a run's model: `trainctl eval` (per class, confusion matrix) and
  // `trainctl predict` on the test images for the misclassified ones. Cached per model file.
  json Eval(const RunView& v) {
    const std::string model = paths::Model(v.dir);
    struct stat st {};
    if (::stat(model.c_str(), &st) != 0) {
      const json job = ReadJson(paths::JobJson(v.dir));
      if (job.is_object() && !job.contains("trainer")) {
        return {{"error", "nothing to evaluate: this job runs its own program, not the built-in trainer"}};
      }
      if (v.alive) return {{"error", "no model yet: " + model + " appears when the run ends"}};
      return {{"error", std::string("no model: the run ") + RunStateName(v.state) + " before it wrote " + model +
                            (v.state == RunState::kFailed ? "; its failure is above, its logs below" : "")}};
    }
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    std::lock_guard<std::mutex> lock(eval_mu);
    auto cached = evals.find(v.entry.run_id);
    if (cached != evals.end() && cached->second.first == mtime) return cached->second.second;
    auto run = [&](std::vector<std::string> args) -> json {
      SpawnOptions so;
      so.argv = {o.self_exe};
      so.argv.insert(so.argv.end(), args.begin(), args.end());
      so.env = CurrentEnvironment();
      auto r = RunCommand(so, std::chrono::seconds(300));
      if (!r.ok() || r->exit.code != 0) return json();
      return JsonAfterOtherLines(r->output);
    };
    json result = run({"eval", "--checkpoint", model, "-o", "json"});
    if (!result.is_object()) return {{"error", "trainctl eval failed on " + model}};
    // Misclassified test images, with the model's answer: Fashion-MNIST and MNIST (idx files).
    const json spec = ReadJson(paths::JobJson(v.dir));
    const json data = spec.is_object() && spec.contains("trainer") && spec["trainer"].is_object()
                          ? spec["trainer"].value("data", json::object())
                          : json();
    const std::string dataset = data.is_object() ? JsonField(data, "dataset", "fashion-mnist") : "";
    if (dataset == "fashion-mnist" || dataset == "mnist") {
      std::string dir = JsonField(data, "dir", "");
      if (dir.empty()) dir = data::kFashionMnistDir;
      auto test = data::LoadMnistDir(dir, /*train=*/false);
      std::string images = dir + "/t10k-images-idx3-ubyte";
      if (!Exists(images)) images += ".gz";
      json predicted = test.ok() ? run({"predict", "--checkpoint", model, images, "-o", "json", "-k", "1"}) : json();
      json wrong = json::array();
      for (size_t i = 0;
           predicted.is_array() && i < predicted.size() && i < static_cast<size_t>(test->count) && wrong.size() < 24;
           ++i) {
        const json& top = predicted[i]["top"][0];
        if (top["class"].get<int>() == test->labels[i]) continue;
        const uint8_t* px = test->image(static_cast<int64_t>(i));
        wrong.push_back({{"index", i},
                         {"label", test->labels[i]},
                         {"predicted", top["class"]},
                         {"predicted_name", top["name"]},
                         {"probability", top["probability"]},
                         {"rows", test->rows},
                         {"cols", test->cols},
                         {"pixels", std::vector<int>(px, px + test->image_bytes())}});
      }
      result["misclassified"] = wrong;
    }
    evals[v.entry.run_id] = {mtime, result};
    return result;
  }

  void Routes() {
    HttpServer& server = *this;
    auto asset = [&server](const char* path, const char* type, const char* body) {
      server.Get(path, [type, body](const HttpRequest&, HttpResponse& res) {
        res.set_content(body, type);
        res.set_header("Cache-Control", "no-store");
      });
    };
    asset("/app.js", "text/javascript", kDashboardJs);
    asset("/app.css", "text/css", kDashboardCss);
    server.Before([this](const HttpRequest& req, HttpResponse& res) {
      // Nothing but the page's own assets loads, and no page elsewhere may frame it.
      res.set_header("Content-Security-Policy",
                     "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                     "img-src 'self' data:; frame-ancestors 'none'");
      res.set_header("X-Content-Type-Options", "nosniff");
      if (req.path == "/app.js" || req.path == "/app.css" || Authorized(req)) return false;
      res.status = 401;
      res.set_content("trainctl dashboard: this needs the token in the URL that `trainctl dashboard` printed\n",
                      "text/plain");
      return true;
    });
    server.Get("/", [](const HttpRequest&, HttpResponse& res) { res.set_content(kDashboardHtml, "text/html"); });
    server.Get("/metrics", [this](const HttpRequest&, HttpResponse& res) {
      res.set_content(metrics.Render(runs::List()), "text/plain; version=0.0.4; charset=utf-8");
    });
    server.Get("/api/runs", [](const HttpRequest&, HttpResponse& res) {
      json out = json::array();
      for (const auto& e : runs::List()) out.push_back(RunSummary(View(e)));
      res.set_content(out.dump(), "application/json");
    });
    server.Get(R"(/api/runs/([A-Za-z0-9._-]+)(/logs|/eval|/timeline)?)", [this](const HttpRequest& req,
                                                                                HttpResponse& res) {
      auto e = runs::Find(req.matches[1]);
      if (!e.ok() || e->run_id != req.matches[1]) {
        res.status = 404;
        res.set_content(json{{"error", "no run " + std::string(req.matches[1])}}.dump(), "application/json");
        return;
      }
      const RunView v = View(*e);
      json out;
      if (req.matches[2] == "/logs") {
        const int rank = req.has_param("rank") ? std::atoi(req.get_param_value("rank").c_str()) : 0;
        const auto files = LogFiles(paths::LogsDir(v.dir), "", rank, ReadJson(paths::JobJson(v.dir)));
        const std::string text = files.empty() ? "" : ReadTail(files[0], 262144);
        out = {{"rank", rank}, {"file", files.empty() ? "" : files[0]}, {"text", text}};
      } else if (req.matches[2] == "/eval") {
        out = Eval(v);
      } else if (req.matches[2] == "/timeline") {  // trainer.timeline_steps' trace, to save and open in Perfetto
        auto trace = ReadFile(paths::Timeline(v.dir), int64_t{256} << 20);
        if (!trace.ok()) {
          res.status = 404;
          res.set_content(json{{"error", "run " + v.entry.run_id + " has no timeline (trainer.timeline_steps)"}}.dump(),
                          "application/json");
          return;
        }
        res.set_header("Content-Disposition", "attachment; filename=\"" + v.entry.run_id + "-timeline.json\"");
        res.set_content(*trace, "application/json");
        return;
      } else {
        out = RunSummary(v);
        out["status"] = v.status.ToJson();
        {
          std::lock_guard<std::mutex> lock(series_mu);
          if (series.size() >= 64 && !series.count(v.entry.run_id))
            series.erase(series.begin());  // bounded; read again if asked
          out["series"] = series[v.entry.run_id].Update(paths::MetricsJsonl(v.dir));
        }
        out["split"] = StepSplit(v.dir);
        out["timeline"] = Exists(paths::Timeline(v.dir));
        json tasks = json::array();
        if (v.alive) {
          for (const auto& t : SampleTasks(e->pid, std::chrono::milliseconds(250))) {
            tasks.push_back({{"rank", t.rank},
                             {"task", t.label},
                             {"pid", t.pid},
                             {"cpu_percent", t.cpu_percent},
                             {"rss_mib", t.rss_mib},
                             {"threads", t.threads}});
          }
        }
        out["workers"] = tasks;
        out["ranks"] = e->tasks;
        // Each rank's task (ps-0, worker-0...), from its log file: the log view opens on the first
        // worker's (or chief's), not on a parameter server's.
        json names = json::array();
        const json job = ReadJson(paths::JobJson(v.dir));
        if (job.is_object()) out["trainer"] = job.contains("trainer");
        for (const auto& f : LogFiles(paths::LogsDir(v.dir), "", -1, job)) {
          names.push_back(std::filesystem::path(f).stem().string());
        }
        out["task_names"] = names;
      }
      res.set_content(out.dump(), "application/json");
    });
  }
};

}  // namespace

}  // namespace trainctl::monitor

extern "C" __attribute__((visibility("default"))) void trainctl_serve_dashboard(
    const trainctl::monitor::DashboardOptions& options, trainctl::monitor::ServiceResult* out) {
  using namespace trainctl::monitor;
  auto server = std::make_unique<DashboardServer>(options);
  server->Routes();
  if (!server->Listen(options.host, options.port)) {
    *out = trainctl::Unavailable("cannot listen on " + options.host + ":" + std::to_string(options.port));
    return;
  }
  *out = std::unique_ptr<HttpService>(std::move(server));
}
