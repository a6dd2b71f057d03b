// `trainctl bench` as users run it: a real matrix of trainctl jobs and a peer command, its result
// set and its report opened in headless Chromium; Ctrl-C in the middle (every process stopped,
// partial results and the report written), --resume finishing only what was not done; compare;
// a bad point refused before anything runs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/s3_server.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using nlohmann::json;
using std::chrono::seconds;

const std::string kSrc = TRAINCTL_SOURCE_DIR;

// The one result set under `results`.
std::string ResultSet(const Scratch& s, const std::string& name, const std::string& results = "results") {
  for (const auto& e : fs::directory_iterator(s.path(results + "/" + name))) return e.path().string();
  return "";
}

std::map<std::string, std::string> States(const std::string& dir) {
  std::map<std::string, std::string> out;
  auto doc = json::parse(*ReadFile(dir + "/results.json"));
  for (const auto& e : doc["experiments"]) out[e["id"]] = e["state"];
  return out;
}

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every process whose command line mentions `text`.
std::vector<pid_t> ProcessesWith(const std::string& text) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    auto cmd = ReadFile(e.path().string() + "/cmdline");
    if (cmd.ok() && cmd->find(text) != std::string::npos && std::stoi(name) != ::getpid())
      out.push_back(std::stoi(name));
  }
  return out;
}

TEST(Bench, AMatrixRunsItsExperimentsAndTheReportDrawsThemInChromium) {
  Scratch s;
  s.Write("m.yaml",
          "name: tiny\nspec: " + kSrc +
              "/examples/fashion-mnist.yaml\n"
              "set: {trainer.epochs: 2, trainer.data.limit: 512, trainer.data.test_limit: 128, trainer.log_every: 4}\n"
              "axes: {procs_per_node: [1, 2]}\ntarget_accuracy: 0.2\n"
              "peers:\n  - name: broken\n    command: [sh, -c, 'echo disk full on {procs_per_node} >&2; "
              "echo =====; exit 3']\n");
  const std::vector<std::pair<std::string, std::string>> state = {{"TRAINCTL_STATE_DIR", s.path("state")}};
  auto r = Trainctl({"bench", "m.yaml", "--results", "results"}, s.path(""), seconds(240), state);
  EXPECT_EQ(r.exit.code, 1) << "a failed experiment fails the bench\n" << r.output;
  const std::string dir = ResultSet(s, "tiny");
  ASSERT_FALSE(dir.empty()) << r.output;
  auto states = States(dir);
  EXPECT_EQ(states["trainctl-procs_per_node_1"], "succeeded") << r.output;
  EXPECT_EQ(states["trainctl-procs_per_node_2"], "succeeded") << r.output;
  EXPECT_EQ(states["broken-procs_per_node_2"], "failed");
  const std::string csv = *ReadFile(dir + "/results.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5) << csv;  // header + 4
  EXPECT_NE(csv.find("exit code 3: disk full on 2"), std::string::npos) << "its words, not its banner\n" << csv;
  // The experiments ran as jobs of the bench's own name, not as the spec's (fashion-mnist).
  auto listed = json::parse(Trainctl({"ps", "--all", "--json"}, s.path(""), seconds(30), state).output);
  ASSERT_EQ(listed.size(), 2u) << listed;
  for (const auto& run : listed) EXPECT_EQ(run["name"], "bench-tiny") << run;
  // The job's own records: its resolved spec and its metrics, and figures read from them.
  EXPECT_TRUE(fs::exists(dir + "/experiments/trainctl-procs_per_node_2/config/job.json"));
  EXPECT_TRUE(fs::exists(dir + "/experiments/trainctl-procs_per_node_2/output/metrics.jsonl"));
  auto doc = json::parse(*ReadFile(dir + "/results.json"));
  for (const auto& e : doc["experiments"]) {
    if (e["system"] != "trainctl") continue;
    EXPECT_GT(e["samples_per_s"].get<double>(), 0) << e;
    EXPECT_GT(e["test_accuracy"].get<double>(), 0.2) << e;
    EXPECT_GT(e["time_to_accuracy"].get<double>(), 0) << e;
    EXPECT_LT(e["time_to_accuracy"].get<double>(), e["wall_seconds"].get<double>()) << e;
    EXPECT_EQ(e["workers"], e["id"] == "trainctl-procs_per_node_2" ? 2 : 1);
  }
  EXPECT_NE(ReadFile(dir + "/summary.md")->find("| trainctl | procs_per_node=2 | 2 | 1/1 |"), std::string::npos)
      << *ReadFile(dir + "/summary.md");
  // The report, as a browser shows it (no network: everything is in the file).
  auto page =
      RunProgram({"chromium-headless-shell", "--no-sandbox", "--headless", "--disable-gpu", "--window-size=1280,1800",
                  "--screenshot=" + s.path("report.png"), "--dump-dom", "file://" + dir + "/report.html"},
                 s.path(""));
  ASSERT_EQ(page.exit.code, 0) << page.output;
  for (const char* chart :
       {"<svg id=\"throughput\"", "<svg id=\"efficiency\"", "<svg id=\"loss\"", "<svg id=\"tta\""}) {
    EXPECT_NE(page.output.find(chart), std::string::npos) << chart;
  }
  const std::string loss = page.output.substr(page.output.find("<svg id=\"loss\""));
  EXPECT_EQ(Occurrences(loss.substr(0, loss.find("</svg>")), "<polyline"), 2) << "a loss curve per trainctl experiment";
  // Charts a reader can trust: workers ticked at whole numbers, labels whole, one colour per
  // series in every chart, and no "± 0.00" where a single run has no spread.
  auto chart = [&](const std::string& id) {
    const std::string from = page.output.substr(page.output.find("<svg id=\"" + id + "\""));
    return from.substr(0, from.find("</svg>"));
  };
  auto all = [](const std::string& text, const std::string& pattern) {
    std::vector<std::string> out;
    const std::regex re(pattern);
    for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) out.push_back((*it)[1]);
    return out;
  };
  EXPECT_EQ(all(chart("throughput"), "class=\"tick xtick\">([^<]*)<"), (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(all(chart("efficiency"), "class=\"tick barlabel\">([^<]*)<"),
            (std::vector<std::string>{"trainctl procs_per_node=1", "trainctl procs_per_node=2"}));
  EXPECT_EQ(all(chart("efficiency"), "class=\"bar\"[^>]*fill=\"([^\"]*)\""),
            all(chart("tta"), "class=\"bar\"[^>]*fill=\"([^\"]*)\""));
  // The legend's labels whole, in lines that fit its column.
  std::string legend;
  for (const auto& line : all(chart("loss"), "<tspan[^>]*>([^<]*)</tspan>")) {
    EXPECT_LE(line.size(), 26u) << line;
    legend += line;
  }
  EXPECT_EQ(legend, "trainctl procs_per_node=1trainctl procs_per_node=2");
  const auto loss_colors = all(chart("loss"), "<polyline[^>]*stroke=\"([^\"]*)\"");
  EXPECT_EQ(loss_colors, all(chart("tta"), "class=\"bar\"[^>]*fill=\"([^\"]*)\""));
  const std::string summary = *ReadFile(dir + "/summary.md");
  EXPECT_EQ(summary.substr(summary.find("|---")).find("±"), std::string::npos) << "single runs have no spread\n"
                                                                               << summary;
  EXPECT_GT(fs::file_size(s.path("report.png")), 10000u);
  // A result set compared with itself: no regression.
  auto same = Trainctl({"bench", "compare", dir, dir}, s.path(""));
  EXPECT_EQ(same.exit.code, 0) << same.output;
  EXPECT_NE(same.output.find("0 regression(s)"), std::string::npos) << same.output;
}

TEST(Bench, CtrlCStopsEveryProcessKeepsPartialResultsAndResumeFinishesTheRest) {
  Scratch s;
  // The peer waits until the test lets it finish (the file `go`), so Ctrl-C finds it running.
  s.Write("m.yaml",
          "name: stopped\nspec: {name: quick, command: [sh, -c, 'echo done']}\n"
          "axes: {procs_per_node: [1]}\n"
          "peers:\n  - name: waiter\n    command: [sh, -c, 'while [ ! -e " +
              s.path("go") + " ]; do sleep 0.1; done; echo finished']\n");
  Background bench({"bench", "m.yaml", "--results", "results"}, s.path(""), s.path("bench.log"));
  std::string dir;
  ASSERT_TRUE(Eventually(
      [&] {
        dir = fs::exists(s.path("results/stopped")) ? ResultSet(s, "stopped") : "";
        return !dir.empty() && fs::exists(dir + "/results.json") && States(dir)["waiter-procs_per_node_1"] == "running";
      },
      seconds(60)))
      << bench.Output();
  ASSERT_FALSE(ProcessesWith(s.path("go")).empty());
  ::kill(bench.pid(), SIGINT);
  EXPECT_EQ(bench.Wait(seconds(60)).code, 130) << bench.Output();
  EXPECT_TRUE(ProcessesWith(s.path("go")).empty()) << "the experiment outlived the bench";
  auto states = States(dir);
  EXPECT_EQ(states["trainctl-procs_per_node_1"], "succeeded");
  EXPECT_EQ(states["waiter-procs_per_node_1"], "interrupted");
  EXPECT_TRUE(fs::exists(dir + "/report.html"));
  const auto first_run = fs::last_write_time(dir + "/experiments/trainctl-procs_per_node_1/output/bench.log");

  s.Write("go", "");
  auto resumed = Trainctl({"bench", "--resume", dir}, s.path(""), seconds(120));
  EXPECT_EQ(resumed.exit.code, 0) << resumed.output;
  states = States(dir);
  EXPECT_EQ(states["waiter-procs_per_node_1"], "succeeded") << resumed.output;
  EXPECT_EQ(resumed.output.find("[1/2] trainctl"), std::string::npos) << "what succeeded is not run again\n"
                                                                      << resumed.output;
  EXPECT_EQ(fs::last_write_time(dir + "/experiments/trainctl-procs_per_node_1/output/bench.log"), first_run);
}

// upload: the result set PUT to a real S3 server (versitygw on loopback, which checks every
// signature) with SigV4-signed requests: every file, byte for byte, results.json last. A wrong
// secret and a missing bucket are refused with the server's error code, the results kept here
// and no results.json in the bucket; `bench --resume` after the fix uploads everything.
TEST(Bench, TheResultSetIsUploadedToS3WithSignedRequests) {
  Scratch s;
  S3Server server(s.path("s3"));
  ASSERT_TRUE(server.ok()) << server.Log();
  const std::string endpoint = server.endpoint();
  s.Write("m.yaml",
          "name: shared\nspec: {name: quick, command: [sh, -c, 'echo done, secret [$AWS_SECRET_ACCESS_KEY]']}\n"
          "upload: {url: s3://trainctl/nightly/, endpoint: '" +
              endpoint + "', region: us-east-1}\n");
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"AWS_ACCESS_KEY_ID", server.Var("AWS_ACCESS_KEY_ID")},
      {"AWS_SECRET_ACCESS_KEY", server.Var("AWS_SECRET_ACCESS_KEY")}};
  auto r = Trainctl({"bench", "m.yaml", "--results", "results"}, s.path(""), seconds(60), keys);
  EXPECT_EQ(r.exit.code, 0) << r.output;
  const std::string dir = ResultSet(s, "shared");
  const std::string stamp = dir.substr(dir.rfind('/') + 1);
  EXPECT_NE(r.output.find("to s3://trainctl/nightly/shared/" + stamp), std::string::npos) << r.output;
  auto all_uploaded = [&](const std::string& set, const std::string& prefix) {
    int files = 0;
    for (const auto& e : fs::recursive_directory_iterator(set)) {
      if (!e.is_regular_file()) continue;
      ++files;
      const std::string rel = fs::relative(e.path(), set).string();
      auto got = server.Request("trainctl/" + prefix + rel);
      EXPECT_EQ(got.code, 200) << rel << ": " << got.body;
      EXPECT_EQ(got.body, *ReadFile(e.path().string())) << rel;
    }
    return files;
  };
  const int files = all_uploaded(dir, "nightly/shared/" + stamp + "/");
  EXPECT_GE(files, 7);  // results.json/csv, summary.md, report.html, point.yaml, job.json, bench.log...
  EXPECT_NE(r.output.find("uploaded " + std::to_string(files) + " files"), std::string::npos) << r.output;
  // The server checks signatures: the same request signed with another secret is refused.
  auto forged = server.Request("trainctl/nightly/shared/" + stamp + "/results.json", "", "not-the-secret");
  EXPECT_EQ(forged.code, 403);
  EXPECT_NE(forged.body.find("<Code>SignatureDoesNotMatch</Code>"), std::string::npos) << forged.body;
  // The experiments never saw the upload's secret, so no log of theirs carries it to the bucket.
  EXPECT_NE(ReadFile(dir + "/experiments/trainctl/output/logs/worker-0.log")->find("done, secret []"),
            std::string::npos);
  EXPECT_EQ(r.output.find("plain http"), std::string::npos) << "loopback is not the network\n" << r.output;
  // Off loopback, plain http is said (issue 49, item 9: it was accepted without a word).
  s.Write("far.yaml",
          "name: far\nspec: {name: quick, command: [sh, -c, 'echo done']}\n"
          "upload: {url: s3://team-results/nightly/, endpoint: 'http://s3.example.com:9000', region: eu-west-1}\n");
  auto far = Trainctl({"bench", "far.yaml", "--dry-run"}, s.path(""), seconds(60), keys);
  EXPECT_NE(far.output.find("warning: upload.endpoint http://s3.example.com:9000 is plain http"), std::string::npos)
      << far.output;
  EXPECT_EQ(far.output.find("session token"), std::string::npos) << "none was set\n" << far.output;
  // A session token travels in every request's headers: the warning names it (issue 71).
  auto with_token = keys;
  with_token.push_back({"AWS_SESSION_TOKEN", "IQoJb3JpZ2luX2VjE"});
  auto far_token = Trainctl({"bench", "far.yaml", "--dry-run"}, s.path(""), seconds(60), with_token);
  EXPECT_NE(far_token.output.find("and your session token (AWS_SESSION_TOKEN) cross the network unencrypted"),
            std::string::npos)
      << far_token.output;

  // A wrong secret: refused with the server's code; the bench fails, its results stay here, and
  // nothing in the bucket is named as a finished set.
  s.Write("wrong.yaml",
          "name: shared\nspec: {name: quick, command: [sh, -c, 'echo done']}\n"
          "upload: {url: s3://trainctl/retried/, endpoint: '" +
              endpoint + "', region: us-east-1}\n");
  auto wrong = Trainctl({"bench", "wrong.yaml", "--results", "wrong"}, s.path(""), seconds(60),
                        {keys[0], {"AWS_SECRET_ACCESS_KEY", "not-the-secret"}});
  EXPECT_EQ(wrong.exit.code, 1) << wrong.output;
  EXPECT_NE(wrong.output.find("upload failed (the results are still in"), std::string::npos) << wrong.output;
  EXPECT_NE(wrong.output.find("HTTP 403 SignatureDoesNotMatch (AWS_SECRET_ACCESS_KEY is not the secret of"),
            std::string::npos)
      << wrong.output;
  const std::string wrong_dir = ResultSet(s, "shared", "wrong");
  const std::string wrong_stamp = wrong_dir.substr(wrong_dir.rfind('/') + 1);
  EXPECT_EQ(server.Request("trainctl/retried/shared/" + wrong_stamp + "/results.json").code, 404);
  // Once mended, --resume runs nothing again and uploads the whole set.
  auto mended = Trainctl({"bench", "--resume", wrong_dir}, s.path(""), seconds(60), keys);
  EXPECT_EQ(mended.exit.code, 0) << mended.output;
  EXPECT_GE(all_uploaded(wrong_dir, "retried/shared/" + wrong_stamp + "/"), 7);
  // A bucket the server does not have: its code, named.
  s.Write("nobucket.yaml",
          "name: nobucket\nspec: {name: quick, command: [sh, -c, 'echo done']}\n"
          "upload: {url: s3://no-such-bucket/x/, endpoint: '" +
              endpoint + "', region: us-east-1}\n");
  auto nobucket = Trainctl({"bench", "nobucket.yaml", "--results", "nb"}, s.path(""), seconds(60), keys);
  EXPECT_EQ(nobucket.exit.code, 1) << nobucket.output;
  EXPECT_NE(nobucket.output.find("HTTP 404 NoSuchBucket"), std::string::npos) << nobucket.output;
  // No credentials at all: refused before anything runs.
  auto none = Trainctl({"bench", "m.yaml", "--results", "none"}, s.path(""), seconds(60),
                       {{"AWS_ACCESS_KEY_ID", ""}, {"AWS_SECRET_ACCESS_KEY", ""}});
  EXPECT_EQ(none.exit.code, 2) << none.output;
  EXPECT_NE(none.output.find("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"), std::string::npos) << none.output;
  EXPECT_FALSE(fs::exists(s.path("none")));
}

// --format argo: a Workflow that Argo's schema takes (npm's @kubernetes-models/argo-workflows),
// whose pods' commands, run here in DAG order with the shared volume a folder, train and then
// write the result set from the exit handler; a failed peer is recorded, the others succeed.
TEST(Bench, TheArgoWorkflowValidatesAndItsPodsWriteTheResultSet) {
  Scratch s;
  s.Write("m.yaml",
          "name: in-cluster\nspec:\n  name: wf\n  command: [sh, -c, 'echo trained on $WORLD_SIZE']\n"
          "  cluster: {storage: {mount: " +
              s.path("volume") +
              ", claim: shared}, namespace: ml}\n"
              "axes: {procs_per_node: [1, 2]}\nparallel: 2\n"
              "peers: [{name: peer, command: [sh, -c, 'echo \"{\\\"epoch_seconds\\\": 0.{procs_per_node}}\"; "
              "exit $(({procs_per_node} - 1))']}]\n");
  auto r = Trainctl({"bench", "m.yaml", "--format", "argo", "-o", "wf.yaml"}, s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(s.path("bench-results"))) << "rendering runs nothing";
  auto valid = RunProgram({"node", kSrc + "/tests/k8s/validate.mjs", s.path("wf.yaml")}, kSrc);
  EXPECT_EQ(valid.exit.code, 0) << valid.output;
  EXPECT_NE(valid.output.find("Workflow/in-cluster-"), std::string::npos) << valid.output;
  const YAML::Node wf = YAML::LoadFile(s.path("wf.yaml"));
  EXPECT_EQ(wf["metadata"]["namespace"].as<std::string>(), "ml");
  EXPECT_EQ(wf["spec"]["parallelism"].as<int>(), 2);
  EXPECT_EQ(wf["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"].as<std::string>(), "shared");
  // Each pod: its raw artifacts where Argo puts them (a folder here), its command, its volume.
  fs::create_directories(s.path("volume"));
  auto run_pod = [&](const YAML::Node& t) {
    const std::string art = s.path("artifacts/" + t["name"].as<std::string>());
    fs::create_directories(art);
    if (t["inputs"]) {
      for (const auto& a : t["inputs"]["artifacts"]) {
        const std::string path = a["path"].as<std::string>();
        s.Write("artifacts/" + t["name"].as<std::string>() + "/" + path.substr(path.rfind('/') + 1),
                a["raw"]["data"].as<std::string>());
      }
    }
    std::vector<std::string> argv;
    for (const auto& a : t["container"]["command"]) {
      std::string v = std::regex_replace(a.as<std::string>(), std::regex("^/tmp/trainctl/"), art + "/");
      argv.push_back(v == "trainctl" ? std::string(TRAINCTL_BIN) : v);
    }
    SpawnOptions o;
    o.argv = argv;
    o.env = CurrentEnvironment();
    for (const auto& e : t["container"]["env"])
      SetEnv(&o.env, e["name"].as<std::string>(), e["value"].as<std::string>());
    o.cwd = t["container"]["workingDir"].as<std::string>();
    auto done = RunCommand(o, seconds(120));
    EXPECT_TRUE(done.ok());
    return done.ok() ? *done : CommandResult{};
  };
  YAML::Node report;
  int pods = 0;
  for (const auto& t : wf["spec"]["templates"]) {
    if (t["name"].as<std::string>() == "report") report.reset(t);
    if (!t["container"] || t["name"].as<std::string>() == "report") continue;
    ++pods;
    auto done = run_pod(t);
    EXPECT_EQ(done.exit.code, t["name"].as<std::string>().find("peer-procs-per-node-2") != std::string::npos ? 1 : 0)
        << t["name"] << done.output;
  }
  EXPECT_EQ(pods, 4);
  ASSERT_TRUE(report["container"]);
  auto collected = run_pod(report);
  EXPECT_EQ(collected.exit.code, 0) << collected.output;
  std::string dir;
  for (const auto& e : fs::directory_iterator(s.path("volume/bench/in-cluster"))) dir = e.path().string();
  ASSERT_TRUE(fs::exists(dir + "/results.json")) << dir << "\n" << collected.output;
  auto states = States(dir);
  EXPECT_EQ(states["trainctl-procs_per_node_1"], "succeeded");
  EXPECT_EQ(states["trainctl-procs_per_node_2"], "succeeded");
  EXPECT_EQ(states["peer-procs_per_node_1"], "succeeded");
  EXPECT_EQ(states["peer-procs_per_node_2"], "failed");
  EXPECT_NE(ReadFile(dir + "/results.csv")->find("peer-procs_per_node_1,peer,1,1,1,succeeded,0,,0.100,"),
            std::string::npos)
      << *ReadFile(dir + "/results.csv");
  EXPECT_TRUE(fs::exists(dir + "/report.html"));
}

// target k8s without a cluster (there is no API server here): kubectl's one-line verdict, and
// the workflow kept to submit by hand.
TEST(Bench, TheKubernetesTargetNamesAnUnreachableCluster) {
  Scratch s;
  s.Write("m.yaml", "name: far\nspec: {name: wf, command: [sh, -c, 'echo hi']}\ntarget: k8s\n");
  const std::string kubeconfig =
      s.Write("kubeconfig",
              "apiVersion: v1\nkind: Config\nclusters:\n"
              "- cluster: {server: \"https://127.0.0.1:" +
                  std::to_string(FreePort()) +
                  "\"}\n  name: c\n"
                  "contexts:\n- context: {cluster: c, user: u}\n  name: c\ncurrent-context: c\n"
                  "users:\n- name: u\n  user: {token: t}\n");
  auto r =
      Trainctl({"bench", "m.yaml", "--results", "results"}, s.path(""), seconds(120), {{"KUBECONFIG", kubeconfig}});
  EXPECT_EQ(r.exit.code, 1) << r.output;
  EXPECT_NE(r.output.find("trainctl bench: cannot create the workflow ("), std::string::npos) << r.output;
  EXPECT_EQ(CountLines(r.output, "refused"), 1) << r.output;
  const std::string dir = ResultSet(s, "far");
  ASSERT_TRUE(fs::exists(dir + "/workflow.yaml")) << r.output;
  EXPECT_NE(ReadFile(dir + "/workflow.yaml")->find("kind: Workflow"), std::string::npos);
}

TEST(Bench, ABadPointIsRefusedBeforeAnythingRuns) {
  Scratch s;
  s.Write("m.yaml", "name: bad\nspec: " + kSrc + "/examples/fashion-mnist.yaml\naxes: {procs_per_node: [2, 0]}\n");
  auto r = Trainctl({"bench", "m.yaml", "--results", "results"}, s.path(""));
  EXPECT_EQ(r.exit.code, 2) << r.output;
  EXPECT_NE(r.output.find("point {procs_per_node: 0}"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("procs_per_node"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(s.path("results/bad")) && !fs::is_empty(s.path("results/bad")))
      << "nothing ran, nothing kept";
}

// --resume of a result set edited by hand or written by another tool: a mistyped field is named,
// trainctl bench does not end on an exception, and nothing in the set is changed.
TEST(Bench, ResumingAMangledResultSetNamesWhatIsWrongAndChangesNothing) {
  Scratch s;
  const std::string mistyped = "{\"matrix\": \"m.yaml\", \"experiments\": [{\"id\": \"a\", \"state\": 7}]}";
  fs::create_directories(s.path("r"));
  s.Write("r/results.json", mistyped);
  auto r = Trainctl({"bench", "--resume", "r"}, s.path(""));
  EXPECT_EQ(r.exit.code, 2) << r.output;
  EXPECT_NE(r.output.find("r/results.json: experiments[0]: \"state\" is number, expected text"), std::string::npos)
      << r.output;
  EXPECT_EQ(s.Read("r/results.json"), mistyped);
  s.Write("r/results.json", "{\"matrix\": 5, \"experiments\": []}");
  r = Trainctl({"bench", "--resume", "r"}, s.path(""));
  EXPECT_EQ(r.exit.code, 2) << r.output;
  EXPECT_NE(r.output.find("r/results.json does not name its matrix"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trainctl::testing
