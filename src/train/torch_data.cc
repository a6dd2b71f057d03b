#include "train/torch_data.h"

#include <cmath>
#include <cstring>

#include "data/image_stream.h"
#include "train/entry.h"

namespace trainctl::train {
namespace {

const std::vector<std::string> kCifar10Classes = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                  "dog",      "frog",       "horse", "ship", "truck"};

std::vector<LoadedSplit>& PreloadedSplits() {
  static std::vector<LoadedSplit> splits;  // a worker server's, before any copy (one thread)
  return splits;
}

}  // namespace

const data::ImageSet* PreloadSplits(const DataSpec& spec, bool test) {
  return KeepSplits(LoadSplitsToKeep(spec, test));
}

const data::ImageSet* KeepSplits(std::vector<LoadedSplit> loaded) {
  auto& splits = PreloadedSplits();
  splits.reserve(splits.size() + loaded.size());  // the pointer returned stays valid
  const data::ImageSet* train_set = nullptr;
  for (LoadedSplit& l : loaded) {
    splits.push_back(std::move(l));
    if (splits.back().train) train_set = &splits.back().set;
  }
  return train_set;
}

Result<data::ImageSet> LoadSplit(const DataSpec& spec, bool train, Normalizer* norm) {
  auto& splits = PreloadedSplits();
  if (!splits.empty()) {
    const std::string key = SplitKey(spec, train);
    for (auto it = splits.begin(); it != splits.end(); ++it) {
      if (it->key != key) continue;
      data::ImageSet set = std::move(it->set);  // its pages stay shared with the server's
      if (norm) *norm = it->norm.mean.empty() ? Normalizer::Compute(set) : std::move(it->norm);
      splits.erase(it);
      return set;
    }
  }
  ASSIGN_OR_RETURN(auto set, LoadSplitFromFiles(spec, train));
  if (norm) *norm = Normalizer::Compute(set);
  return set;
}

std::vector<std::string> ClassNames(const std::string& dataset, int classes, const std::vector<std::string>& own) {
  if (static_cast<int>(own.size()) == classes) return own;
  if (dataset == "fashion-mnist" && classes == 10) return data::FashionMnistClasses();
  if (dataset == "cifar10" && classes == 10) return kCifar10Classes;
  std::vector<std::string> names;
  for (int i = 0; i < classes; ++i) {
    names.push_back(dataset == "mnist" ? std::to_string(i) : "class " + std::to_string(i));
  }
  return names;
}

void PrefetchImages(const data::ImageSet& set, const int64_t* indices, int64_t n, int64_t epoch) {
  if (set.stream) {  // decoded by the stream's threads meanwhile
    set.stream->Prefetch(indices, n, epoch);
    return;
  }
  const int64_t bytes = set.image_bytes();
  for (int64_t i = 0; i < n; ++i) {
    const char* p = reinterpret_cast<const char*>(set.image(indices[i]));
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, /*rw=*/0, /*locality=*/1);
  }
}

namespace {

// Image i's pixels into `out` (planar), shifted and mirrored as `augment` draws for its index in
// the run, each byte through `put` (the normalization's table, or as it is).
template <class Out, class Put>
Out* Place(const uint8_t* src, const data::ImageSet& set, int64_t index, const Augment* augment, Out* out, Put put) {
  const int64_t plane = int64_t{set.rows} * set.cols;
  if (!augment || !augment->on()) {
    for (int c = 0; c < set.channels; ++c) {
      for (int64_t k = 0; k < plane; ++k) *out++ = put(c, src[c * plane + k]);
    }
    return out;
  }
  // splitmix64 of the image's place in the run: its shift and its flip.
  uint64_t h = augment->seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(augment->epoch) << 40) ^
               static_cast<uint64_t>(index);
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  const int p = augment->crop_padding, span = 2 * p + 1;
  const int dy = static_cast<int>((h >> 8) % span) - p, dx = static_cast<int>((h >> 24) % span) - p;
  const bool flip = augment->flip && (h & 1);
  for (int c = 0; c < set.channels; ++c) {
    for (int r = 0; r < set.rows; ++r) {
      const int sr = r + dy;
      for (int col = 0; col < set.cols; ++col) {
        const int sc = (flip ? set.cols - 1 - col : col) + dx;
        const bool inside = sr >= 0 && sr < set.rows && sc >= 0 && sc < set.cols;
        *out++ = put(c, inside ? src[c * plane + int64_t{sr} * set.cols + sc] : 0);
      }
    }
  }
  return out;
}

}  // namespace

Status FillBatch(const data::ImageSet& set, const int64_t* indices, int64_t n, const Normalizer& norm, torch::Tensor* x,
                 torch::Tensor* y, const Augment* augment) {
  const bool bytes = x->defined() && x->scalar_type() == torch::kUInt8;  // normalized where the step runs
  if (!x->defined() || x->size(0) != n) {
    *x = torch::empty({n, set.channels, set.rows, set.cols}, bytes ? torch::kUInt8 : torch::kFloat32);
    *y = torch::empty({n}, torch::kInt64);
  }
  int64_t* labels = y->data_ptr<int64_t>();
  // A streamed set's images, decoded for this batch (or ahead of it), with their labels (a file
  // that does not decode brings another's).
  thread_local std::vector<uint8_t> decoded;
  thread_local std::vector<uint16_t> decoded_labels;
  if (set.stream) {
    decoded.resize(static_cast<size_t>(n * set.image_bytes()));
    decoded_labels.resize(static_cast<size_t>(n));
    RETURN_IF_ERROR(set.stream->Get(indices, n, augment ? augment->epoch : 0, decoded.data(), decoded_labels.data()));
  }
  auto source = [&](int64_t i) { return set.stream ? decoded.data() + i * set.image_bytes() : set.image(indices[i]); };
  // The images lie at random in a set larger than the caches: each would wait for memory line
  // by line (half of a Fashion-MNIST batch's time). A few images ahead are asked for meanwhile.
  constexpr int64_t kAhead = 4;
  if (!set.stream) PrefetchImages(set, indices, std::min(n, kAhead));
  if (bytes) {
    uint8_t* out = x->data_ptr<uint8_t>();
    for (int64_t i = 0; i < n; ++i) {
      out = Place(source(i), set, indices[i], augment, out, [](int, uint8_t v) { return v; });
      labels[i] = set.stream ? decoded_labels[i] : set.labels[indices[i]];
    }
    return Status::Ok();
  }
  // One lookup table per channel: 256 floats replace a divide and a subtract per pixel.
  std::vector<float> lut(256 * set.channels);
  for (int c = 0; c < set.channels; ++c) {
    for (int v = 0; v < 256; ++v) lut[c * 256 + v] = (v / 255.0f - norm.mean[c]) / norm.std[c];
  }
  float* out = x->data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    if (!set.stream && i + kAhead < n) PrefetchImages(set, indices + i + kAhead, 1);
    out = Place(source(i), set, indices[i], augment, out, [&](int c, uint8_t v) { return lut[c * 256 + v]; });
    labels[i] = set.stream ? decoded_labels[i] : set.labels[indices[i]];
  }
  return Status::Ok();
}

namespace {
std::string DtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return "F32";
    case torch::kFloat64:
      return "F64";
    case torch::kInt64:
      return "I64";
    case torch::kInt32:
      return "I32";
    case torch::kUInt8:
      return "U8";
    default:
      return "";
  }
}
}  // namespace

checkpoint::Blob ToBlob(const std::string& name, const torch::Tensor& t) {
  checkpoint::Blob b;
  b.name = name;
  torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  b.dtype = DtypeName(c.scalar_type());
  b.shape = c.sizes().vec();
  b.data.assign(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return b;
}

Status CopyBlob(const checkpoint::Blob& blob, torch::Tensor dst) {
  std::string want = DtypeName(dst.scalar_type());
  if (blob.dtype != want || blob.shape != dst.sizes().vec()) {
    auto shape = [](const std::vector<int64_t>& dims) {
      std::string s;
      for (auto d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
      return "[" + s + "]";
    };
    return InvalidArgument("tensor " + blob.name + ": expected " + want + " " + shape(dst.sizes().vec()) + ", got " +
                           blob.dtype + " " + shape(blob.shape) + "; was it saved by another model?");
  }
  torch::NoGradGuard no_grad;
  torch::Tensor src = torch::from_blob(const_cast<char*>(blob.data.data()), blob.shape, dst.scalar_type());
  dst.copy_(src);
  return Status::Ok();
}

}  // namespace trainctl::train

namespace trainctl::train {

void AddModuleState(torch::nn::Module& module, std::vector<checkpoint::Blob>* out) {
  for (const auto& p : module.named_parameters()) out->push_back(ToBlob(p.key(), p.value()));
  for (const auto& b : module.named_buffers()) out->push_back(ToBlob(b.key(), b.value()));
}

Status LoadModuleState(torch::nn::Module& module, const checkpoint::Checkpoint& ckpt) {
  auto load = [&](const std::string& name, torch::Tensor t) -> Status {
    const checkpoint::Blob* b = ckpt.Find(name);
    if (!b) return InvalidArgument("tensor " + name + " is missing; was it saved by another model?");
    return CopyBlob(*b, t);
  };
  for (const auto& p : module.named_parameters()) RETURN_IF_ERROR(load(p.key(), p.value()));
  for (const auto& b : module.named_buffers()) RETURN_IF_ERROR(load(b.key(), b.value()));
  return Status::Ok();
}

}  // namespace trainctl::train
