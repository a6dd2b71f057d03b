#include "metrics/timeline.h"

#include <nlohmann/json.hpp>

namespace trainctl::metrics {
namespace {

int64_t Micros(Timeline::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

void Timeline::Add(const char* name, int64_t step, Clock::time_point start, Clock::time_point end, int64_t items) {
  if (!Records(step)) return;
  spans_.push_back(Span{name, step, Micros(start), std::max<int64_t>(0, Micros(end) - Micros(start)), items});
}

std::string Timeline::Events(int node, const std::string& host, int rank, const std::string& role) const {
  using nlohmann::json;
  json events = json::array();
  const std::string node_name = "node " + std::to_string(node) + (host.empty() ? "" : " (" + host + ")");
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", node}, {"args", {{"name", node_name}}}});
  events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", node}, {"args", {{"sort_index", node}}}});
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", node},
                    {"tid", rank},
                    {"args", {{"name", "rank " + std::to_string(rank) + (role.empty() ? "" : " (" + role + ")")}}}});
  events.push_back(
      {{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", node}, {"tid", rank}, {"args", {{"sort_index", rank}}}});
  for (const Span& s : spans_) {
    json args = {{"step", s.step}};
    if (s.items >= 0) args["items"] = s.items;
    events.push_back({{"name", s.name},
                      {"cat", "train"},
                      {"ph", "X"},
                      {"ts", s.start_us},
                      {"dur", s.duration_us},
                      {"pid", node},
                      {"tid", rank},
                      {"args", args}});
  }
  return events.dump(-1, ' ', false, json::error_handler_t::replace);
}

Timeline::Step::Step(Timeline* t, int64_t step) : t_(t && t->Records(step) ? t : nullptr), step_(step) {
  if (t_) start_ = last_ = Clock::now();
}

Timeline::Step::~Step() {
  if (t_) t_->Add("step", step_, start_, last_, items_);
}

void Timeline::Step::End(const char* name) {
  if (!t_) return;
  const auto now = Clock::now();
  t_->Add(name, step_, last_, now);
  last_ = now;
}

Result<std::string> MergeTimelines(const std::vector<std::string>& ranks) {
  using nlohmann::json;
  json events = json::array();
  for (size_t i = 0; i < ranks.size(); ++i) {
    json one = json::parse(ranks[i], nullptr, /*allow_exceptions=*/false);
    if (!one.is_array()) {
      return InvalidArgument("timeline part " + std::to_string(i) + " is not a JSON array of trace events");
    }
    for (auto& e : one) events.push_back(std::move(e));
  }
  json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace trainctl::metrics
