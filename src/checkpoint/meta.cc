#include "checkpoint/meta.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

namespace trainctl::checkpoint {
namespace {

constexpr int64_t kMaxCount = int64_t{1} << 40;

Status Bad(const std::string& source, const std::string& field, const std::string& value, const std::string& expected) {
  return InvalidArgument(source + ": metadata field '" + field + "' is " +
                         (value.empty() ? "missing" : "'" + value.substr(0, 64) + "'") + ", expected " + expected);
}

bool ParseInt(const std::string& text, int64_t* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

Result<int64_t> Count(const Checkpoint& c, const std::string& source, const std::string& field, int64_t min,
                      int64_t max) {
  int64_t v = 0;
  const std::string text = c.Meta(field);
  if (!ParseInt(text, &v) || v < min || v > max) {
    return Bad(source, field, text,
               "a whole number from " + std::to_string(min) + " to " + std::to_string(max) +
                   (field == "optimizer.steps" ? " (is it an exported model, not a checkpoint?)" : ""));
  }
  return v;
}

}  // namespace

bool ParseInts(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    int64_t v = 0;
    if (!ParseInt(text.substr(start, comma - start), &v)) return false;
    out->push_back(v);
    if (out->size() > 4096) return false;
    start = comma + 1;
  }
  return !out->empty();
}

bool ParseFloats(const std::string& text, std::vector<float>* out) {
  out->clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    errno = 0;
    const float v = std::strtof(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || errno == ERANGE || !std::isfinite(v)) return false;
    out->push_back(v);
    if (out->size() > 4096) return false;
    start = comma + 1;
  }
  return !out->empty();
}

Result<ModelMeta> ReadModelMeta(const Checkpoint& c, const std::string& source) {
  ModelMeta m;
  m.model = c.Meta("model");
  if (m.model != "cnn" && m.model != "resnet18" && m.model != "resnet50" && m.model != "layers" &&
      m.model != "torchscript") {
    if (m.model.empty() && c.Meta("norm_mean").empty()) {
      return InvalidArgument(source + ": not a trainctl model (its metadata lacks model and norm_mean)");
    }
    return Bad(source, "model", m.model, "cnn, resnet18, resnet50, layers or torchscript");
  }
  if (m.model == "torchscript") {
    m.torchscript_sha256 = c.Meta("torchscript_sha256");
    if (!m.torchscript_sha256.empty() &&
        (m.torchscript_sha256.size() != 64 ||
         m.torchscript_sha256.find_first_not_of("0123456789abcdef") != std::string::npos)) {
      return Bad(source, "torchscript_sha256", m.torchscript_sha256, "the module's sha256, 64 hex digits");
    }
  }
  if (m.model == "layers") {
    m.layers = c.Meta("layers");
    if (m.layers.empty()) return Bad(source, "layers", m.layers, "the declared model's layers (JSON)");
  }
  m.dataset = c.Meta("dataset");
  if (m.dataset != "fashion-mnist" && m.dataset != "mnist" && m.dataset != "cifar10" && m.dataset != "synthetic" &&
      m.dataset != "imagefolder") {
    return Bad(source, "dataset", m.dataset, "fashion-mnist, mnist, cifar10, imagefolder or synthetic");
  }
  m.data_dir = c.Meta("data_dir");
  std::vector<int64_t> shape;
  if (!ParseInts(c.Meta("shape"), &shape) || shape.size() != 3 ||
      std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 1 || d > 4096; })) {
    return Bad(source, "shape", c.Meta("shape"), "channels,rows,cols, each from 1 to 4096");
  }
  m.channels = static_cast<int>(shape[0]);
  m.rows = static_cast<int>(shape[1]);
  m.cols = static_cast<int>(shape[2]);
  ASSIGN_OR_RETURN(int64_t classes, Count(c, source, "classes", 2, 4096));
  m.classes = static_cast<int>(classes);
  if (m.dataset == "imagefolder") {
    // The names, one per class, each on its own line (a folder's name has no newline).
    const std::string names = c.Meta("class_names");
    size_t start = 0;
    while (start <= names.size() && !names.empty() && m.class_names.size() <= 4096) {
      size_t end = names.find('\n', start);
      if (end == std::string::npos) end = names.size();
      m.class_names.push_back(names.substr(start, end - start));
      start = end + 1;
    }
    if (static_cast<int>(m.class_names.size()) != m.classes ||
        std::any_of(m.class_names.begin(), m.class_names.end(),
                    [](const std::string& n) { return n.empty() || n.size() > 255; })) {
      return Bad(source, "class_names", names, std::to_string(m.classes) + " names, one per line");
    }
    m.test_dir = c.Meta("test_dir");
    if (const std::string crop = c.Meta("crop_pct"); !crop.empty()) {  // absent: written before it was kept
      char* end = nullptr;
      m.crop_pct = std::strtod(crop.c_str(), &end);
      if (end != crop.c_str() + crop.size() || !(m.crop_pct > 0 && m.crop_pct <= 1)) {
        return Bad(source, "crop_pct", crop, "a fraction above 0, at most 1");
      }
    }
    const std::string holdout = c.Meta("holdout");
    if (m.test_dir.empty()) {
      char* end = nullptr;
      m.holdout = std::strtod(holdout.c_str(), &end);
      if (holdout.empty() || end != holdout.c_str() + holdout.size() || !(m.holdout >= 0 && m.holdout <= 0.9)) {
        return Bad(source, "holdout", holdout, "a fraction from 0 to 0.9 (or a test_dir)");
      }
    }
  }
  for (const char* field : {"norm_mean", "norm_std"}) {
    std::vector<float>& v = std::string(field) == "norm_mean" ? m.mean : m.std;
    const bool std_field = std::string(field) == "norm_std";
    if (!ParseFloats(c.Meta(field), &v) || static_cast<int>(v.size()) != m.channels ||
        (std_field && std::any_of(v.begin(), v.end(), [](float x) { return !(x > 0); }))) {
      return Bad(
          source, field, c.Meta(field),
          std::to_string(m.channels) + " finite number(s), one per channel" + (std_field ? ", each above 0" : ""));
    }
  }
  return m;
}

Result<Position> ReadPosition(const Checkpoint& c, const std::string& source) {
  Position p;
  ASSIGN_OR_RETURN(p.optimizer_steps, Count(c, source, "optimizer.steps", 0, kMaxCount));
  ASSIGN_OR_RETURN(p.batch_in_epoch, Count(c, source, "batch_in_epoch", 0, kMaxCount));
  ASSIGN_OR_RETURN(p.global_batch, Count(c, source, "global_batch", 1, int64_t{1} << 20));
  ASSIGN_OR_RETURN(p.epoch, Count(c, source, "epoch", 0, kMaxCount));
  return p;
}

}  // namespace trainctl::checkpoint
