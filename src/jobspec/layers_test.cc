// trainer.model: {layers: [...]}: parsing, names, shape checks, the layer table, JSON round trip.
#include <gtest/gtest.h>

#include "jobspec/job_spec.h"

namespace trainctl {
namespace {

// The 3-convolution batch-norm CNN of PyTorch's fast Fashion-MNIST recipe (issue 48).
const char* kRecipe = R"(name: declared
trainer:
  data: {dataset: fashion-mnist}
  model:
    layers:
      - conv: {channels: 16, padding: 1}
      - maxpool: 2
      - batchnorm
      - relu
      - conv: {channels: 48, stride: 2, padding: 1}
      - batchnorm
      - relu
      - conv: {channels: 96, stride: 2, padding: 1}
      - batchnorm
      - relu
      - flatten
      - linear
)";

std::string Errors(const std::string& yaml) {
  auto spec = ParseJobSpec(yaml, "job.yaml");
  EXPECT_FALSE(spec.ok()) << "accepted:\n" << yaml;
  return spec.ok() ? "" : spec.status().message();
}

// kRecipe with its layers replaced.
std::string WithLayers(const std::string& layers, const std::string& data = "{dataset: fashion-mnist}") {
  return "name: declared\ntrainer:\n  data: " + data + "\n  model:\n    layers:\n" + layers;
}

TEST(DeclaredModel, TheRecipesCnnParsesWithItsNamesAndShapes) {
  auto spec = ParseJobSpec(kRecipe, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const TrainerSpec& t = spec->trainer;
  EXPECT_EQ(t.model, "layers");
  ASSERT_EQ(t.layers.size(), 12u);
  EXPECT_EQ(t.layers[0].kind, LayerSpec::Kind::kConv);
  EXPECT_EQ(t.layers[0].out, 16);
  EXPECT_EQ(t.layers[0].padding, 1);
  EXPECT_EQ(t.layers[0].name, "conv1");
  EXPECT_EQ(t.layers[2].name, "bn1");
  EXPECT_EQ(t.layers[7].name, "conv3");
  EXPECT_EQ(t.layers[11].name, "fc1");
  EXPECT_EQ(t.layers[11].out, 0);  // the classes
  auto summary = SummarizeModel(t.layers, ImageShape(t.data), ClassCount(t.data));
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  // 28 -> conv 28 -> pool 14 -> /2 7 -> /2 4: 96 x 4 x 4 = 1536 features.
  EXPECT_EQ(summary->rows[1].shape, (std::vector<int64_t>{16, 14, 14}));
  EXPECT_EQ(summary->rows[4].shape, (std::vector<int64_t>{48, 7, 7}));
  EXPECT_EQ(summary->rows[10].shape, (std::vector<int64_t>{1536}));
  EXPECT_EQ(summary->rows[11].shape, (std::vector<int64_t>{10}));
  // torch.nn's counts: conv 16*1*9+16, bn 2*16, conv 48*16*9+48, bn 96, conv 96*48*9+96, bn 192,
  // linear 1536*10+10.
  const int64_t want = 160 + 32 + 6960 + 96 + 41568 + 192 + 15370;
  EXPECT_EQ(summary->params, want);
  const std::string table = FormatSummary(*summary);
  EXPECT_NE(table.find("conv 3x3 /2 pad 1, 48"), std::string::npos) << table;
  EXPECT_NE(table.find("96x4x4"), std::string::npos) << table;
  EXPECT_NE(table.find("total parameters: 64,378"), std::string::npos) << table;
}

TEST(DeclaredModel, ShapeMismatchesNameTheLayerItsIndexAndTheShapes) {
  // A linear layer on an image.
  std::string e = Errors(WithLayers("      - conv: 16\n      - linear\n"));
  EXPECT_NE(e.find("job.yaml:7: trainer.model.layers[1] (linear): expected features, not an image; put flatten"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("its input is 16x26x26"), std::string::npos) << e;
  // A window larger than the image after two poolings.
  e = Errors(WithLayers("      - maxpool: 8\n      - maxpool: 8\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("trainer.model.layers[1] (maxpool): a 8x8 window does not fit in 3x3 pixels"), std::string::npos)
      << e;
  // Groups that do not divide the channels.
  e = Errors(WithLayers("      - conv: {channels: 10, groups: 4}\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("groups 4 must divide"), std::string::npos) << e;
  // An output that is not the classes.
  e = Errors(WithLayers("      - flatten\n      - linear: 7\n"));
  EXPECT_NE(e.find("the model outputs 7, expected the 10 classes' scores"), std::string::npos) << e;
  // Only the last linear layer may leave its size out.
  e = Errors(WithLayers("      - flatten\n      - linear\n      - linear: 10\n"));
  EXPECT_NE(e.find("layers[1] (linear): expected features, the number of outputs"), std::string::npos) << e;
  // The synthetic dataset's shape and classes are what the model is checked against.
  e = Errors(WithLayers("      - conv: 8\n      - flatten\n      - linear\n",
                        "{dataset: synthetic, shape: [3, 2, 2], classes: 4}"));
  EXPECT_NE(e.find("a 3x3 window does not fit in 2x2 pixels; its input is 3x2x2"), std::string::npos) << e;
}

TEST(DeclaredModel, SyntaxErrorsAreLocatedWithADidYouMean) {
  std::string e = Errors(WithLayers("      - conv: 16\n      - rleu\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("job.yaml:7: trainer.model.layers[1]: unknown layer \"rleu\"; did you mean 'relu'?"),
            std::string::npos)
      << e;
  e = Errors(WithLayers("      - conv: {channel: 16}\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("trainer.model.layers[0].conv.channel: unknown field; did you mean 'channels'?"), std::string::npos)
      << e;
  e = Errors(WithLayers("      - conv\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("conv needs its output channels"), std::string::npos) << e;
  e = Errors(WithLayers("      - relu: 3\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("relu takes no size"), std::string::npos) << e;
  e = Errors(WithLayers("      - {conv: 16, relu: null}\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("a mapping of 2 keys"), std::string::npos) << e;
  e = Errors(WithLayers("      - conv: {channels: 16, name: a..b}\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("expected letters, digits, _ and dots between them"), std::string::npos) << e;
  e = Errors(WithLayers("      - conv: {channels: 16, name: fc1}\n      - flatten\n      - linear\n"));
  EXPECT_NE(e.find("two layers are named \"fc1\""), std::string::npos) << e;
  e = Errors("name: x\ntrainer:\n  model: {layers: []}\n");
  EXPECT_NE(e.find("expected a list of layers such as"), std::string::npos) << e;
  e = Errors("name: x\ntrainer:\n  model: resnet19\n");
  EXPECT_NE(e.find("did you mean 'resnet18'?"), std::string::npos) << e;
}

TEST(DeclaredModel, ResidualBlocksProjectWhereTheBodyChangesTheShape) {
  auto spec = ParseJobSpec(WithLayers(R"(      - conv: {channels: 16, padding: 1, bias: false}
      - residual:
          - conv: {channels: 16, padding: 1, bias: false}
          - batchnorm
          - relu
          - conv: {channels: 16, padding: 1, bias: false}
          - batchnorm
      - relu
      - residual:
          name: layer2.0
          layers:
            - conv: {channels: 32, stride: 2, padding: 1, bias: false}
            - batchnorm
      - global_avgpool
      - flatten
      - linear: {name: fc}
)"),
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const auto& layers = spec->trainer.layers;
  EXPECT_EQ(layers[1].name, "block1");
  EXPECT_EQ(layers[1].body[0].name, "block1.conv1");
  EXPECT_EQ(layers[1].body[1].name, "block1.bn1");
  EXPECT_EQ(layers[1].body[3].name, "block1.conv2");
  EXPECT_EQ(layers[3].name, "layer2.0");
  EXPECT_EQ(layers[3].body[0].name, "layer2.0.conv1");
  auto summary = SummarizeModel(layers, {1, 28, 28}, 10);
  ASSERT_TRUE(summary.ok()) << summary.status().message();
  bool projected = false;
  for (const auto& r : summary->rows) {
    if (r.name == "layer2.0.downsample") {
      projected = true;
      EXPECT_EQ(r.shape, (std::vector<int64_t>{32, 14, 14}));
      EXPECT_EQ(r.params, 16 * 32 + 2 * 32);
    }
    EXPECT_NE(r.name, "block1.downsample");  // the first block keeps its shape
  }
  EXPECT_TRUE(projected);
  // Without a projection the shapes must match.
  std::string e = Errors(WithLayers(R"(      - residual:
          layers: [{conv: 8}]
          projection: none
      - flatten
      - linear
)"));
  EXPECT_NE(e.find("its body outputs 8x26x26, which cannot be added to its input"), std::string::npos) << e;
}

TEST(DeclaredModel, TheResolvedSpecAndCheckpointsCarryTheLayersWhole) {
  auto spec = ParseJobSpec(kRecipe, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto again = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(LayersToJson(again->trainer.layers), LayersToJson(spec->trainer.layers));
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*spec));
  auto layers = LayersFromJson(LayersToJson(spec->trainer.layers), "model.safetensors");
  ASSERT_TRUE(layers.ok()) << layers.status().message();
  EXPECT_EQ(LayersToJson(*layers), LayersToJson(spec->trainer.layers));
  // A checkpoint's mangled layers are an error naming the file, not a crash.
  for (const char* bad :
       {"", "{", "[{\"conv\": {\"channels\": -1}}]", "[{\"warp\": 1}]",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]", "[{\"residual\": {\"layers\": []}}]"}) {
    auto r = LayersFromJson(bad, "model.safetensors");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message().rfind("model.safetensors: ", 0), 0u) << r.status().message();
  }
}

TEST(DeclaredModel, ATorchScriptModuleIsNamedByItsPathAndGoesWithoutLayers) {
  auto spec = ParseJobSpec("name: ts\ntrainer:\n  model: {torchscript: nets/mynet.pt}\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->trainer.model, "torchscript");
  EXPECT_EQ(spec->trainer.torchscript, "nets/mynet.pt");
  auto again = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->trainer.torchscript, "nets/mynet.pt");
  std::string e = Errors("name: ts\ntrainer:\n  model: {torchscript: a.pt, layers: [relu]}\n");
  EXPECT_NE(e.find("trainer.model.torchscript: goes without layers"), std::string::npos) << e;
  e = Errors("name: ts\ntrainer:\n  model: {torchscript: \"\"}\n");
  EXPECT_NE(e.find("trainer.model.torchscript: expected the path of a module"), std::string::npos) << e;
}

TEST(ImageData, AFolderOfImagesAndAugmentationAreCheckedAndRoundTrip) {
  auto spec = ParseJobSpec(R"(name: photos
trainer:
  data:
    dataset: imagefolder
    dir: photos/train
    shape: [3, 32, 32]
    holdout: 0.2
    augment: {crop_padding: 4, flip: true}
)",
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const DataSpec& d = spec->trainer.data;
  EXPECT_EQ(d.dataset, "imagefolder");
  EXPECT_DOUBLE_EQ(d.holdout, 0.2);
  EXPECT_EQ(d.crop_padding, 4);
  EXPECT_TRUE(d.flip);
  EXPECT_EQ(ImageShape(d), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(ClassCount(d), 0);  // the class folders, known when they are read
  auto again = JobSpecFromJson(JobSpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(JobSpecToJson(*again), JobSpecToJson(*spec));
  EXPECT_NE(JobSpecToJson(*spec).find("\"holdout\":0.2"), std::string::npos) << JobSpecToJson(*spec);
  // A declared model's last layer is left open until the classes are known.
  auto open = ParseJobSpec(
      "name: p\ntrainer:\n  data: {dataset: imagefolder, dir: d, shape: [1, 8, 8]}\n"
      "  model: {layers: [flatten, linear]}\n",
      "job.yaml");
  ASSERT_TRUE(open.ok()) << open.status().message();
  // Without a shape: the first picture's, which run and validate fill in (cli ResolveFolderShape).
  auto unshaped = ParseJobSpec("name: p\ntrainer:\n  data: {dataset: imagefolder, dir: d}\n", "job.yaml");
  ASSERT_TRUE(unshaped.ok()) << unshaped.status().message();
  EXPECT_TRUE(ImageShape(unshaped->trainer.data).empty());
  auto unshaped_again = JobSpecFromJson(JobSpecToJson(*unshaped));
  ASSERT_TRUE(unshaped_again.ok()) << unshaped_again.status().message();
  EXPECT_TRUE(unshaped_again->trainer.data.shape.empty());
  std::string e = Errors("name: p\ntrainer:\n  data: {dataset: imagefolder, shape: [1, 8, 8]}\n");
  EXPECT_NE(e.find("trainer.data.dir: required for imagefolder"), std::string::npos) << e;
  e = Errors("name: p\ntrainer:\n  data: {test_dir: t}\n");
  EXPECT_NE(e.find("trainer.data.test_dir: goes with dataset: imagefolder"), std::string::npos) << e;
  e = Errors(
      "name: p\ntrainer:\n  data: {dataset: imagefolder, dir: d, test_dir: t, holdout: 0.1, shape: [1, 8, 8]}\n");
  EXPECT_NE(e.find("trainer.data.holdout: goes without test_dir"), std::string::npos) << e;
  e = Errors("name: p\ntrainer:\n  data: {augment: {crop_padding: 4, flop: true}}\n");
  EXPECT_NE(e.find("trainer.data.augment.flop: unknown field; did you mean 'flip'?"), std::string::npos) << e;
}

TEST(DeclaredModel, TheSchemaDescribesTheLayerList) {
  const std::string schema = JobSpecSchema(2);
  EXPECT_NE(schema.find("\"layer\""), std::string::npos);
  EXPECT_NE(schema.find("\"global_avgpool\""), std::string::npos);
  EXPECT_NE(schema.find("\"projection\""), std::string::npos);
}

}  // namespace
}  // namespace trainctl
