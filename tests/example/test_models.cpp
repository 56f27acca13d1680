#include "test_helpers.hpp"  // first: see Note [glog's CHECK]

#include <string>

#include "models.hpp"

namespace {

using namespace resnet;
using resnet::test::shape_of;

std::int64_t parameter_count(torch::nn::Module& model) {
  std::int64_t total = 0;
  for (const auto& p : model.parameters()) total += p.numel();
  return total;
}

}  // namespace

TEST_CASE("every model maps a batch to [N, num_classes] logits") {
  torch::manual_seed(0);
  for (const auto& name : model_names()) {
    for (const std::int64_t channels : {1, 3}) {
      CAPTURE(name);
      CAPTURE(channels);
      const auto model = make_model(name, {.in_channels = channels, .num_classes = 10});
      model->eval();
      torch::NoGradGuard no_grad;
      const auto size = channels == 1 ? 28 : 32;  // Fashion-MNIST and CIFAR-10 inputs
      const auto logits = model->forward(torch::randn({2, channels, size, size}));
      CHECK(shape_of(logits) == "2x10");
      CHECK(torch::isfinite(logits).all().item<bool>());
    }
  }
}

TEST_CASE("the large stem takes ImageNet-sized inputs; num_classes sets the output width") {
  const auto model =
      make_model("resnet18", {.in_channels = 3, .num_classes = 7, .small_input_stem = false});
  model->eval();
  torch::NoGradGuard no_grad;
  CHECK(shape_of(model->forward(torch::randn({1, 3, 224, 224}))) == "1x7");
}

TEST_CASE("the stem: standard on ImageNet-sized inputs, small on 32 px and less, or as asked") {
  using resnet::choose_stem;
  CHECK_FALSE(ModelOptions{}.small_input_stem);  // the model the name promises
  for (const char* name : {"resnet18", "resnet34", "resnet50"}) {
    CAPTURE(name);
    CHECK(choose_stem(name, "auto", 28).small_input_stem);
    CHECK(choose_stem(name, "auto", 32).small_input_stem);
    CHECK_FALSE(choose_stem(name, "auto", 64).small_input_stem);
    CHECK_FALSE(choose_stem(name, "auto", 224).small_input_stem);
    CHECK(choose_stem(name, "small", 224).small_input_stem);
    CHECK_FALSE(choose_stem(name, "standard", 28).small_input_stem);
  }
  CHECK(choose_stem("resnet18", "auto", 64).description ==
        "standard stem (7x7 stride 2 + max-pool), for 64 px images (--stem to choose)");
  CHECK(choose_stem("resnet50", "auto", 32).description ==
        "small-input stem (3x3 stride 1, no max-pool), for 32 px images (<= 32 px; --stem to "
        "choose)");
  CHECK(choose_stem("resnet18", "small", 64).description ==
        "small-input stem (3x3 stride 1, no max-pool), chosen by --stem");
  // The CIFAR networks have their own 3x3 stem whatever is asked.
  CHECK(choose_stem("resnet20", "standard", 224).description.empty());
  CHECK_THROWS_AS(choose_stem("resnet18", "big", 32), std::invalid_argument);

  // What each stem is: the first convolution, and whether a max-pool follows.
  const auto stem_of = [](const resnet::Classifier& model) {
    std::string first_conv;
    bool max_pool = false;
    for (const auto& module : model.modules(/*include_self=*/false)) {
      if (const auto* conv = module->as<torch::nn::Conv2d>(); conv && first_conv.empty()) {
        first_conv = std::to_string((*conv->options.kernel_size())[0]) + "x" +
                     std::to_string((*conv->options.kernel_size())[1]) + "/" +
                     std::to_string((*conv->options.stride())[0]);
      }
      max_pool = max_pool || module->as<torch::nn::MaxPool2d>() != nullptr;
    }
    return first_conv + (max_pool ? " + max-pool" : "");
  };
  CHECK(stem_of(*make_model("resnet18", {})) == "7x7/2 + max-pool");
  CHECK(stem_of(*make_model("resnet50", {.small_input_stem = true})) == "3x3/1");
}

TEST_CASE("parameter counts match the published architectures") {
  // He et al. 2016, Table 6 (0.27M ... 1.7M), as counted by the widely used reference
  // implementation with option A shortcuts.
  const ModelOptions cifar{.in_channels = 3, .num_classes = 10};
  CHECK(parameter_count(*make_model("resnet20", cifar)) == 269'722);
  CHECK(parameter_count(*make_model("resnet32", cifar)) == 464'154);
  CHECK(parameter_count(*make_model("resnet44", cifar)) == 658'586);
  CHECK(parameter_count(*make_model("resnet56", cifar)) == 853'018);
  CHECK(parameter_count(*make_model("resnet110", cifar)) == 1'727'962);
  // torchvision's ImageNet models: 7x7 stem, 1000 classes.
  const ModelOptions imagenet{.in_channels = 3, .num_classes = 1000, .small_input_stem = false};
  CHECK(parameter_count(*make_model("resnet18", imagenet)) == 11'689'512);
  CHECK(parameter_count(*make_model("resnet34", imagenet)) == 21'797'672);
  CHECK(parameter_count(*make_model("resnet50", imagenet)) == 25'557'032);
  // The 3x3 stem replaces 3*64*7*7 stem weights by 3*64*3*3.
  const ModelOptions small{.in_channels = 3, .num_classes = 1000, .small_input_stem = true};
  CHECK(parameter_count(*make_model("resnet18", small)) == 11'689'512 - 3 * 64 * (49 - 9));
}

TEST_CASE("projection shortcuts add parameters to the CIFAR networks; zero padding adds none") {
  const ModelOptions a{.in_channels = 3, .num_classes = 10, .shortcut = Shortcut::zero_pad};
  const ModelOptions b{.in_channels = 3, .num_classes = 10, .shortcut = Shortcut::projection};
  // Two downsampling blocks: 1x1 convs 16->32 and 32->64, each with batch norm (weight + bias).
  const std::int64_t projections = 16 * 32 + 2 * 32 + 32 * 64 + 2 * 64;
  CHECK(parameter_count(*make_model("resnet20", b)) ==
        parameter_count(*make_model("resnet20", a)) + projections);
}

TEST_CASE("a zero-padding shortcut carries the input through unchanged in its channels") {
  // With every residual branch's output forced to 0, a block computes relu(shortcut(x)).
  BasicBlock block(2, 4, 2, Shortcut::zero_pad);
  for (auto& named : block->named_parameters()) {
    if (named.key().find("norm2") != std::string::npos) {
      torch::NoGradGuard no_grad;
      named.value().zero_();
    }
  }
  block->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::rand({1, 2, 4, 4});
  const auto y = block->forward(x);
  CHECK(shape_of(y) == "1x4x2x2");
  using torch::indexing::Slice;
  const auto subsampled = x.index({Slice(), Slice(), Slice(0, 4, 2), Slice(0, 4, 2)});
  CHECK(y.narrow(1, 1, 2).equal(subsampled));
  CHECK(y.narrow(1, 0, 1).abs().sum().item<float>() == 0.0f);
  CHECK(y.narrow(1, 3, 1).abs().sum().item<float>() == 0.0f);
}

TEST_CASE("make_model rejects unknown names and bad options, naming what it accepts") {
  try {
    make_model("resnet19", {});
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    CHECK(message.find("resnet19") != std::string::npos);
    CHECK(message.find("resnet20") != std::string::npos);
    CHECK(message.find("resnet50") != std::string::npos);
  }
  CHECK_THROWS_AS(make_model("resnet20", {.in_channels = 0}), std::invalid_argument);
  CHECK_THROWS_AS(make_model("resnet20", {.in_channels = 3, .num_classes = 1}),
                  std::invalid_argument);
  CHECK_THROWS_AS(CifarResNet(21, {}), std::invalid_argument);
}

TEST_CASE("CIFAR-style models train: a few SGD steps reduce the loss on a fixed batch") {
  torch::manual_seed(1);
  const auto model = make_model("resnet8", {.in_channels = 1, .num_classes = 10});
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const auto images = torch::randn({16, 1, 12, 12});
  const auto labels = torch::arange(16, torch::kLong) % 10;
  model->train();
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    optimizer.zero_grad();
    const auto loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.5 * first);
}

TEST_CASE("group norm makes a sample's output independent of its batch; batch norm does not") {
  torch::manual_seed(2);
  const auto images = torch::randn({8, 1, 16, 16});
  for (const auto norm : {Norm::group, Norm::batch}) {
    CAPTURE(norm == Norm::group ? "group" : "batch");
    for (const auto& name : {"resnet8", "resnet18"}) {
      CAPTURE(name);
      const auto model = make_model(name, {.in_channels = 1, .num_classes = 10, .norm = norm});
      model->train();  // batch norm uses the batch's statistics only while training
      torch::NoGradGuard no_grad;
      const auto whole = model->forward(images).narrow(0, 0, 4);
      const auto half = model->forward(images.narrow(0, 0, 4));
      const bool same = torch::allclose(whole, half, 1e-5, 1e-5);
      CHECK(same == (norm == Norm::group));
    }
  }
}
