// `trainctl predict`: a model trained here tried on images made from the Fashion-MNIST test set,
// as PGM, PNG and PPM files and as the idx file itself; its answers agree with `trainctl eval`.
#include <gtest/gtest.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "common/strings.h"
#include "data/dataset.h"
#include "tests/test_util.h"

namespace trainctl::testing {
namespace {

using std::chrono::seconds;

std::string Chunk(const std::string& type, const std::string& data) {
  auto be32 = [](uint32_t v) { return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; };
  std::string body = type + data;
  const uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size());
  return be32(data.size()) + body + be32(crc);
}

// A minimal 8-bit PNG (grey, or RGB with `rgb`), written here with zlib so the test does not
// trust the reader it checks.
std::string Png(const uint8_t* pixels, int rows, int cols, bool rgb) {
  std::string raw;
  for (int r = 0; r < rows; ++r) {
    raw.push_back(0);  // filter: none
    for (int c = 0; c < cols; ++c) {
      for (int k = 0; k < (rgb ? 3 : 1); ++k) raw.push_back(static_cast<char>(pixels[r * cols + c]));
    }
  }
  uLongf size = compressBound(raw.size());
  std::string z(size, '\0');
  compress(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(raw.data()), raw.size());
  z.resize(size);
  std::string ihdr = {0, 0, 0, char(cols), 0, 0, 0, char(rows), 8, char(rgb ? 2 : 0), 0, 0, 0};
  return std::string("\x89PNG\r\n\x1a\n", 8) + Chunk("IHDR", ihdr) + Chunk("IDAT", z) + Chunk("IEND", "");
}

std::string Pgm(const uint8_t* pixels, int rows, int cols) {
  return "P5\n# from the test set\n" + std::to_string(cols) + " " + std::to_string(rows) + "\n255\n" +
         std::string(reinterpret_cast<const char*>(pixels), rows * cols);
}

TEST(Predict, AnswersForImageFilesAgreeWithEvalOnTheTestSet) {
  Scratch s;
  s.Write("job.yaml", "name: predict\nprocs_per_node: 1\noutput_dir: " + s.path("out") +
                          "\ntrainer:\n  model: cnn\n  data: {limit: 2048, test_limit: 100}\n  batch_size: 64\n"
                          "  max_steps: 30\n  threads: 2\n  eval: false\n  optimizer: {name: sgd, lr: 0.05}\n");
  auto trained = Trainctl({"run", "job.yaml"}, s.path(""), seconds(120), {{"TRAINCTL_STATE_DIR", s.path("state")}});
  ASSERT_EQ(trained.exit.code, 0) << trained.output;
  const std::string model = s.path("out/model.safetensors");

  auto test = data::LoadMnistDir(data::kFashionMnistDir, /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  constexpr int kImages = 100;
  std::vector<std::string> pgms, pngs;
  for (int i = 0; i < kImages; ++i) {
    pgms.push_back(s.Write("img" + std::to_string(i) + ".pgm", Pgm(test->image(i), 28, 28)));
    pngs.push_back(s.Write("img" + std::to_string(i) + ".png", Png(test->image(i), 28, 28, false)));
  }
  auto predict = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"predict", "--checkpoint", model, "-o", "json", "--threads", "2"});
    auto r = Trainctl(args, s.path(""), seconds(120));
    EXPECT_EQ(r.exit.code, 0) << r.output;
    return nlohmann::json::parse(r.output.substr(std::min(r.output.size(), r.output.find('['))), nullptr, false);
  };
  auto from_pgm = predict(pgms);
  auto from_png = predict(pngs);
  ASSERT_EQ(from_pgm.size(), static_cast<size_t>(kImages));
  ASSERT_EQ(from_png.size(), static_cast<size_t>(kImages));
  int correct = 0;
  for (int i = 0; i < kImages; ++i) {
    EXPECT_EQ(from_pgm[i]["image"], pgms[i]);
    ASSERT_EQ(from_pgm[i]["top"].size(), 3u);
    EXPECT_EQ(from_pgm[i]["top"], from_png[i]["top"]) << "the same pixels as PGM and as PNG";
    double previous = 1;
    for (const auto& t : from_pgm[i]["top"]) {
      EXPECT_LE(t["probability"].get<double>(), previous);
      previous = t["probability"].get<double>();
    }
    correct += from_pgm[i]["top"][0]["class"].get<int>() == test->labels[i] ? 1 : 0;
  }
  // The same answers as eval gives on the same 100 test images.
  auto eval = Trainctl({"eval", "--checkpoint", model, "--limit", std::to_string(kImages), "-o", "json"}, s.path(""));
  ASSERT_EQ(eval.exit.code, 0) << eval.output;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(eval.output.substr(eval.output.find('{')))["accuracy"].get<double>(),
                   correct / double(kImages));
  EXPECT_GT(correct, 40) << "better than chance (10 of 100)";

  // Every class's probability, summing to 1; a colour image of the same pixels (the model is
  // grey) and the idx file itself give the same answer.
  s.Write("rgb.png", Png(test->image(0), 28, 28, true));
  auto all = predict({"-k", "10", pgms[0], s.path("rgb.png")});
  double sum = 0;
  for (const auto& t : all[0]["top"]) sum += t["probability"].get<double>();
  EXPECT_NEAR(sum, 1.0, 1e-4);
  EXPECT_EQ(all[1]["top"][0], all[0]["top"][0]);
  auto idx = predict({std::string(data::kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"});
  ASSERT_EQ(idx.size(), 10000u);
  for (int k = 0; k < 3; ++k) {  // computed in another batch: the same to float rounding
    EXPECT_EQ(idx[7]["top"][k]["class"], from_pgm[7]["top"][k]["class"]);
    EXPECT_NEAR(idx[7]["top"][k]["probability"].get<double>(), from_pgm[7]["top"][k]["probability"].get<double>(),
                1e-5);
  }
  auto text = Trainctl({"predict", "--checkpoint", model, pgms[0]}, s.path(""));
  // On stderr first the run and file it uses, then each picture's answer on a line of its own.
  EXPECT_EQ(text.output.rfind("trainctl predict: run predict-", 0), 0u) << text.output;
  EXPECT_NE(text.output.find(" of job predict: " + model + "\n" + pgms[0] + ": "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find(" %, "), std::string::npos) << text.output;

  // Bad images: each named, nothing predicted.
  std::vector<uint8_t> big(32 * 32, 128);
  s.Write("big.pgm", Pgm(big.data(), 32, 32));
  s.Write("notes.txt", "not an image\n");
  std::string torn = Png(test->image(0), 28, 28, false);
  s.Write("torn.png", torn.substr(0, torn.size() / 2));
  for (const auto& [file, message] : std::vector<std::pair<std::string, std::string>>{
           {"big.pgm", "big.pgm: the image is 32x32 pixels; the model takes 28x28"},
           {"notes.txt", "notes.txt: not a PNG, JPEG, PGM or PPM image"},
           {"torn.png", "torn.png: "}}) {
    auto r = Trainctl({"predict", "--checkpoint", model, s.path(file)}, s.path(""));
    EXPECT_EQ(r.exit.code, kExitError) << r.output;
    EXPECT_NE(r.output.find("trainctl predict: " + s.path(message)), std::string::npos) << r.output;
  }

  // An 8192x8192 RGB PNG of zeros (about 200 KB; 200 MB decoded) is refused by its header, its
  // pixels never decoded: predict's peak memory is that of a 28x28 image's (finding 5, issue 49).
  {
    std::string raw(size_t{8192} * (1 + 8192 * 3), '\0');
    uLongf size = compressBound(raw.size());
    std::string z(size, '\0');
    compress2(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(raw.data()), raw.size(), 9);
    z.resize(size);
    const std::string ihdr = {0, 0, 0x20, 0, 0, 0, 0x20, 0, 8, 2, 0, 0, 0};
    s.Write("huge.png",
            std::string("\x89PNG\r\n\x1a\n", 8) + Chunk("IHDR", ihdr) + Chunk("IDAT", z) + Chunk("IEND", ""));
  }
  auto peak_kib = [&](const std::string& image) {
    auto r = RunProgram({TRAINCTL_TEST_PYTHON, "-c",
                         "import resource, subprocess, sys\nsubprocess.run(sys.argv[1:], capture_output=True)\n"
                         "print('peak', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
                         TRAINCTL_BIN, "predict", "--checkpoint", model, image},
                        s.path(""));
    return std::atol(r.output.c_str() + r.output.find("peak ") + 5);
  };
  auto huge = Trainctl({"predict", "--checkpoint", model, s.path("huge.png")}, s.path(""));
  EXPECT_NE(huge.output.find("huge.png: the image is 8192x8192 pixels; the model takes 28x28"), std::string::npos)
      << huge.output;
  EXPECT_LT(peak_kib(s.path("huge.png")) - peak_kib(pgms[0]), 50 << 10) << "KiB more for the huge image";
}

// Fashion-MNIST as a user's own folder of images (torchvision's ImageFolder layout, named
// classes, PNG files, some JPEGs in colour, a broken file and a note among them) trains a declared
// model to the accuracy the idx files give it, and predict names the folders' classes.
TEST(ImageFolder, FashionMnistAsAFolderOfPngsTrainsAsTheIdxFilesDo) {
  Scratch s;
  namespace fs = std::filesystem;
  auto train = data::LoadMnistDir(data::kFashionMnistDir, /*train=*/true);
  auto test = data::LoadMnistDir(data::kFashionMnistDir, /*train=*/false);
  ASSERT_TRUE(train.ok() && test.ok());
  const auto& names = data::FashionMnistClasses();
  auto folder = [](const std::string& name) {  // "T-shirt/top" -> "T-shirt_top"
    std::string f = name;
    std::replace(f.begin(), f.end(), '/', '_');
    return f;
  };
  constexpr int kTrain = 3000, kTest = 500;
  for (const auto& split : {"train", "test"}) {
    for (const auto& n : names) fs::create_directories(s.path(std::string(split) + "/" + folder(n)));
  }
  tjhandle jpeg = tjInitCompress();
  for (int i = 0; i < kTrain; ++i) {
    const std::string dir = "train/" + folder(names[train->labels[i]]) + "/";
    if (i % 50 == 7) {  // some in colour, as JPEG at full quality: the trainer takes them grey
      std::vector<uint8_t> rgb(28 * 28 * 3);
      for (int p = 0; p < 28 * 28; ++p) rgb[3 * p] = rgb[3 * p + 1] = rgb[3 * p + 2] = train->image(i)[p];
      unsigned char* out = nullptr;
      unsigned long size = 0;
      ASSERT_EQ(tjCompress2(jpeg, rgb.data(), 28, 0, 28, TJPF_RGB, &out, &size, TJSAMP_444, 100, 0), 0);
      s.Write(dir + std::to_string(i) + ".jpg", std::string(reinterpret_cast<char*>(out), size));
      tjFree(out);
    } else {
      s.Write(dir + std::to_string(i) + ".png", Png(train->image(i), 28, 28, false));
    }
  }
  tjDestroy(jpeg);
  s.Write("train/Bag/truncated.png", Png(train->image(0), 28, 28, false).substr(0, 40));
  s.Write("train/Bag/notes.txt", "where these came from");
  for (int i = 0; i < kTest; ++i) {
    s.Write("test/" + folder(names[test->labels[i]]) + "/" + std::to_string(i) + ".png",
            Png(test->image(i), 28, 28, false));
  }
  const std::string trainer = R"(  model:
    layers:
      - conv: {channels: 16, padding: 1}
      - maxpool: 2
      - batchnorm
      - relu
      - conv: {channels: 32, stride: 2, padding: 1}
      - batchnorm
      - relu
      - flatten
      - linear
  batch_size: 50
  epochs: 2
  threads: 1
  deterministic: true
  optimizer: {name: sgd, lr: 0.1, momentum: 0.9}
)";
  auto job = [&](const std::string& name, const std::string& data) {
    return s.Write(name + ".yaml", "name: " + name + "\nprocs_per_node: 1\noutput_dir: " + s.path(name) +
                                       "\ntrainer:\n" + trainer + "  data: " + data + "\n");
  };
  const std::string folder_spec = job("folder", "{dataset: imagefolder, dir: " + s.path("train") +
                                                    ", test_dir: " + s.path("test") + ", shape: [1, 28, 28]}");
  auto valid = Trainctl({"validate", folder_spec}, s.path(""));
  ASSERT_EQ(valid.exit.code, 0) << valid.output;
  EXPECT_NE(valid.output.find("model: 1x28x28 images in, 10 classes out"), std::string::npos) << valid.output;
  auto env = std::vector<std::pair<std::string, std::string>>{{"TRAINCTL_STATE_DIR", s.path("state")}};
  auto from_folder = Trainctl({"run", folder_spec}, s.path(""), seconds(180), env);
  ASSERT_EQ(from_folder.exit.code, 0) << from_folder.output;
  EXPECT_EQ(CountLines(from_folder.output, "1 picture file(s) skipped, not pictures that decode"), 1)
      << "once, by rank 0\n"
      << from_folder.output;
  EXPECT_NE(from_folder.output.find("truncated.png"), std::string::npos) << from_folder.output;
  EXPECT_EQ(CountLines(s.Read("folder/skipped-images.txt"), "truncated.png"), 1);
  auto from_idx = Trainctl(
      {"run", job("idx", "{limit: " + std::to_string(kTrain) + ", test_limit: " + std::to_string(kTest) + "}")},
      s.path(""), seconds(180), env);
  ASSERT_EQ(from_idx.exit.code, 0) << from_idx.output;
  auto accuracy = [&](const std::string& out) {
    double acc = -1;
    for (const auto& line : SplitLines(s.Read(out + "/metrics.jsonl"))) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("test_accuracy")) acc = j["test_accuracy"].get<double>();
    }
    return acc;
  };
  const double a = accuracy("folder"), b = accuracy("idx");
  EXPECT_GT(a, 0.7);
  EXPECT_NEAR(a, b, 0.05) << "the same images, in another order";
  // Streamed (each batch decoded as it is used; the broken file replaced by the next), the same
  // accuracy as decoded into memory, within the noise of a 2-epoch run.
  const std::string streamed_spec =
      job("streamed", "{dataset: imagefolder, dir: " + s.path("train") + ", test_dir: " + s.path("test") +
                          ", shape: [1, 28, 28], load: stream}");
  auto streamed = Trainctl({"run", streamed_spec}, s.path(""), seconds(180), env);
  ASSERT_EQ(streamed.exit.code, 0) << streamed.output;
  EXPECT_NE(streamed.output.find("streamed, each batch decoded as it is used"), std::string::npos) << streamed.output;
  EXPECT_NE(streamed.output.find("epoch 1: 1 picture file(s) skipped (1 not skipped before), each replaced by the next "
                                 "that decodes"),
            std::string::npos)
      << streamed.output;
  EXPECT_EQ(CountLines(s.Read("streamed/skipped-images.txt"), "truncated.png"), 1);
  EXPECT_NEAR(accuracy("streamed"), a, 0.03);

  // eval and predict name the folders' classes, from the model file alone.
  auto eval = Trainctl({"eval", "--checkpoint", s.path("folder/model.safetensors")}, s.path(""));
  ASSERT_EQ(eval.exit.code, 0) << eval.output;
  EXPECT_NE(eval.output.find("T-shirt_top"), std::string::npos) << eval.output;
  auto predict = Trainctl({"predict", "--checkpoint", s.path("folder/model.safetensors"), "-o", "json",
                           s.path("train/" + folder(names[train->labels[7]]) + "/7.jpg")},
                          s.path(""));
  ASSERT_EQ(predict.exit.code, 0) << predict.output;
  EXPECT_NE(predict.output.find("\"name\": \"" + folder(names[train->labels[7]]) + "\""), std::string::npos)
      << predict.output;

  // eval --data: another folder of the same classes, on a machine without the training folder.
  fs::rename(s.path("train"), s.path("train-away"));
  auto elsewhere = Trainctl(
      {"eval", "--checkpoint", s.path("folder/model.safetensors"), "--data", s.path("test"), "-o", "json"}, s.path(""));
  fs::rename(s.path("train-away"), s.path("train"));
  ASSERT_EQ(elsewhere.exit.code, 0) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find(std::to_string(kTest)), std::string::npos) << elsewhere.output;

  // An image of another size is resized and cropped as the folder's were (other models refuse it).
  std::vector<uint8_t> doubled(56 * 56);
  for (int r = 0; r < 56; ++r) {
    for (int c = 0; c < 56; ++c) doubled[r * 56 + c] = test->image(0)[(r / 2) * 28 + c / 2];
  }
  auto larger = Trainctl({"predict", "--checkpoint", s.path("folder/model.safetensors"),
                          s.Write("large.png", Png(doubled.data(), 56, 56, false))},
                         s.path(""));
  EXPECT_EQ(larger.exit.code, 0) << larger.output;
  EXPECT_NE(larger.output.find("large.png: "), std::string::npos) << larger.output;

  // bad_images: fail refuses the folder before training, naming the file; no restart is spent.
  const std::string strict =
      job("strict", "{dataset: imagefolder, dir: " + s.path("train") + ", shape: [1, 28, 28], bad_images: fail}");
  auto refused = Trainctl({"run", strict}, s.path(""), seconds(60), env);
  EXPECT_EQ(refused.exit.code, kExitInvalidSpec) << refused.output;
  EXPECT_NE(refused.output.find("truncated.png"), std::string::npos) << refused.output;
  // A folder that is not there is a pre-flight error.
  auto missing = Trainctl(
      {"validate", job("missing", "{dataset: imagefolder, dir: " + s.path("nowhere") + ", shape: [1, 28, 28]}")},
      s.path(""));
  EXPECT_EQ(missing.exit.code, kExitInvalidSpec) << missing.output;
  EXPECT_NE(missing.output.find(s.path("nowhere")), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace trainctl::testing
