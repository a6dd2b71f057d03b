#include "bench/results.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

#include "common/fs.h"
#include "common/strings.h"
#include "job/paths.h"
#include "job/run_status.h"

namespace trainctl::bench {

using nlohmann::json;

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Mean and sample standard deviation; with `mlperf`, of all but the lowest and the highest.
std::pair<double, double> MeanStd(std::vector<double> v, bool mlperf) {
  if (v.empty()) return {-1, 0};
  std::sort(v.begin(), v.end());
  if (mlperf && v.size() >= 5) v = std::vector<double>(v.begin() + 1, v.end() - 1);
  double sum = 0;
  for (double x : v) sum += x;
  const double mean = sum / v.size();
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return {mean, v.size() > 1 ? std::sqrt(sq / (v.size() - 1)) : 0};
}

}  // namespace

std::string FormatFigure(double v, const char* f) {
  if (v < 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string PointText(const Point& p) {
  std::string s;
  for (const auto& [k, v] : p) s += (s.empty() ? "" : ", ") + k + "=" + v;
  return s.empty() ? "(the spec)" : s;
}

// The fields of a point other than those that set the number of workers: the group whose
// smallest configuration scaling efficiency is measured against.
std::string GroupOf(const std::string& system, const Point& p) {
  std::string g = system;
  for (const auto& [k, v] : p) {
    if (k != "nodes" && k != "procs_per_node" && k != "nodes.max" && k != "nodes.min") g += "|" + k + "=" + v;
  }
  return g;
}

json Figures::ToJson() const {
  json p = json::array();
  for (const auto& [k, v] : point) p.push_back({k, v});
  json loss_json = json::array();
  for (auto [s, l] : loss) loss_json.push_back({s, l});
  return {{"id", id},
          {"system", system},
          {"state", state},
          {"point", p},
          {"repeat", repeat},
          {"workers", workers},
          {"exit_code", exit_code},
          {"failure", failure},
          {"started", started},
          {"wall_seconds", wall_seconds},
          {"epoch_seconds", epoch_seconds},
          {"samples_per_s", samples_per_s},
          {"test_accuracy", test_accuracy},
          {"time_to_accuracy", time_to_accuracy},
          {"peak_rss_mb", peak_rss_mb},
          {"comm_wait_seconds", comm_wait_seconds},
          {"restarts", restarts},
          {"loss", loss_json}};
}

Result<Figures> Figures::FromJson(const json& j) {
  // Typed reads: json::value throws on a field of another type, and converts a float such as
  // 1e30 to an int with undefined behaviour.
  std::string bad;
  auto text = [&](const char* k, const char* fallback) -> std::string {
    if (!j.contains(k)) return fallback;
    if (j[k].is_string()) return j[k].get<std::string>();
    if (bad.empty()) bad = std::string("\"") + k + "\" is " + j[k].type_name() + ", expected text";
    return fallback;
  };
  auto number = [&](const char* k, double fallback) -> double {
    if (!j.contains(k)) return fallback;
    if (j[k].is_number()) return j[k].get<double>();
    if (bad.empty()) bad = std::string("\"") + k + "\" is " + j[k].type_name() + ", expected a number";
    return fallback;
  };
  auto whole = [&](const char* k, int fallback) -> int {
    if (!j.contains(k)) return fallback;
    const json& v = j[k];
    if (v.is_number_unsigned() ? v.get<uint64_t>() <= INT_MAX
                               : v.is_number_integer() && v.get<int64_t>() >= INT_MIN && v.get<int64_t>() <= INT_MAX) {
      return static_cast<int>(v.get<int64_t>());
    }
    if (bad.empty()) bad = std::string("\"") + k + "\" is " + v.dump().substr(0, 40) + ", expected a whole number";
    return fallback;
  };
  Figures f;
  f.id = text("id", "");
  f.system = text("system", "");
  f.state = text("state", "pending");
  if (j.contains("point") && j["point"].is_array()) {
    for (const auto& kv : j["point"]) {
      if (kv.is_array() && kv.size() == 2 && kv[0].is_string() && kv[1].is_string()) f.point.emplace_back(kv[0], kv[1]);
    }
  }
  f.repeat = whole("repeat", 0);
  f.workers = whole("workers", 1);
  f.exit_code = whole("exit_code", -1);
  f.failure = text("failure", "");
  f.started = number("started", 0.0);
  f.wall_seconds = number("wall_seconds", -1.0);
  f.epoch_seconds = number("epoch_seconds", -1.0);
  f.samples_per_s = number("samples_per_s", -1.0);
  f.test_accuracy = number("test_accuracy", -1.0);
  f.time_to_accuracy = number("time_to_accuracy", -1.0);
  f.peak_rss_mb = number("peak_rss_mb", -1.0);
  f.comm_wait_seconds = number("comm_wait_seconds", -1.0);
  f.restarts = whole("restarts", 0);
  if (!bad.empty()) return InvalidArgument(bad);
  if (j.contains("loss") && j["loss"].is_array()) {
    for (const auto& p : j["loss"]) {
      if (p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number()) f.loss.emplace_back(p[0], p[1]);
    }
  }
  return f;
}

void ReadFigures(const std::string& output_dir, double target_accuracy, Figures* f) {
  auto text = ReadFile(paths::MetricsJsonl(output_dir), int64_t{256} << 20);
  std::vector<double> epochs, rates;
  std::vector<std::pair<double, double>> loss;
  double comm = -1;
  if (text.ok()) {
    for (const auto& line : SplitLines(*text)) {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_object()) continue;
      auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : -1.0; };
      if (num("epoch_seconds") > 0) epochs.push_back(num("epoch_seconds"));
      if (num("epoch_samples_per_s") > 0) rates.push_back(num("epoch_samples_per_s"));
      for (const char* w : {"allreduce_wait_seconds", "ps_wait_seconds"}) {
        if (num(w) >= 0) comm = std::max(0.0, comm) + num(w);
      }
      if (num("peak_rss_mb") > 0) f->peak_rss_mb = std::max(f->peak_rss_mb, num("peak_rss_mb"));
      if (num("loss") >= 0 && num("step") >= 0) loss.emplace_back(num("step"), num("loss"));
      const double acc = num("test_accuracy");
      if (acc >= 0) {
        f->test_accuracy = acc;
        const double t = num("time");
        if (target_accuracy > 0 && acc >= target_accuracy && f->time_to_accuracy < 0 && t > 0 && f->started > 0) {
          f->time_to_accuracy = t - f->started;
        }
      }
    }
  }
  f->epoch_seconds = Median(epochs);
  f->samples_per_s = Median(rates);
  f->comm_wait_seconds = comm;
  const size_t step = std::max<size_t>(1, (loss.size() + 199) / 200);
  f->loss.clear();
  for (size_t i = 0; i < loss.size(); i += step) f->loss.push_back(loss[i]);
  const RunStatus s = ReadRunStatus(output_dir);
  if (s.restarts) f->restarts = *s.restarts;
  if (f->failure.empty() && s.failure) {
    // The run's failure record (job/records.h): which task, how it ended, its last words.
    const FailureRecord& r = *s.failure;
    f->failure = std::string(FailureKindName(r.kind)) + " failure: " + (r.role.empty() ? "worker" : r.role) + " rank " +
                 std::to_string(r.rank) + ", " + (r.exit.empty() ? "?" : r.exit);
    if (!r.error.empty()) f->failure += ": " + r.error;
    if (r.error.empty() && !r.last_lines.empty()) f->failure += ": " + json(r.last_lines.back()).dump();
  }
}

std::vector<Aggregate> Aggregates(const std::vector<Figures>& experiments, double target_accuracy) {
  std::vector<Aggregate> out;
  std::map<std::string, std::vector<const Figures*>> by_key;
  std::vector<std::string> order;
  for (const auto& f : experiments) {
    const std::string key = f.system + " " + PointText(f.point);
    if (!by_key.count(key)) order.push_back(key);
    by_key[key].push_back(&f);
  }
  for (const auto& key : order) {
    const auto& runs = by_key[key];
    Aggregate a;
    a.key = key;
    a.system = runs[0]->system;
    a.point = runs[0]->point;
    a.workers = runs[0]->workers;
    a.runs = static_cast<int>(runs.size());
    std::vector<double> wall, ep, rate, tta, acc, comm;
    constexpr double kMissed = std::numeric_limits<double>::infinity();
    for (const Figures* f : runs) {
      if (target_accuracy > 0) {
        const bool reached = f->state == "succeeded" && f->time_to_accuracy > 0;
        tta.push_back(reached ? f->time_to_accuracy : kMissed);
        a.missed += reached ? 0 : 1;
      }
      if (f->state != "succeeded") continue;
      ++a.succeeded;
      if (f->wall_seconds > 0) wall.push_back(f->wall_seconds);
      if (f->epoch_seconds > 0) ep.push_back(f->epoch_seconds);
      if (f->samples_per_s > 0) rate.push_back(f->samples_per_s);
      if (f->test_accuracy >= 0) acc.push_back(f->test_accuracy);
      if (f->comm_wait_seconds >= 0) comm.push_back(f->comm_wait_seconds);
      a.rss_max = std::max(a.rss_max, f->peak_rss_mb);
    }
    a.mlperf = a.succeeded >= 5;
    std::tie(a.wall_mean, a.wall_std) = MeanStd(wall, a.mlperf);
    std::tie(a.epoch_mean, a.epoch_std) = MeanStd(ep, a.mlperf);
    std::tie(a.rate_mean, a.rate_std) = MeanStd(rate, a.mlperf);
    std::tie(a.tta_mean, a.tta_std) = MeanStd(tta, tta.size() >= 5);
    if (std::isinf(a.tta_mean) || std::isnan(a.tta_mean)) a.tta_mean = -1, a.tta_std = 0;  // a miss counts
    a.accuracy_mean = MeanStd(acc, false).first;
    a.comm_mean = MeanStd(comm, false).first;
    out.push_back(a);
  }
  // Scaling efficiency: per-worker throughput against the fewest-workers point of the same group.
  std::map<std::string, const Aggregate*> base;
  for (const auto& a : out) {
    if (a.rate_mean <= 0) continue;
    const std::string g = GroupOf(a.system, a.point);
    if (!base.count(g) || a.workers < base[g]->workers) base[g] = &a;
  }
  for (auto& a : out) {
    auto it = base.find(GroupOf(a.system, a.point));
    if (a.rate_mean > 0 && it != base.end()) {
      a.efficiency = (a.rate_mean / a.workers) / (it->second->rate_mean / it->second->workers);
    }
  }
  return out;
}

Status WriteResultsJson(const std::string& dir, const Matrix& m, const std::vector<Figures>& experiments,
                        const std::vector<Aggregate>& aggs) {
  json list = json::array();
  for (const auto& f : experiments) list.push_back(f.ToJson());
  json ag = json::array();
  for (const auto& a : aggs) {
    ag.push_back({{"key", a.key},
                  {"system", a.system},
                  {"point", PointText(a.point)},
                  {"workers", a.workers},
                  {"runs", a.runs},
                  {"succeeded", a.succeeded},
                  {"mlperf", a.mlperf},
                  {"wall_seconds", a.wall_mean},
                  {"wall_seconds_std", a.wall_std},
                  {"epoch_seconds", a.epoch_mean},
                  {"epoch_seconds_std", a.epoch_std},
                  {"samples_per_s", a.rate_mean},
                  {"samples_per_s_std", a.rate_std},
                  {"time_to_accuracy", a.tta_mean},
                  {"time_to_accuracy_std", a.tta_std},
                  {"missed_target", a.missed},
                  {"test_accuracy", a.accuracy_mean},
                  {"peak_rss_mb", a.rss_max},
                  {"comm_wait_seconds", a.comm_mean},
                  {"scaling_efficiency", a.efficiency}});
  }
  json doc = {{"bench", m.name},
              {"matrix", m.path},
              {"target_accuracy", m.target_accuracy},
              {"written", static_cast<int64_t>(std::time(nullptr))},
              {"experiments", list},
              {"aggregates", ag}};
  RETURN_IF_ERROR(AtomicWriteFile(dir + "/results.json", doc.dump(2) + "\n"));
  return Status::Ok();
}

Result<std::vector<Figures>> ReadResults(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/results.json", int64_t{64} << 20));
  auto doc = json::parse(text, nullptr, false);
  if (!doc.is_object() || !doc.contains("experiments") || !doc["experiments"].is_array()) {
    return InvalidArgument(dir + "/results.json: not a trainctl bench result set");
  }
  std::vector<Figures> out;
  const json& experiments = doc["experiments"];
  for (size_t i = 0; i < experiments.size(); ++i) {
    if (!experiments[i].is_object()) continue;
    auto f = Figures::FromJson(experiments[i]);
    if (!f.ok()) {
      return InvalidArgument(dir + "/results.json: experiments[" + std::to_string(i) + "]: " + f.status().message());
    }
    out.push_back(std::move(*f));
  }
  return out;
}

std::string Compare(const std::vector<Figures>& a, const std::vector<Figures>& b, double threshold, int* regressions) {
  *regressions = 0;
  const auto aa = Aggregates(a), bb = Aggregates(b);
  std::string out;
  // The first column as wide as the longest system and point: never cut ("batch_size=128").
  int width = 12;
  for (const auto& x : bb) width = std::max(width, static_cast<int>(x.key.size()));
  char line[1024];
  std::snprintf(line, sizeof line, "%-*s %12s %12s %8s %12s %12s %8s\n", width, "system point", "A samples/s",
                "B samples/s", "B/A", "A epoch s", "B epoch s", "B/A");
  out += line;
  for (const auto& x : bb) {
    auto it = std::find_if(aa.begin(), aa.end(), [&](const Aggregate& y) { return y.key == x.key; });
    if (it == aa.end()) {
      out += x.key + ": only in B\n";
      continue;
    }
    const double rr = it->rate_mean > 0 && x.rate_mean > 0 ? x.rate_mean / it->rate_mean : -1;
    const double er = it->epoch_mean > 0 && x.epoch_mean > 0 ? x.epoch_mean / it->epoch_mean : -1;
    const bool worse =
        (rr > 0 && rr < 1 - threshold) || (er > 0 && er > 1 + threshold) || (it->succeeded > 0 && x.succeeded == 0);
    if (worse) ++*regressions;
    std::snprintf(line, sizeof line, "%-*s %12s %12s %8s %12s %12s %8s%s\n", width, x.key.substr(0, 900).c_str(),
                  FormatFigure(it->rate_mean, "%.1f").c_str(), FormatFigure(x.rate_mean, "%.1f").c_str(),
                  FormatFigure(rr, "%.3f").c_str(), FormatFigure(it->epoch_mean).c_str(),
                  FormatFigure(x.epoch_mean).c_str(), FormatFigure(er, "%.3f").c_str(), worse ? "  REGRESSION" : "");
    out += line;
  }
  for (const auto& y : aa) {
    if (std::none_of(bb.begin(), bb.end(), [&](const Aggregate& x) { return x.key == y.key; }))
      out += y.key + ": only in A\n";
  }
  return out;
}

}  // namespace trainctl::bench
