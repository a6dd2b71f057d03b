#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "common/fs.h"

namespace trainctl::bench {
namespace {

using nlohmann::json;

std::string Fmt(double v, const char* f = "%.3f") { return FormatFigure(v, f); }

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

}  // namespace trainctl::bench
