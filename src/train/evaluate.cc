#include "train/evaluate.h"

#include <torch/utils.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

namespace trainctl::train {

double Confusion::total() const { return std::accumulate(counts.begin(), counts.end(), 0.0); }
double Confusion::correct() const {
  double s = 0;
  for (int c = 0; c < classes; ++c) s += counts[c * classes + c];
  return s;
}
double Confusion::accuracy() const { return total() > 0 ? correct() / total() : 0; }
double Confusion::class_total(int c) const {
  return std::accumulate(counts.begin() + c * classes, counts.begin() + (c + 1) * classes, 0.0);
}
double Confusion::class_accuracy(int c) const {
  double t = class_total(c);
  return t > 0 ? counts[c * classes + c] / t : 0;
}

Result<Confusion> Evaluate(models::Classifier& model, const data::ImageSet& set, int64_t begin, int64_t end,
                           const Normalizer& norm, int64_t batch) {
  Confusion out;
  out.classes = set.num_classes;
  out.counts.assign(size_t(out.classes) * out.classes, 0);
  bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  const auto params = model.parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params[0].device();
  std::vector<int64_t> idx;
  torch::Tensor x, y;
  for (int64_t i = begin; i < end; i += batch) {
    int64_t n = std::min(batch, end - i);
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), i);
    if (Status st = FillBatch(set, idx.data(), n, norm, &x, &y); !st.ok()) {
      model.train(was_training);
      return st;
    }
    if (set.stream && i + batch < end) {  // the next batch decoded while this one computes
      std::vector<int64_t> next(static_cast<size_t>(std::min(batch, end - i - batch)));
      std::iota(next.begin(), next.end(), i + batch);
      PrefetchImages(set, next.data(), static_cast<int64_t>(next.size()));
    }
    torch::Tensor pred = model.forward(x.to(device)).argmax(1).to(torch::kCPU);
    auto* p = pred.data_ptr<int64_t>();
    auto* t = y.data_ptr<int64_t>();
    for (int64_t k = 0; k < n; ++k) {
      if (t[k] < out.classes && p[k] < out.classes) out.counts[t[k] * out.classes + p[k]] += 1;
    }
  }
  model.train(was_training);
  return out;
}

std::string FormatReport(const Confusion& c, const std::vector<std::string>& names) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "Accuracy of the network on the %.0f test images: %.1f %%\n", c.total(),
                100 * c.accuracy());
  out += line;
  for (int k = 0; k < c.classes; ++k) {
    std::snprintf(line, sizeof line, "Accuracy for class: %-12s is %5.1f %%\n", names[k].c_str(),
                  100 * c.class_accuracy(k));
    out += line;
  }
  size_t width = 5;
  for (const auto& n : names) width = std::max(width, std::min<size_t>(n.size(), 12));
  out += "\nConfusion matrix (rows: true class, columns: predicted class):\n";
  std::snprintf(line, sizeof line, "%-*s", int(width) + 1, "");
  out += line;
  for (int k = 0; k < c.classes; ++k) {
    std::snprintf(line, sizeof line, " %5d", k);
    out += line;
  }
  out += "\n";
  for (int t = 0; t < c.classes; ++t) {
    std::snprintf(line, sizeof line, "%-*.*s", int(width) + 1, int(width), names[t].c_str());
    out += line;
    for (int p = 0; p < c.classes; ++p) {
      std::snprintf(line, sizeof line, " %5.0f", c.counts[t * c.classes + p]);
      out += line;
    }
    out += "\n";
  }
  return out;
}

std::string FormatReportJson(const Confusion& c, const std::vector<std::string>& names) {
  nlohmann::json j;
  j["images"] = static_cast<int64_t>(c.total());
  j["accuracy"] = c.accuracy();
  j["classes"] = nlohmann::json::array();
  for (int k = 0; k < c.classes; ++k) {
    j["classes"].push_back({{"index", k},
                            {"name", names[k]},
                            {"images", static_cast<int64_t>(c.class_total(k))},
                            {"accuracy", c.class_accuracy(k)}});
  }
  nlohmann::json m = nlohmann::json::array();
  for (int t = 0; t < c.classes; ++t) {
    nlohmann::json row = nlohmann::json::array();
    for (int p = 0; p < c.classes; ++p) row.push_back(static_cast<int64_t>(c.counts[t * c.classes + p]));
    m.push_back(row);
  }
  j["confusion_matrix"] = m;
  return j.dump(2) + "\n";
}

}  // namespace trainctl::train
