// Test-set evaluation: the confusion matrix, overall and per-class accuracy, and the report that
// `trainctl eval` prints (text, or JSON for scripts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "models/models.h"
#include "train/torch_data.h"

namespace trainctl::train {

struct Confusion {
  int classes = 0;
  std::vector<double> counts;  // [true class * classes + predicted class]; doubles so ranks can
                               // allreduce them (exact below 2^53)
  double total() const;
  double correct() const;
  double accuracy() const;             // 0 when empty
  double class_accuracy(int c) const;  // 0 when the class has no images
  double class_total(int c) const;
};

// Runs the model in eval mode without gradients over images [begin, end) of `set`.
Result<Confusion> Evaluate(models::Classifier& model, const data::ImageSet& set, int64_t begin, int64_t end,
                           const Normalizer& norm, int64_t batch = 500);

std::string FormatReport(const Confusion& c, const std::vector<std::string>& names);
std::string FormatReportJson(const Confusion& c, const std::vector<std::string>& names);

}  // namespace trainctl::train
