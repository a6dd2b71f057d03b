// `trainctl dashboard`: the page in a real headless Chromium (DOM checks and a screenshot), its
// token, its escaping of what runs print, and /metrics checked by promtool and scraped by a real
// Prometheus started here on loopback.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/exit_codes.h"
#include "common/strings.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;
using Env = std::vector<std::pair<std::string, std::string>>;

struct Url {
  std::string host;
  int port = 0;
  std::string token;
};

// The dashboard's address, from the line it prints.
Url WaitForUrl(const Scratch& s, const std::string& log) {
  Url u;
  std::smatch m;
  EXPECT_TRUE(Eventually(
      [&] {
        const std::string text = s.Read(log);
        if (!std::regex_search(text, m, std::regex("http://([0-9.]+):(\\d+)/\\?token=([0-9a-f]+)"))) return false;
        u = {m[1], std::stoi(m[2]), m[3]};
        return true;
      },
      seconds(20)))
      << s.Read(log);
  return u;
}

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = {{"TRAINCTL_STATE_DIR", s_.path("state")}};
    // A finished training run (curves, test accuracy, a model to evaluate)...
    s_.Write("train.yaml", "name: trained\nprocs_per_node: 2\noutput_dir: " + s_.path("trained") +
                               "\ntrainer:\n  model: cnn\n  data: {limit: 1024, test_limit: 200}\n  batch_size: 32\n"
                               "  epochs: 2\n  threads: 1\n  log_every: 4\n  timeline_steps: 4\n");
    auto trained = Trainctl({"run", "train.yaml"}, s_.path(""), seconds(120), env_);
    ASSERT_EQ(trained.exit.code, 0) << trained.output;
    trained_id_ = nlohmann::json::parse(s_.Read("trained/status.json"))["run_id"];
    // ...and a running one whose output tries to inject markup into the page.
    s_.Write("hostile.yaml", "name: hostile\nprocs_per_node: 2\noutput_dir: " + s_.path("hostile") +
                                 "\ncommand: [sh, -c, 'echo \"<script>document.title=1</script><img src=x "
                                 "onerror=document.title=2>\"; sleep 120']\n");
    hostile_ = std::make_unique<Background>(std::vector<std::string>{"run", "hostile.yaml"}, s_.path(""),
                                            s_.path("hostile.log"), env_);
    ASSERT_TRUE(Eventually([&] { return s_.Read("hostile/logs/worker-0.log").find("<script>") != std::string::npos; }));
    hostile_id_ = nlohmann::json::parse(s_.Read("hostile/status.json"))["run_id"];
    dashboard_ =
        std::make_unique<Background>(std::vector<std::string>{"dashboard"}, s_.path(""), s_.path("dash.log"), env_);
    url_ = WaitForUrl(s_, "dash.log");
  }
  void TearDown() override {
    if (hostile_) {
      ::kill(hostile_->pid(), SIGTERM);
      hostile_->Wait(seconds(30));
    }
    if (dashboard_) {
      ::kill(dashboard_->pid(), SIGTERM);
      EXPECT_EQ(dashboard_->Wait(seconds(30)).code, 0);
    }
  }
  std::string Base() const { return "http://" + url_.host + ":" + std::to_string(url_.port); }

  Scratch s_;
  Env env_;
  std::string trained_id_, hostile_id_;
  std::unique_ptr<Background> hostile_, dashboard_;
  Url url_;
};

TEST_F(DashboardTest, ThePageShowsJobsCurvesLogsAndEvalInChromiumAndEscapesWhatRunsPrint) {
  ASSERT_EQ(url_.host, "127.0.0.1") << "loopback unless told otherwise";
  // The token guards everything but the static assets.
  httplib::Client client(url_.host, url_.port);
  client.set_read_timeout(120, 0);
  EXPECT_EQ(client.Get("/")->status, 401);
  EXPECT_EQ(client.Get("/api/runs?token=" + std::string(url_.token.size(), '0'))->status, 401);
  EXPECT_EQ(client.Get("/app.js")->status, 200);
  auto runs = client.Get("/api/runs?token=" + url_.token);
  ASSERT_EQ(runs->status, 200);
  EXPECT_EQ(nlohmann::json::parse(runs->body).size(), 2u);
  EXPECT_NE(client.Get("/")->get_header_value("Content-Security-Policy").find("default-src 'none'"), std::string::npos);

  const std::string page = Base() + "/?token=" + url_.token;
  auto dom = [&](const std::string& run, const std::string& shot) {
    auto r =
        RunProgram({"chromium-headless-shell", "--no-sandbox", "--headless", "--disable-gpu", "--window-size=1280,2400",
                    "--virtual-time-budget=20000", "--screenshot=" + shot, "--dump-dom", page + "#" + run},
                   s_.path(""));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    return r.output;
  };
  // The trained run: both jobs listed, its curves drawn, its eval (10 classes, a 10x10 heat map,
  // misclassified test images drawn on canvases).
  const std::string trained = dom(trained_id_, s_.path("trained.png"));
  EXPECT_NE(trained.find(trained_id_), std::string::npos);
  EXPECT_NE(trained.find(hostile_id_), std::string::npos);
  // The front page says that a row opens its run, and each run id is a link to it.
  EXPECT_NE(trained.find("<p id=\"jobs-hint\">Click a row, or its run id, to open that run"), std::string::npos)
      << trained;
  EXPECT_NE(trained.find("<a href=\"#" + trained_id_ + "\">" + trained_id_ + "</a>"), std::string::npos) << trained;
  EXPECT_EQ(CountLines(std::regex_replace(trained, std::regex("<path class=\"curve\""), "\n@curve@\n"), "@curve@"), 3)
      << "loss, throughput and test accuracy";
  EXPECT_NE(trained.find("Accuracy of the model on 10000 test images: "), std::string::npos) << trained;
  EXPECT_EQ(CountLines(std::regex_replace(trained, std::regex("class=\"cm-cell\""), "\n@cell@\n"), "@cell@"), 100);
  const int canvases = CountLines(std::regex_replace(trained, std::regex("<canvas"), "\n@canvas@\n"), "@canvas@");
  EXPECT_EQ(canvases, 24) << "misclassified images";
  EXPECT_GT(fs::file_size(s_.path("trained.png")), 20000u);
  // Its timeline, a link to save (with the token) and the file behind it; none for the other run.
  const std::string link = "/api/runs/" + trained_id_ + "/timeline?token=" + url_.token;
  EXPECT_NE(trained.find("<p id=\"run-timeline\">"), std::string::npos) << trained;
  EXPECT_NE(trained.find("href=\"" + link + "\""), std::string::npos) << trained;
  auto timeline = client.Get(link);
  ASSERT_EQ(timeline->status, 200);
  EXPECT_EQ(timeline->body, s_.Read("trained/timeline.json"));
  EXPECT_NE(timeline->get_header_value("Content-Disposition").find(trained_id_ + "-timeline.json"), std::string::npos);
  EXPECT_EQ(client.Get("/api/runs/" + hostile_id_ + "/timeline?token=" + url_.token)->status, 404);
  EXPECT_EQ(client.Get("/api/runs/" + trained_id_ + "/timeline")->status, 401);

  // The running one: its workers with their CPU and memory, its log with the markup as text.
  const std::string hostile = dom(hostile_id_, s_.path("hostile.png"));
  EXPECT_NE(hostile.find("<title>trainctl</title>"), std::string::npos) << "a log line ran as script";
  EXPECT_NE(hostile.find("&lt;script&gt;document.title=1&lt;/script&gt;&lt;img src=x onerror=document.title=2&gt;"),
            std::string::npos)
      << hostile;
  EXPECT_EQ(hostile.find("<img src=\"x\""), std::string::npos);
  EXPECT_TRUE(std::regex_search(hostile, std::regex("<td>worker-1</td><td>\\d+</td>"))) << hostile;
  EXPECT_NE(hostile.find("<p id=\"run-timeline\" hidden=\"\">"), std::string::npos) << hostile;
  // A run of its own program has no curves: each chart says so instead of drawing empty axes.
  EXPECT_EQ(CountLines(std::regex_replace(hostile, std::regex("class=\"empty\">none: this job runs its own program"),
                                          "\n@empty@\n"),
                       "@empty@"),
            3)
      << hostile;
  EXPECT_EQ(trained.find("class=\"empty\""), std::string::npos) << trained;
}

// A run's curves follow its metrics.jsonl as it grows (each poll reads only what was appended: a
// line still being written waits for its end), and start over when the file is replaced.
TEST_F(DashboardTest, ARunsCurvesFollowItsMetricsFileAsItGrows) {
  httplib::Client client(url_.host, url_.port);
  auto series = [&](const std::string& id) {
    auto r = client.Get("/api/runs/" + id + "?token=" + url_.token);
    EXPECT_EQ(r->status, 200);
    return nlohmann::json::parse(r->body)["series"];
  };
  // The finished run: every window and evaluation its trainer recorded.
  size_t windows = 0, evals = 0;
  for (const auto& line : SplitLines(s_.Read("trained/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    windows += j.contains("loss") ? 1 : 0;
    evals += j.contains("test_accuracy") ? 1 : 0;
  }
  auto trained = series(trained_id_);
  EXPECT_GT(windows, 2u);
  EXPECT_EQ(trained["train"]["loss"].size(), windows) << trained;
  EXPECT_EQ(trained["test"]["accuracy"].size(), evals) << trained;
  // The running one, written to by hand: nothing, then two lines and half of a third.
  const std::string file = s_.path("hostile/metrics.jsonl");
  EXPECT_TRUE(series(hostile_id_)["train"]["step"].empty());
  auto append = [&](const std::string& text) { std::ofstream(file, std::ios::app) << text << std::flush; };
  append("{\"step\": 1, \"loss\": 2.5, \"samples_per_s\": 10}\n{\"step\": 2, \"loss\": 2.0}\n{\"step\": 3, \"lo");
  EXPECT_EQ(series(hostile_id_)["train"]["step"], nlohmann::json({1, 2}));
  append("ss\": 1.5}\n{\"step\": 3, \"test_accuracy\": 0.5}\n");
  auto grown = series(hostile_id_);
  EXPECT_EQ(grown["train"]["loss"], nlohmann::json({2.5, 2.0, 1.5})) << grown;
  EXPECT_EQ(grown["train"]["samples_per_s"], nlohmann::json({10.0, 0.0, 0.0})) << grown;
  EXPECT_EQ(grown["test"]["accuracy"], nlohmann::json({0.5})) << grown;
  // Replaced by a shorter file: only what it holds.
  s_.Write("hostile/metrics.jsonl", "{\"step\": 7, \"loss\": 0.25}\n");
  auto replaced = series(hostile_id_);
  EXPECT_EQ(replaced["train"]["step"], nlohmann::json({7})) << replaced;
  EXPECT_TRUE(replaced["test"]["step"].empty()) << replaced;
}

TEST_F(DashboardTest, MetricsPassPromtoolAndARealPrometheusScrapesThem) {
  httplib::Client client(url_.host, url_.port);
  httplib::Headers bearer = {{"Authorization", "Bearer " + url_.token}};
  EXPECT_EQ(client.Get("/metrics")->status, 401);
  auto metrics = client.Get("/metrics", bearer);
  ASSERT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
  s_.Write("metrics.txt", metrics->body);
  auto checked = RunProgram({"sh", "-c", "promtool check metrics < metrics.txt"}, s_.path(""));
  EXPECT_EQ(checked.exit.code, 0) << checked.output << metrics->body;
  // Bucket bounds as written (the shortest form that reads back), not as doubles print at 17 digits.
  EXPECT_NE(metrics->body.find(",le=\"0.005\"}"), std::string::npos) << metrics->body;
  EXPECT_EQ(metrics->body.find("le=\"0.0050000000000000001\""), std::string::npos) << metrics->body;
  // What the run's own records say it did.
  int steps = 0;
  for (const auto& line : SplitLines(s_.Read("trained/metrics.jsonl"))) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("step")) steps = std::max(steps, j["step"].get<int>());
  }
  ASSERT_GT(steps, 0);
  EXPECT_NE(metrics->body.find("trainctl_train_steps_total{job=\"trained\",run_id=\"" + trained_id_ + "\"} " +
                               std::to_string(steps) + "\n"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("trainctl_job_running{job=\"hostile\",run_id=\"" + hostile_id_ + "\"} 1\n"),
            std::string::npos)
      << metrics->body;

  // A real Prometheus on loopback, scraping every second with the token.
  const int port = FreePort();
  s_.Write("prometheus.yml",
           "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: trainctl\n    honor_labels: true\n"
           "    authorization: {type: Bearer, credentials: " +
               url_.token +
               "}\n"
               "    static_configs: [{targets: ['" +
               url_.host + ":" + std::to_string(url_.port) + "']}]\n");
  int log = ::open(s_.path("prometheus.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SpawnOptions po;
  po.argv = {"prometheus", "--config.file=" + s_.path("prometheus.yml"), "--storage.tsdb.path=" + s_.path("tsdb"),
             "--web.listen-address=127.0.0.1:" + std::to_string(port)};
  po.env = CurrentEnvironment();
  po.output_fd = log;
  auto prometheus = Spawn(po);
  ::close(log);
  ASSERT_TRUE(prometheus.ok()) << prometheus.status().ToString();
  httplib::Client prom("127.0.0.1", port);
  std::string answer;
  const bool scraped = Eventually(
      [&] {
        auto r = prom.Get("/api/v1/query?query=trainctl_train_steps_total%7Brun_id%3D%22" + trained_id_ + "%22%7D");
        if (!r || r->status != 200) return false;
        answer = r->body;
        auto j = nlohmann::json::parse(answer, nullptr, false);
        return j.is_object() && j["data"]["result"].size() == 1;
      },
      seconds(60));
  ASSERT_TRUE(scraped) << answer << s_.Read("prometheus.log");
  auto j = nlohmann::json::parse(answer);
  EXPECT_EQ(j["data"]["result"][0]["value"][1], std::to_string(steps));
  EXPECT_EQ(j["data"]["result"][0]["metric"]["job"], "trained") << "the run's job label (honor_labels)\n" << answer;
  ::kill(*prometheus, SIGTERM);
  ::waitpid(*prometheus, nullptr, 0);
}

}  // namespace
}  // namespace trainctl::testing

namespace trainctl::testing {
namespace {

// A failed job of roles (a parameter server and a worker) of its own program: the log view opens
// on the worker's log, not the parameter server's; the eval view says why there is no model; a
// test accuracy of one point is drawn as a point on a scale around it, not from below zero.
TEST(DashboardViews, AFailedJobOfRolesShowsItsWorkerAndWhyThereIsNoModel) {
  Scratch s;
  const Env env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  s.Write("roles.yaml",
          "name: roles\nrestart: {max_restarts: 0}\ntimeouts: {stop_grace: 2s}\noutput_dir: " + s.path("out") +
              "\nroles:\n  - {name: ps, command: [sh, -c, 'echo serving; sleep 60']}\n"
              "  - {name: worker, command: [sh, -c, 'echo training here; sleep 1; exit 1']}\n");
  auto r = Trainctl({"run", "roles.yaml"}, s.path(""), seconds(60), env);
  ASSERT_EQ(r.exit.code, kExitWorkerFailed) << r.output;
  s.Write("out/metrics.jsonl", "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 5, \"test_accuracy\": 0.92}\n");
  const std::string id = nlohmann::json::parse(s.Read("out/status.json"))["run_id"];
  Background dashboard({"dashboard"}, s.path(""), s.path("dash.log"), env);
  const Url url = WaitForUrl(s, "dash.log");
  httplib::Client client(url.host, url.port);
  auto run = nlohmann::json::parse(client.Get("/api/runs/" + id + "?token=" + url.token)->body);
  EXPECT_EQ(run["task_names"], nlohmann::json({"ps-0", "worker-0"})) << run;
  auto page = RunProgram(
      {"chromium-headless-shell", "--no-sandbox", "--headless", "--disable-gpu", "--virtual-time-budget=10000",
       "--dump-dom", "http://" + url.host + ":" + std::to_string(url.port) + "/?token=" + url.token + "#" + id},
      s.path(""));
  ASSERT_EQ(page.exit.code, 0) << page.output;
  const std::string& dom = page.output;
  EXPECT_NE(dom.find("training here"), std::string::npos) << "the worker's log\n" << dom;
  EXPECT_EQ(dom.find("serving"), std::string::npos) << "the ps log\n" << dom;
  EXPECT_NE(dom.find("rank 1 (worker-0)"), std::string::npos) << dom;
  EXPECT_NE(dom.find("nothing to evaluate: this job runs its own program"), std::string::npos) << dom;
  const size_t chart = dom.find("id=\"chart-accuracy\"");
  ASSERT_NE(chart, std::string::npos);
  const std::string accuracy = dom.substr(chart, dom.find("</svg>", chart) - chart);
  EXPECT_NE(accuracy.find("class=\"point\""), std::string::npos) << accuracy;
  EXPECT_NE(accuracy.find(">0.966<"), std::string::npos) << accuracy;
  EXPECT_NE(accuracy.find(">0.874<"), std::string::npos) << accuracy;
  ::kill(dashboard.pid(), SIGTERM);
  EXPECT_EQ(dashboard.Wait(seconds(30)).code, 0);
}

// A model from PyTorch (trainer.model: {torchscript: ...}) is shown as a built-in one is: its
// curves, and its eval view from the model file (per-class accuracy, the confusion matrix, the
// misclassified test images with the model's answers).
TEST(DashboardViews, ATorchScriptRunIsEvaluatedAsABuiltinModelIs) {
  Scratch s;
  const Env env = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  auto made = RunProgram(
      {TRAINCTL_TEST_PYTHON, std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/scripted_models.py", s.path("models")},
      s.path(""));
  ASSERT_EQ(made.exit.code, 0) << made.output;
  s.Write("scripted.yaml", "name: scripted\nprocs_per_node: 1\noutput_dir: " + s.path("out") +
                               "\ntrainer:\n  model: {torchscript: " + s.path("models/bn_cnn.pt") +
                               "}\n  data: {limit: 1280, test_limit: 500}\n  batch_size: 64\n  threads: 1\n"
                               "  epochs: 1\n  log_every: 5\n  optimizer: {name: sgd, lr: 0.05, momentum: 0.9}\n");
  auto r = Trainctl({"run", "scripted.yaml"}, s.path(""), seconds(180), env);
  ASSERT_EQ(r.exit.code, 0) << r.output;
  const std::string id = nlohmann::json::parse(s.Read("out/status.json"))["run_id"];
  Background dashboard({"dashboard"}, s.path(""), s.path("dash.log"), env);
  const Url url = WaitForUrl(s, "dash.log");
  httplib::Client client(url.host, url.port);
  client.set_read_timeout(180, 0);
  auto eval = client.Get("/api/runs/" + id + "/eval?token=" + url.token);
  ASSERT_TRUE(eval);
  ASSERT_EQ(eval->status, 200) << eval->body;
  auto result = nlohmann::json::parse(eval->body);
  ASSERT_FALSE(result.contains("error")) << result;
  EXPECT_NE(result.dump().find("T-shirt/top"), std::string::npos) << "per-class accuracy by name: " << result;
  ASSERT_TRUE(result.contains("misclassified")) << result;
  EXPECT_GT(result["misclassified"].size(), 0u) << "a model trained on 1280 images errs on some test images";
  auto page = RunProgram(
      {"chromium-headless-shell", "--no-sandbox", "--headless", "--disable-gpu", "--virtual-time-budget=20000",
       "--dump-dom", "http://" + url.host + ":" + std::to_string(url.port) + "/?token=" + url.token + "#" + id},
      s.path(""));
  ASSERT_EQ(page.exit.code, 0) << page.output;
  EXPECT_NE(page.output.find("Accuracy of the model on 10000 test images: "), std::string::npos) << page.output;
  EXPECT_EQ(CountLines(std::regex_replace(page.output, std::regex("class=\"cm-cell\""), "\n@cell@\n"), "@cell@"), 100);
  EXPECT_EQ(CountLines(std::regex_replace(page.output, std::regex("<path class=\"curve\""), "\n@curve@\n"), "@curve@"),
            3)
      << "loss, throughput and test accuracy";
  ::kill(dashboard.pid(), SIGTERM);
  EXPECT_EQ(dashboard.Wait(seconds(30)).code, 0);
}

}  // namespace
}  // namespace trainctl::testing
