// `trainctl pipeline SPEC`: a spec's image-folder input pipeline alone, as DALI's and FFCV's
// loader benchmarks run theirs: the folder listed, then N batches of a worker's size read,
// decoded, cropped and resized, and collated into the normalized floats a step takes, each next
// batch decoded while the one before is collated. Prints images/s and where the time went.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli/verbs.h"
#include "common/cpus.h"
#include "common/exit_codes.h"
#include "common/fs.h"
#include "data/file_list.h"
#include "data/image_stream.h"
#include "data/sampler.h"

namespace trainctl::cli {
namespace {

struct PipelineFlags {
  SpecFlags spec;
  int64_t batches = 50;
  int threads = 0;
  int workers = 1;
  std::string split = "train";
  std::string format = "text";
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

long PeakRssMb() {
  auto status = ReadFile("/proc/self/status", 1 << 16);
  if (!status.ok()) return 0;
  const size_t at = status->find("VmHWM:");
  return at == std::string::npos ? 0 : std::atol(status->c_str() + at + 6) / 1024;
}

// The split's file list (train: the folder, less a holdout; test: test_dir, with the training
// folder's classes, or the holdout); `*dir` is the folder listed.
Result<data::FileList> ListSplit(const DataSpec& d, bool train, std::string* dir, data::ListReport* listing) {
  data::ListOptions lo;
  lo.cache_dir = data::DefaultListCacheDir();
  lo.threads = 8;
  *dir = d.dir;
  if (d.test_dir.empty()) {
    lo.holdout = d.holdout;
    lo.test = !train;
  } else if (!train) {
    ASSIGN_OR_RETURN(lo.classes, data::ListClassFolders(d.dir));
    *dir = d.test_dir;
  }
  return data::ListImageFolder(*dir, lo, listing);
}

// The views and threads of the trainer's stream for this split.
data::StreamOptions StreamOptionsOf(const JobSpec& spec, const PipelineFlags& f, bool train) {
  const DataSpec& d = spec.trainer.data;
  data::StreamOptions so;
  so.view.channels = static_cast<int>(d.shape[0]);
  so.view.rows = static_cast<int>(d.shape[1]);
  so.view.cols = static_cast<int>(d.shape[2]);
  so.view.crop_pct = d.crop_pct > 0 ? d.crop_pct : d.random_resized_crop ? 0.875 : 1.0;
  so.view.random_resized_crop = train && d.random_resized_crop;
  so.view.scale_min = d.scale[0];
  so.view.scale_max = d.scale[1];
  so.view.ratio_min = d.ratio[0];
  so.view.ratio_max = d.ratio[1];
  so.threads = f.threads > 0 ? f.threads : d.threads > 0 ? d.threads : data::DefaultDecodeThreads(f.workers);
  so.seed = static_cast<uint64_t>(spec.trainer.seed);
  so.fail_on_bad = d.bad_images == "fail";  // as the trainer's stream: the first bad picture ends the run
  return so;
}

// What a run measured: the seconds of the timed batches (wall), of the first, of waiting for
// batches and of collating them; the decode threads' own times (stats).
struct Measured {
  std::string dir;
  int64_t files = 0;
  data::ListReport listing;
  int64_t batch = 0;
  double images = 0, wall = 0, first = 0, waited = 0, collate = 0;
  data::StreamStats stats;
  std::vector<std::string> skipped;
};

// Batch 0 warms up (the threads start, the file system's caches fill); batches 1..N are timed,
// each next one prefetched while this one is collated into floats.
Status Measure(data::ImageStream& stream, const std::vector<int64_t>& order, int64_t batches, Measured* m) {
  const int64_t batch = m->batch;
  const int64_t per_epoch = std::max<int64_t>(1, static_cast<int64_t>(order.size()) / batch);
  auto indices = [&](int64_t b) { return order.data() + (b % per_epoch) * batch; };
  std::vector<uint8_t> bytes(static_cast<size_t>(batch * stream.image_bytes()));
  std::vector<uint16_t> labels(static_cast<size_t>(batch));
  std::vector<float> floats(bytes.size());
  std::vector<float> lut(256);
  for (int v = 0; v < 256; ++v) lut[v] = (v / 255.0f - 0.5f) / 0.25f;
  auto start = std::chrono::steady_clock::now();
  data::StreamStats before;
  stream.Prefetch(indices(0), batch, 0);
  for (int64_t b = 0; b <= batches; ++b) {
    const auto ask = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(stream.Get(indices(b), batch, b / per_epoch, bytes.data(), labels.data()));
    if (b > 0) m->waited += Seconds(ask);
    if (b < batches) stream.Prefetch(indices(b + 1), batch, (b + 1) / per_epoch);
    const auto c = std::chrono::steady_clock::now();
    for (size_t i = 0; i < bytes.size(); ++i) floats[i] = lut[bytes[i]];  // what FillBatch does per byte
    if (b > 0) m->collate += Seconds(c);
    if (b == 0) {
      m->first = Seconds(start);
      start = std::chrono::steady_clock::now();
      before = stream.Stats();
    }
  }
  m->wall = Seconds(start);
  m->stats = stream.Stats();
  m->stats.images -= before.images, m->stats.read -= before.read, m->stats.decode -= before.decode,
      m->stats.resize -= before.resize;
  m->images = double(batches) * batch;
  m->skipped = stream.TakeSkipped();
  return Status::Ok();
}

void Print(const PipelineFlags& f, const data::StreamOptions& so, size_t classes, const Measured& m) {
  const data::StreamStats& s = m.stats;
  const double per = 1e3 / std::max(1.0, double(s.images));
  if (f.format == "json") {
    nlohmann::json j = {{"dir", m.dir},
                        {"split", f.split},
                        {"files", m.files},
                        {"classes", classes},
                        {"list_seconds", m.listing.seconds},
                        {"list_from_cache", m.listing.from_cache},
                        {"batches", f.batches},
                        {"batch", m.batch},
                        {"threads", so.threads},
                        {"cpus", UsableCpus()},
                        {"images_per_s", m.images / m.wall},
                        {"seconds", m.wall},
                        {"first_batch_seconds", m.first},
                        {"waited_seconds", m.waited},
                        {"ms_per_image",
                         {{"read", s.read * per},
                          {"decode", s.decode * per},
                          {"resize", s.resize * per},
                          {"collate", m.collate * 1e3 / m.images}}},
                        {"skipped", m.skipped.size()},
                        {"peak_rss_mb", PeakRssMb()}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("%s: %lld %s images in %zu classes; list %s in %.2f s\n", m.dir.c_str(), static_cast<long long>(m.files),
              f.split.c_str(), classes, m.listing.from_cache ? "from the cache" : "made", m.listing.seconds);
  std::printf(
      "%lld batches of %lld (%dx%dx%d%s), %d decode thread(s): %.0f images/s (%.2f s; the loop waited %.2f s "
      "for batches; the first, not counted, took %.2f s)\n",
      static_cast<long long>(f.batches), static_cast<long long>(m.batch), so.view.channels, so.view.rows, so.view.cols,
      so.view.random_resized_crop ? ", random resized crops" : ", centre view", so.threads, m.images / m.wall, m.wall,
      m.waited, m.first);
  std::printf(
      "per image, in a decode thread: read %.3f ms, decode %.3f ms, crop and resize %.3f ms; collate %.3f ms "
      "in the loop\n",
      s.read * per, s.decode * per, s.resize * per, m.collate * 1e3 / m.images);
  if (!m.skipped.empty()) std::printf("%zu file(s) skipped, first: %s\n", m.skipped.size(), m.skipped[0].c_str());
  std::printf("peak memory: %ld MiB\n", PeakRssMb());
}

int RunPipeline(const PipelineFlags& f) {
  auto spec = LoadOrReport(f.spec);
  if (!spec) return kExitInvalidSpec;
  ResolveProgramPaths(&*spec, ProgramBase(*spec, f.spec.Sources().files[0]));
  if (auto shape = ResolveFolderShape(&*spec); !shape.ok()) return Fail("pipeline", shape.status());
  if (!spec->trainer.enabled || spec->trainer.data.dataset != "imagefolder") {
    return Fail("pipeline", InvalidArgument("the spec's trainer.data is not an image folder (dataset: imagefolder); "
                                            "its other datasets are read from memory"));
  }
  const bool train = f.split == "train";
  Measured m;
  auto list = ListSplit(spec->trainer.data, train, &m.dir, &m.listing);
  if (!list.ok()) return Fail("pipeline", list.status());
  const data::StreamOptions so = StreamOptionsOf(*spec, f, train);
  m.files = list->size();
  m.batch = std::max<int64_t>(1, std::min<int64_t>(spec->trainer.batch_size, m.files));
  data::ImageStream stream(std::make_shared<const data::FileList>(std::move(*list)), so);
  // This worker's shard of one epoch's shuffled order, as the trainer reads it.
  data::SamplerOptions sampling{0, f.workers, so.seed, true, true};
  if (Status st = Measure(stream, data::ShardIndices(m.files, 0, sampling), f.batches, &m); !st.ok()) {
    return Fail("pipeline", st);
  }
  Print(f, so, stream.list().classes().size(), m);
  return kExitOk;
}
}  // namespace

void AddPipeline(CLI::App& app, const GlobalFlags& flags, int* code) {
  (void)flags;
  auto f = std::make_shared<PipelineFlags>();
  CLI::App* cmd = app.add_subcommand(
      "pipeline",
      "Run a spec's image-folder input pipeline alone (list, read, decode, crop and resize, collate) "
      "for some batches, and print images/s and the time each stage took");
  f->spec.Add(cmd);
  cmd->add_option("--batches", f->batches, "batches of trainer.batch_size to time (after one more that warms up)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", f->threads, "decode threads (default: data.threads, else the CPUs shared by --workers)");
  cmd->add_option("--workers", f->workers, "workers on this machine the CPUs are shared by (and the shards)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--split", f->split, "train (its views: random resized crops if the spec says) or test")
      ->capture_default_str()
      ->check(CLI::IsMember({"train", "test"}));
  cmd->add_option("-o,--output", f->format, "text or json")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  cmd->callback([f, code] { *code = RunPipeline(*f); });
}

}  // namespace trainctl::cli
