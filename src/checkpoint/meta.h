// What the built-in trainer writes in a checkpoint's metadata, read back with every value checked:
// a crafted or corrupt file (the CRC covers only the tensor data) gives an error that names the
// file, the field and what was expected, never a crash, a division by zero or a huge allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/status.h"

namespace trainctl::checkpoint {

struct ModelMeta {
  std::string model;   // cnn | resnet18 | resnet50 | layers | torchscript
  std::string layers;  // layers: the declared model's layers, as the spec's JSON writes them
  // torchscript: the sha256 of the module it was trained with (checkpoint/module_file.h); "" in a
  // checkpoint of a trainctl before 2026-11-28, which named the module by path (never followed).
  std::string torchscript_sha256;
  std::string dataset, data_dir;
  // imagefolder: its classes' names (index = label), and where its test images are: test_dir, or
  // the fraction holdout of data_dir's.
  std::vector<std::string> class_names;
  std::string test_dir;
  double holdout = 0;
  double crop_pct = 1;                   // imagefolder: the centre view's share (data/image_view.h), 0 < x <= 1
  int channels = 0, rows = 0, cols = 0;  // 1 to 4096 each
  int classes = 0;                       // 2 to 4096
  std::vector<float> mean, std;          // one per channel; finite; std > 0
};
// kInvalidArgument: "<source>: metadata field 'classes' is '0', expected a whole number from 2 to 4096".
Result<ModelMeta> ReadModelMeta(const Checkpoint& c, const std::string& source);

// Where training stood: a checkpoint's, not an exported model's (which lacks these fields).
struct Position {
  int64_t optimizer_steps = 0;
  int64_t batch_in_epoch = 0;
  int64_t global_batch = 1;
  int64_t epoch = 0;
  int64_t samples_in_epoch() const { return batch_in_epoch * global_batch; }
};
Result<Position> ReadPosition(const Checkpoint& c, const std::string& source);

// "1,28,28" -> {1, 28, 28}, "0.5,0.25" -> {0.5, 0.25}; nullopt-like false on anything else.
bool ParseInts(const std::string& text, std::vector<int64_t>* out);
bool ParseFloats(const std::string& text, std::vector<float>* out);

}  // namespace trainctl::checkpoint
