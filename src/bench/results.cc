#include "bench/results.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>
#include <set>

#include "common/fs.h"
#include "common/json_field.h"
#include "common/strings.h"
#include "job/paths.h"
#include "job/run_status.h"

namespace trainctl::bench {
namespace {

using nlohmann::json;

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

std::string Fmt(double v, const char* f = "%.3f") {
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

std::string Html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Csv(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
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

// A short name for charts: the system and the point's values by their fields' last names
// ("trainctl batch_size=64"), without the fields that set the workers when `workers` is false.
std::string ShortLabel(const std::string& system, const Point& p, bool workers = true) {
  std::string s = system;
  for (const auto& [k, v] : p) {
    const bool sets_workers = k == "nodes" || k == "procs_per_node" || k == "nodes.max" || k == "nodes.min";
    if (sets_workers && !workers) continue;
    s += " " + k.substr(k.rfind('.') + 1) + "=" + v;
  }
  return s;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// One colour per series (by its label: a system and point), the same in every chart of the
// report, in the order they first appear.
class Palette {
 public:
  const char* operator()(const std::string& label) {
    auto [it, fresh] = index_.try_emplace(label, index_.size());
    return kColors[it->second % 8];
  }

 private:
  std::map<std::string, size_t> index_;
};

struct Series {
  std::string name;
  const char* color;
  std::vector<std::pair<double, double>> xy;
};

struct Bar {
  std::string label;
  double value;
  const char* color;
};

// An SVG line chart with its axes, ticks and legend.
std::string LineChart(const std::string& id, const std::string& title, const std::string& xlabel,
                      const std::string& ylabel, const std::vector<Series>& series) {
  const double W = 640, H = 320, L = 60, R = 200, T = 30, B = 45;
  double x0 = 1e300, x1 = -1e300, y0 = 0, y1 = -1e300;
  for (const auto& s : series) {
    for (auto [x, y] : s.xy) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y1 = std::max(y1, y);
      y0 = std::min(y0, y);
    }
  }
  if (x1 < x0) x0 = 0, x1 = 1;
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 <= y0) y1 = y0 + 1;
  y1 *= 1.05;
  // Ticks on x: at the data's own values when they are a few whole numbers (workers: 1, 2, 4),
  // else at five even steps.
  std::set<double> xs;
  for (const auto& s : series) {
    for (auto [x, y] : s.xy) xs.insert(x);
  }
  const bool whole = xs.size() <= 12 && std::all_of(xs.begin(), xs.end(), [](double x) { return x == std::floor(x); });
  std::vector<double> xticks(xs.begin(), xs.end());
  if (!whole || xs.empty()) {
    xticks.clear();
    for (int i = 0; i <= 4; ++i) xticks.push_back(x0 + (x1 - x0) * i / 4);
  }
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string svg = "<svg id=\"" + id +
                    "\" class=\"chart\" viewBox=\"0 0 640 320\" width=\"640\" height=\"320\" "
                    "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"" +
                    Html(title) + "\">";
  svg += "<text x=\"320\" y=\"18\" text-anchor=\"middle\" class=\"title\">" + Html(title) + "</text>";
  svg += "<line x1=\"" + Fmt(L, "%.0f") + "\" y1=\"" + Fmt(H - B, "%.0f") + "\" x2=\"" + Fmt(W - R, "%.0f") +
         "\" y2=\"" + Fmt(H - B, "%.0f") + "\" class=\"axis\"/>";
  svg += "<line x1=\"" + Fmt(L, "%.0f") + "\" y1=\"" + Fmt(T, "%.0f") + "\" x2=\"" + Fmt(L, "%.0f") + "\" y2=\"" +
         Fmt(H - B, "%.0f") + "\" class=\"axis\"/>";
  for (double xv : xticks) {
    svg += "<text x=\"" + Fmt(X(xv), "%.1f") + "\" y=\"" + Fmt(H - B + 16, "%.0f") +
           "\" text-anchor=\"middle\" class=\"tick xtick\">" + Fmt(xv, "%.4g") + "</text>";
  }
  for (int i = 0; i <= 4; ++i) {
    const double yv = y0 + (y1 - y0) * i / 4;
    svg += "<text x=\"" + Fmt(L - 6, "%.0f") + "\" y=\"" + Fmt(Y(yv) + 4, "%.1f") +
           "\" text-anchor=\"end\" class=\"tick\">" + Fmt(yv, "%.4g") + "</text>";
  }
  svg += "<text x=\"" + Fmt((L + W - R) / 2, "%.0f") + "\" y=\"" + Fmt(H - 8, "%.0f") +
         "\" text-anchor=\"middle\" class=\"label\">" + Html(xlabel) + "</text>";
  svg += "<text x=\"14\" y=\"" + Fmt((T + H - B) / 2, "%.0f") + "\" transform=\"rotate(-90 14 " +
         Fmt((T + H - B) / 2, "%.0f") + ")\" text-anchor=\"middle\" class=\"label\">" + Html(ylabel) + "</text>";
  constexpr size_t kLegendChars = 26;
  double ly = T + 8;  // the next legend entry's first line
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = series[i].color;
    std::string pts;
    for (auto [x, y] : series[i].xy) pts += Fmt(X(x), "%.1f") + "," + Fmt(Y(y), "%.1f") + " ";
    svg += "<polyline class=\"series\" fill=\"none\" stroke=\"" + std::string(color) +
           "\" stroke-width=\"2\" points=\"" + pts + "\"/>";
    for (auto [x, y] : series[i].xy) {
      if (series[i].xy.size() <= 30) {
        svg += "<circle class=\"point\" cx=\"" + Fmt(X(x), "%.1f") + "\" cy=\"" + Fmt(Y(y), "%.1f") +
               "\" r=\"3\" fill=\"" + color + "\"/>";
      }
    }
    // The whole name, in lines that fit the legend's column (11 px text: 26 characters), broken
    // after a space, comma, '=' or '/' where one is near the end.
    std::vector<std::string> lines;
    for (std::string rest = series[i].name; !rest.empty();) {
      size_t cut = rest.size() <= kLegendChars ? rest.size() : rest.find_last_of(" ,=/", kLegendChars - 1);
      cut = cut == std::string::npos || cut < kLegendChars / 2 ? std::min(rest.size(), kLegendChars)
            : cut == rest.size()                               ? cut
                                                               : cut + 1;
      lines.push_back(rest.substr(0, cut));
      rest.erase(0, cut);
    }
    svg += "<rect x=\"" + Fmt(W - R + 10, "%.0f") + "\" y=\"" + Fmt(ly - 8, "%.0f") +
           "\" width=\"10\" height=\"10\" fill=\"" + color + "\"/><text class=\"legend\">";
    for (const auto& line : lines) {
      svg +=
          "<tspan x=\"" + Fmt(W - R + 24, "%.0f") + "\" y=\"" + Fmt(ly + 1, "%.0f") + "\">" + Html(line) + "</tspan>";
      ly += 13;
    }
    svg += "</text>";
    ly += 3;
  }
  return svg + "</svg>";
}

// An SVG bar chart, one bar per label; the labels stand upright under their bars, whole: the
// chart grows as tall as the longest needs.
std::string BarChart(const std::string& id, const std::string& title, const std::string& ylabel,
                     const std::vector<Bar>& bars) {
  size_t longest = 0;
  for (const auto& b : bars) longest = std::max(longest, b.label.size());
  const double W = 640, T = 30, L = 60, B = 16 + 6.0 * static_cast<double>(std::min<size_t>(longest, 120)), H = 230 + B;
  double top = 0;
  for (const auto& b : bars) top = std::max(top, b.value);
  if (top <= 0) top = 1;
  top *= 1.1;
  const double slot = (W - L - 20) / std::max<size_t>(1, bars.size());
  const std::string height = Fmt(H, "%.0f");
  std::string svg = "<svg id=\"" + id + "\" class=\"chart\" viewBox=\"0 0 640 " + height +
                    "\" width=\"640\" height=\"" + height +
                    "\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"" + Html(title) + "\">";
  svg += "<text x=\"320\" y=\"18\" text-anchor=\"middle\" class=\"title\">" + Html(title) + "</text>";
  svg +=
      "<line x1=\"60\" y1=\"" + Fmt(H - B, "%.0f") + "\" x2=\"620\" y2=\"" + Fmt(H - B, "%.0f") + "\" class=\"axis\"/>";
  svg += "<text x=\"14\" y=\"" + Fmt((T + H - B) / 2, "%.0f") + "\" transform=\"rotate(-90 14 " +
         Fmt((T + H - B) / 2, "%.0f") + ")\" text-anchor=\"middle\" class=\"label\">" + Html(ylabel) + "</text>";
  for (size_t i = 0; i < bars.size(); ++i) {
    const double h = bars[i].value / top * (H - T - B), x = L + slot * i + slot * 0.15;
    svg += "<rect class=\"bar\" x=\"" + Fmt(x, "%.1f") + "\" y=\"" + Fmt(H - B - h, "%.1f") + "\" width=\"" +
           Fmt(slot * 0.7, "%.1f") + "\" height=\"" + Fmt(h, "%.1f") + "\" fill=\"" + bars[i].color + "\"/>";
    svg += "<text x=\"" + Fmt(x + slot * 0.35, "%.1f") + "\" y=\"" + Fmt(H - B - h - 4, "%.1f") +
           "\" text-anchor=\"middle\" class=\"tick\">" + Fmt(bars[i].value, "%.3g") + "</text>";
    const double lx = x + slot * 0.35 + 3, ly = H - B + 6;
    svg += "<text x=\"" + Fmt(lx, "%.1f") + "\" y=\"" + Fmt(ly, "%.1f") + "\" transform=\"rotate(-90 " +
           Fmt(lx, "%.1f") + " " + Fmt(ly, "%.1f") + ")\" text-anchor=\"end\" class=\"tick barlabel\">" +
           Html(bars[i].label.substr(0, 120)) + "</text>";
  }
  return svg + "</svg>";
}

const char* kCss =
    "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:right}th{background:#f3f3f3}"
    "td.l,th.l{text-align:left}.failed{color:#b00}.chart{margin:8px 16px 8px 0;border:1px solid #eee}"
    ".axis{stroke:#444}.tick{font-size:10px;fill:#444}.label{font-size:12px;fill:#222}"
    ".title{font-size:14px;font-weight:bold}.legend{font-size:11px}";

}  // namespace

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

namespace {

// A mean, ± its standard deviation when there is more than one run to have one.
std::string PlusMinus(double mean, double sd, const char* f, int runs) {
  return mean < 0 ? std::string("-") : runs < 2 ? Fmt(mean, f) : Fmt(mean, f) + " ± " + Fmt(sd, f);
}

// The time to accuracy, and how many runs missed the target: "13.02 ± 0.15 (1/5 missed)".
std::string TimeToAccuracyText(const Aggregate& a) {
  std::string t = PlusMinus(a.tta_mean, a.tta_std, "%.2f", a.runs);
  if (a.missed > 0) t += " (" + std::to_string(a.missed) + "/" + std::to_string(a.runs) + " missed)";
  return t;
}

// results.json: every experiment's figures and every aggregate's.
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

// results.csv: one row per experiment.
Status WriteResultsCsv(const std::string& dir, const std::vector<Figures>& experiments) {
  std::vector<std::string> keys;
  for (const auto& f : experiments) {
    for (const auto& [k, v] : f.point) {
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
  }
  std::string csv = "id,system,repeat";
  for (const auto& k : keys) csv += "," + Csv(k);
  csv +=
      ",workers,state,exit_code,wall_seconds,epoch_seconds,samples_per_s,test_accuracy,time_to_accuracy,"
      "peak_rss_mb,comm_wait_seconds,restarts,failure\n";
  for (const auto& f : experiments) {
    csv += Csv(f.id) + "," + Csv(f.system) + "," + std::to_string(f.repeat + 1);
    for (const auto& k : keys) {
      auto it = std::find_if(f.point.begin(), f.point.end(), [&](const auto& kv) { return kv.first == k; });
      csv += "," + (it == f.point.end() ? std::string() : Csv(it->second));
    }
    csv += "," + std::to_string(f.workers) + "," + f.state + "," + std::to_string(f.exit_code) + "," +
           Fmt(f.wall_seconds) + "," + Fmt(f.epoch_seconds) + "," + Fmt(f.samples_per_s, "%.1f") + "," +
           Fmt(f.test_accuracy, "%.4f") + "," + Fmt(f.time_to_accuracy) + "," + Fmt(f.peak_rss_mb, "%.1f") + "," +
           Fmt(f.comm_wait_seconds) + "," + std::to_string(f.restarts) + "," + Csv(f.failure) + "\n";
  }
  RETURN_IF_ERROR(AtomicWriteFile(dir + "/results.csv", csv));
  return Status::Ok();
}

// summary.md: the aggregates' table, and the experiments that did not succeed.
Status WriteSummary(const std::string& dir, const Matrix& m, const std::vector<Figures>& experiments,
                    const std::vector<Aggregate>& aggs) {
  std::string md = "# " + m.name + "\n\nMatrix `" + m.path + "`; " + std::to_string(experiments.size()) +
                   " experiments. Means ± standard deviations over the runs that succeeded (with 5 or more, "
                   "the fastest and the slowest dropped, as MLPerf does); the time to accuracy over every "
                   "run, one that missed the target counting as the slowest (no figure when one counts).\n\n"
                   "| system | point | workers | ok/runs | wall s | epoch s | samples/s | scaling eff. | test acc. | " +
                   (m.target_accuracy > 0 ? "time to " + Fmt(m.target_accuracy, "%.2f") : std::string("time to acc.")) +
                   " s | peak RSS MB | comm wait s |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& a : aggs) {
    md += "| " + a.system + " | " + PointText(a.point) + " | " + std::to_string(a.workers) + " | " +
          std::to_string(a.succeeded) + "/" + std::to_string(a.runs) + " | " +
          PlusMinus(a.wall_mean, a.wall_std, "%.2f", a.succeeded) + " | " +
          PlusMinus(a.epoch_mean, a.epoch_std, "%.3f", a.succeeded) + " | " +
          PlusMinus(a.rate_mean, a.rate_std, "%.0f", a.succeeded) + " | " +
          (a.efficiency < 0 ? "-" : Fmt(a.efficiency, "%.3f")) + " | " +
          (a.accuracy_mean < 0 ? "-" : Fmt(a.accuracy_mean, "%.4f")) + " | " + TimeToAccuracyText(a) + " | " +
          (a.rss_max < 0 ? "-" : Fmt(a.rss_max, "%.0f")) + " | " + (a.comm_mean < 0 ? "-" : Fmt(a.comm_mean, "%.3f")) +
          " |\n";
  }
  std::string failed;
  for (const auto& f : experiments) {
    if (f.state != "succeeded")
      failed += "- `" + f.id + "`: " + f.state + (f.failure.empty() ? "" : ": " + f.failure) + "\n";
  }
  if (!failed.empty()) md += "\n## Not succeeded\n\n" + failed;
  RETURN_IF_ERROR(AtomicWriteFile(dir + "/summary.md", md));
  return Status::Ok();
}

// report.html: the tables and the charts.
Status WriteReport(const std::string& dir, const Matrix& m, const std::vector<Figures>& experiments,
                   const std::vector<Aggregate>& aggs) {
  std::string h = "<!doctype html><html><head><meta charset=\"utf-8\"><title>" + Html(m.name) +
                  " — trainctl bench</title><style>" + kCss + "</style></head><body><h1>" + Html(m.name) + "</h1>";
  h += "<p>" + std::to_string(experiments.size()) + " experiments from <code>" + Html(m.path) + "</code>.</p>";
  h += "<table id=\"aggregates\"><tr><th class=\"l\">system</th><th "
       "class=\"l\">point</th><th>workers</th><th>ok/runs</th>"
       "<th>wall s</th><th>epoch s</th><th>samples/s</th><th>scaling eff.</th><th>test acc.</th><th>time to acc. s</th>"
       "<th>peak RSS MB</th></tr>";
  for (const auto& a : aggs) {
    h += "<tr><td class=\"l\">" + Html(a.system) + "</td><td class=\"l\">" + Html(PointText(a.point)) + "</td><td>" +
         std::to_string(a.workers) + "</td><td>" + std::to_string(a.succeeded) + "/" + std::to_string(a.runs) +
         "</td><td>" + Html(PlusMinus(a.wall_mean, a.wall_std, "%.2f", a.succeeded)) + "</td><td>" +
         Html(PlusMinus(a.epoch_mean, a.epoch_std, "%.3f", a.succeeded)) + "</td><td>" +
         Html(PlusMinus(a.rate_mean, a.rate_std, "%.0f", a.succeeded)) + "</td><td>" +
         (a.efficiency < 0 ? "-" : Fmt(a.efficiency)) + "</td><td>" +
         (a.accuracy_mean < 0 ? "-" : Fmt(a.accuracy_mean, "%.4f")) + "</td><td>" + Html(TimeToAccuracyText(a)) +
         "</td><td>" + (a.rss_max < 0 ? "-" : Fmt(a.rss_max, "%.0f")) + "</td></tr>";
  }
  h += "</table><div class=\"charts\">";
  // Throughput against workers, one line per system and group.
  Palette color;
  std::map<std::string, Series> lines;
  std::vector<Bar> eff, tta;
  for (const auto& a : aggs) {
    if (a.rate_mean > 0) {
      Series& s = lines[GroupOf(a.system, a.point)];
      s.name = ShortLabel(a.system, a.point, false);
      s.color = color(s.name);
      s.xy.emplace_back(a.workers, a.rate_mean);
    }
    const std::string label = ShortLabel(a.system, a.point);
    if (a.efficiency >= 0) eff.push_back({label, a.efficiency, color(label)});
    if (a.tta_mean > 0) tta.push_back({label, a.tta_mean, color(label)});
  }
  std::vector<Series> tput;
  for (auto& [g, s] : lines) {
    std::sort(s.xy.begin(), s.xy.end());
    tput.push_back(s);
  }
  h += LineChart("throughput", "Throughput against workers", "workers", "samples/s", tput);
  h += BarChart("efficiency", "Scaling efficiency (per-worker throughput vs. the fewest workers)", "efficiency", eff);
  std::vector<Series> loss;
  for (const auto& f : experiments) {
    if (f.repeat == 0 && !f.loss.empty())
      loss.push_back({ShortLabel(f.system, f.point), color(ShortLabel(f.system, f.point)), f.loss});
  }
  h += LineChart("loss", "Training loss", "step", "loss", loss);
  if (m.target_accuracy > 0) {
    h += BarChart("tta", "Time to " + Fmt(m.target_accuracy, "%.2f") + " test accuracy", "seconds", tta);
  }
  h += "</div><h2>Experiments</h2><table id=\"experiments\"><tr><th class=\"l\">id</th><th class=\"l\">state</th>"
       "<th>wall s</th><th>epoch s</th><th>samples/s</th><th>test acc.</th><th>restarts</th><th "
       "class=\"l\">failure</th></tr>";
  for (const auto& f : experiments) {
    h += "<tr" + std::string(f.state == "succeeded" ? "" : " class=\"failed\"") + "><td class=\"l\">" + Html(f.id) +
         "</td><td class=\"l\">" + Html(f.state) + "</td><td>" + Fmt(f.wall_seconds, "%.2f") + "</td><td>" +
         Fmt(f.epoch_seconds) + "</td><td>" + Fmt(f.samples_per_s, "%.0f") + "</td><td>" +
         Fmt(f.test_accuracy, "%.4f") + "</td><td>" + std::to_string(f.restarts) + "</td><td class=\"l\">" +
         Html(f.failure) + "</td></tr>";
  }
  h += "</table></body></html>\n";
  return AtomicWriteFile(dir + "/report.html", h);
}

}  // namespace

Status WriteResults(const std::string& dir, const Matrix& m, const std::vector<Figures>& experiments) {
  const auto aggs = Aggregates(experiments, m.target_accuracy);
  RETURN_IF_ERROR(WriteResultsJson(dir, m, experiments, aggs));
  RETURN_IF_ERROR(WriteResultsCsv(dir, experiments));
  RETURN_IF_ERROR(WriteSummary(dir, m, experiments, aggs));
  return WriteReport(dir, m, experiments, aggs);
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
                  Fmt(it->rate_mean, "%.1f").c_str(), Fmt(x.rate_mean, "%.1f").c_str(), Fmt(rr, "%.3f").c_str(),
                  Fmt(it->epoch_mean).c_str(), Fmt(x.epoch_mean).c_str(), Fmt(er, "%.3f").c_str(),
                  worse ? "  REGRESSION" : "");
    out += line;
  }
  for (const auto& y : aa) {
    if (std::none_of(bb.begin(), bb.end(), [&](const Aggregate& x) { return x.key == y.key; }))
      out += y.key + ": only in A\n";
  }
  return out;
}

}  // namespace trainctl::bench
