// `trainctl eval` (a checkpoint, or each new one of a run as it appears) and `trainctl predict`.
#include <ATen/Parallel.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "checkpoint/meta.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "data/image_header.h"
#include "data/image_stream.h"
#include "job/paths.h"
#include "metrics/metrics.h"
#include "train/entry.h"
#include "train/evaluate.h"
#include "train/torch_data.h"

namespace trainctl::train {
namespace {

// The TorchScript module a checkpoint was trained with: the file the user named (`named`), else
// the run's copy beside the checkpoint (`path`: a checkpoint file or directory); never a path
// from the checkpoint's metadata (checkpoint/module_file.h). Its hash must be the one the
// checkpoint records.
Result<checkpoint::ModuleFile> SavedModule(const checkpoint::ModelMeta& meta, const std::string& path,
                                           const std::string& named) {
  const std::string dir = IsDirectory(path) ? path : std::filesystem::path(path).parent_path().string();
  const std::string file = !named.empty() ? named : (dir.empty() ? "." : dir) + "/" + checkpoint::kModuleCopyName;
  if (meta.torchscript_sha256.empty() && named.empty()) {
    return InvalidArgument(path +
                           ": this checkpoint records no hash of its TorchScript module (it was written "
                           "by an earlier trainctl); name the module it was trained with: --torchscript FILE.pt");
  }
  auto m = checkpoint::ReadModuleFile(file);
  if (!m.ok()) {
    if (named.empty() && m.status().code() == Code::kNotFound) {
      return NotFound(path + ": its TorchScript module " + file +
                      " is missing (a run keeps a copy of it beside its "
                      "model and checkpoints); name the module it was trained with: --torchscript FILE.pt");
    }
    return m.status();
  }
  if (!meta.torchscript_sha256.empty() && m->sha256 != meta.torchscript_sha256) {
    return InvalidArgument(file + ": not the TorchScript module " + path + " was trained with (its sha256 is " +
                           m->sha256 + ", the checkpoint records " + meta.torchscript_sha256 + ")");
  }
  return m;
}

// The model a checkpoint's metadata names (its declared layers, for a declared one; its module,
// for TorchScript: SavedModule).
Result<std::shared_ptr<models::Classifier>> MakeSavedModel(const checkpoint::ModelMeta& meta,
                                                           const models::InputShape& in, const std::string& path,
                                                           const std::string& torchscript) {
  std::vector<LayerSpec> layers;
  if (meta.model == "layers") {
    ASSIGN_OR_RETURN(layers, LayersFromJson(meta.layers, path));
  }
  std::optional<checkpoint::ModuleFile> module;
  if (meta.model == "torchscript") {
    ASSIGN_OR_RETURN(module, SavedModule(meta, path, torchscript));
  }
  auto model = models::MakeModel(meta.model, in, layers, module ? &*module : nullptr);
  if (!model.ok()) return InvalidArgument(path + ": " + model.status().message());
  return model;
}

// Evaluates checkpoints on the test set they name, loading that set once.
class CheckpointEvaluator {
 public:
  explicit CheckpointEvaluator(const EvalOptions& o) : o_(o) {}

  Result<std::string> Report(const checkpoint::Checkpoint& ckpt, const std::string& path, double* accuracy) {
    ASSIGN_OR_RETURN(checkpoint::ModelMeta meta, checkpoint::ReadModelMeta(ckpt, path));
    DataSpec ds;
    ds.dataset = meta.dataset;
    ds.dir = o_.data_dir.empty() ? meta.data_dir : o_.data_dir;
    ds.test_limit = o_.limit;
    ds.shape = {meta.channels, meta.rows, meta.cols};
    ds.classes = meta.classes;
    if (ds.dataset == "imagefolder") {
      // --data names a folder of test images; else the test split the model was trained beside.
      ds.dir = meta.data_dir;
      ds.test_dir = o_.data_dir.empty() ? meta.test_dir : o_.data_dir;
      ds.holdout = meta.holdout;
    }
    const std::string key =
        ds.dataset + "\n" + ds.dir + "\n" + ds.test_dir + "\n" + ckpt.Meta("shape") + "\n" + ckpt.Meta("classes");
    if (key != test_key_ && ds.dataset == "imagefolder" && !ds.test_dir.empty()) {
      // A folder of test images, labelled by the class names the model file records (the
      // training folder need not be on this machine).
      data::FolderOptions fo;
      fo.view.channels = meta.channels;
      fo.view.rows = meta.rows;
      fo.view.cols = meta.cols;
      fo.view.crop_pct = meta.crop_pct;
      fo.classes = meta.class_names;
      fo.limit = o_.limit;
      fo.threads = o_.threads > 0 ? o_.threads : data::DefaultDecodeThreads(1);
      fo.cache_dir = data::DefaultListCacheDir();
      ASSIGN_OR_RETURN(data::Folder folder, data::LoadImageFolder(ds.test_dir, fo));
      test_ = std::move(folder.set);
      test_key_ = key;
    } else if (key != test_key_) {
      ASSIGN_OR_RETURN(test_, LoadSplit(ds, /*train=*/false));
      test_key_ = key;
    }
    test_.num_classes = ds.classes;
    models::InputShape in{test_.channels, test_.rows, test_.cols, ds.classes};
    if (in.channels != meta.channels || in.rows != meta.rows || in.cols != meta.cols) {
      return InvalidArgument("the test images are " + std::to_string(in.channels) + "x" + std::to_string(in.rows) +
                             "x" + std::to_string(in.cols) + ", the model was trained on " + ckpt.Meta("shape"));
    }
    try {
      ASSIGN_OR_RETURN(auto model, MakeSavedModel(meta, in, path, o_.torchscript));
      if (Status st = LoadModuleState(*model, ckpt); !st.ok()) return InvalidArgument(path + ": " + st.message());
      Normalizer norm{meta.mean, meta.std};
      ASSIGN_OR_RETURN(Confusion c, Evaluate(*model, test_, 0, test_.count, norm, o_.batch));
      if (accuracy) *accuracy = c.accuracy();
      auto names = ClassNames(ds.dataset, ds.classes, meta.class_names);
      return o_.format == "json" ? FormatReportJson(c, names) : FormatReport(c, names);
    } catch (const std::exception& e) {
      return Internal(std::string("LibTorch: ") + e.what());
    }
  }

 private:
  const EvalOptions& o_;
  std::string test_key_;
  data::ImageSet test_;
};

Result<checkpoint::Checkpoint> ReadCheckpoint(const std::string& path) { return checkpoint::ReadCheckpointFile(path); }

// The evaluator: each new checkpoint in o.watch, as it appears, until the run's final model is
// there (written after its last checkpoint) or a stop signal.
int RunWatch(const EvalOptions& o) {
  BlockSupervisorSignals();  // a stop ends the watch between two evaluations
  const int64_t since = o.since > 0 ? o.since : static_cast<int64_t>(std::time(nullptr));
  const std::string out =
      o.metrics_dir.empty() ? std::filesystem::path(o.watch).lexically_normal().parent_path().string() : o.metrics_dir;
  auto jsonl = metrics::JsonLines::Open(paths::MetricsJsonl(out));
  auto events = metrics::EventWriter::Open(paths::TensorBoardDir(out) + "/eval");
  if (!jsonl.ok() || !events.ok()) {
    LOG_ERROR("{}", (!jsonl.ok() ? jsonl.status() : events.status()).message());
    return kExitError;
  }
  std::unique_ptr<metrics::JsonLines> jsonl_owner(*jsonl);
  std::unique_ptr<metrics::EventWriter> events_owner(*events);
  LOG_INFO("evaluating each new checkpoint in {} until {} appears", o.watch, paths::Model(out));
  CheckpointEvaluator evaluator(o);
  std::set<std::string> done;
  while (true) {
    // The final model is written after the last checkpoint: look for it first, so that the
    // listing below has every checkpoint it follows. One left from an earlier run does not count.
    struct stat written {};
    const bool final_model = ::stat(paths::Model(out).c_str(), &written) == 0 && written.st_mtim.tv_sec >= since;
    for (const auto& path : checkpoint::CheckpointDir(o.watch, 1).List()) {
      if (done.count(path)) continue;
      auto ckpt = ReadCheckpoint(path);
      if (!ckpt.ok()) {  // pruned (keep_last) since the listing, or not a checkpoint
        LOG_DEBUG("skipping {}: {}", path, ckpt.status().message());
        done.insert(path);
        continue;
      }
      double accuracy = 0;
      auto report = evaluator.Report(*ckpt, path, &accuracy);
      done.insert(path);
      if (!report.ok()) {
        LOG_ERROR("{}", report.status().message());
        return kExitError;
      }
      Status st =
          jsonl_owner->Write({{"step", double(ckpt->step)}, {"test_accuracy", accuracy}}, {{"source", "evaluator"}});
      if (st.ok()) st = events_owner->AddScalar("test/accuracy", accuracy, ckpt->step, WallSeconds());
      if (!st.ok()) LOG_WARN("{}", st.message());
      std::printf("step %lld: test accuracy %.4f (%s)\n", static_cast<long long>(ckpt->step), accuracy, path.c_str());
      std::fflush(stdout);
    }
    if (final_model || StopSignal()) return kExitOk;
    WaitSignal(std::chrono::seconds(1));
  }
}

}  // namespace

// A model file, or a directory's newest valid checkpoint.
Result<checkpoint::Checkpoint> LoadModelFile(const std::string& path) {
  if (!IsDirectory(path)) return ReadCheckpoint(path);
  checkpoint::CheckpointDir dir(path, 1);
  std::vector<std::string> skipped;
  auto ckpt = dir.LoadLatest(&skipped);
  if (!ckpt.ok()) {
    return InvalidArgument(path + ": no valid checkpoint" +
                           (skipped.empty() ? std::string(" (no model.safetensors and no ckpt-*.safetensors in it)")
                                            : "; the newest was refused: " + skipped.front()));
  }
  return ckpt;
}

int RunEval(const EvalOptions& o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  if (!o.watch.empty()) return RunWatch(o);
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "trainctl eval: %s\n", message.c_str());
    return kExitError;
  };
  const std::string& path = o.checkpoint;
  auto ckpt = LoadModelFile(path);
  if (!ckpt.ok()) return fail(ckpt.status().message());
  CheckpointEvaluator evaluator(o);
  auto report = evaluator.Report(*ckpt, path, nullptr);
  if (!report.ok()) return fail(report.status().message());
  std::fwrite(report->data(), 1, report->size(), stdout);
  return kExitOk;
}

// Images as the model takes them: `channels` (grey <-> RGB converted), the model's size.
Result<data::ImageSet> LoadImagesFor(const std::string& path, const checkpoint::ModelMeta& meta) {
  char magic[4] = {};
  const std::string head = ReadFrom(path, 0, sizeof magic);  // "" for what is not a regular file
  std::memcpy(magic, head.data(), head.size());
  // An idx3 image file, or a gzipped one (the Debian packages ship them so).
  const bool idx = std::memcmp(magic, "\0\0\x08\x03", 4) == 0 || std::memcmp(magic, "\x1f\x8b", 2) == 0;
  // The size its header declares, checked before any pixel is decoded (or inflated).
  auto size_error = [&](int64_t rows, int64_t cols) {
    return InvalidArgument(path + ": the image is " + std::to_string(cols) + "x" + std::to_string(rows) +
                           " pixels; the model takes " + std::to_string(meta.cols) + "x" + std::to_string(meta.rows));
  };
  if (meta.dataset != "imagefolder") {
    auto header = data::ReadImageHeader(path);
    if (header.ok() && (header->rows != meta.rows || header->cols != meta.cols))
      return size_error(header->rows, header->cols);
  }
  ASSIGN_OR_RETURN(data::ImageSet set, idx ? data::LoadIdxImages(path) : data::ReadImageFile(path));
  set = data::ToChannels(set, meta.channels);
  // A model trained on an image folder saw every image resized and cropped to its size: so are these.
  if (meta.dataset == "imagefolder" && set.count == 1) {
    data::ViewOptions view;
    view.channels = meta.channels;
    view.rows = meta.rows;
    view.cols = meta.cols;
    view.crop_pct = meta.crop_pct;
    return data::ApplyView(set, view);
  }
  if (set.rows != meta.rows || set.cols != meta.cols) return size_error(set.rows, set.cols);
  return set;
}

int RunPredict(const PredictOptions& o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "trainctl predict: %s\n", message.c_str());
    return kExitError;
  };
  auto ckpt = LoadModelFile(o.checkpoint);
  if (!ckpt.ok()) return fail(ckpt.status().message());
  auto meta = checkpoint::ReadModelMeta(*ckpt, o.checkpoint);
  if (!meta.ok()) return fail(meta.status().message());
  const auto names = ClassNames(meta->dataset, meta->classes, meta->class_names);
  const int top = std::min(std::max(1, o.top), meta->classes);
  nlohmann::json all = nlohmann::json::array();
  try {
    auto model =
        MakeSavedModel(*meta, {meta->channels, meta->rows, meta->cols, meta->classes}, o.checkpoint, o.torchscript);
    if (!model.ok()) return fail(model.status().message());
    if (Status st = LoadModuleState(**model, *ckpt); !st.ok()) return fail(o.checkpoint + ": " + st.message());
    (*model)->eval();
    torch::NoGradGuard no_grad;
    const Normalizer norm{meta->mean, meta->std};
    for (const auto& path : o.images) {
      auto set = LoadImagesFor(path, *meta);
      if (!set.ok()) return fail(set.status().message());
      for (int64_t first = 0; first < set->count; first += 500) {
        const int64_t n = std::min<int64_t>(500, set->count - first);
        std::vector<int64_t> idx(n);
        for (int64_t i = 0; i < n; ++i) idx[i] = first + i;
        torch::Tensor x, y;
        if (Status st = FillBatch(*set, idx.data(), n, norm, &x, &y); !st.ok()) return fail(st.message());
        torch::Tensor probs = torch::softmax((*model)->forward(x), 1);
        auto [p, c] = probs.topk(top, 1);
        for (int64_t i = 0; i < n; ++i) {
          const std::string label = set->count > 1 ? path + "[" + std::to_string(first + i) + "]" : path;
          nlohmann::json classes = nlohmann::json::array();
          std::string line = label + ":";
          for (int k = 0; k < top; ++k) {
            const int cls = static_cast<int>(c[i][k].item<int64_t>());
            const double prob = p[i][k].item<float>();
            const std::string name = cls < static_cast<int>(names.size()) ? names[cls] : std::to_string(cls);
            classes.push_back({{"class", cls}, {"name", name}, {"probability", prob}});
            char buf[64];
            std::snprintf(buf, sizeof buf, " %.1f %%", prob * 100);
            line += std::string(k ? "," : "") + " " + name + buf;
          }
          if (o.format == "json") {
            all.push_back({{"image", label}, {"top", classes}});
          } else {
            std::printf("%s\n", line.c_str());
          }
        }
      }
    }
  } catch (const std::exception& e) {
    return fail(std::string("LibTorch: ") + e.what());
  }
  if (o.format == "json") std::printf("%s\n", all.dump(2).c_str());
  return kExitOk;
}

int RunCheckModule(CheckModuleOptions& o) {
  auto file = checkpoint::ReadModuleFile(o.path);
  if (!file.ok()) {
    o.error = file.status().message();
    return 1;
  }
  try {
    at::set_num_threads(1);
    auto model = models::LoadScripted(*file, {o.channels, o.rows, o.cols, o.classes});
    if (!model.ok()) {
      o.error = model.status().message();
      return 1;
    }
    int64_t params = 0;
    for (const auto& p : (*model)->parameters()) params += p.numel();
    o.summary = std::to_string(params) + " parameters; a batch of 2 images of " + std::to_string(o.channels) + "x" +
                std::to_string(o.rows) + "x" + std::to_string(o.cols) + " gives [2, " + std::to_string(o.classes) +
                "] scores";
  } catch (const std::exception& e) {
    o.error = o.path + ": " + e.what();
    return 1;
  }
  return 0;
}

}  // namespace trainctl::train
