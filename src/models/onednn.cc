#include "models/onednn.h"

#include <dnnl.hpp>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

namespace trainctl::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
using dnnl::memory;
using Tag = memory::format_tag;

const dnnl::engine& Engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// The primitives of one convolution shape, made once (oneDNN generates their code at creation).
struct Conv {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::convolution_backward_data bwd_data;
  memory::desc user_weights;  // O x I x 3 x 3, as torch holds them
  // What the layers around hold in f32: the input, and the gradient of the output (the same as
  // src_desc() and diff_dst_desc() unless bf16).
  memory::desc src_f32, diff_dst_f32;
};

// batch, input channels (a multiple of 16), output channels, height, width, bf16.
using ConvKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

std::shared_ptr<const Conv> MakeConv(const ConvKey& key) {
  auto [n, ic, oc, h, w, bf16] = key;
  const memory::dims strides{1, 1}, pad{1, 1};
  using DataType = memory::data_type;
  // In bf16, what is multiplied (input, weights, output gradient) is bf16; what is produced
  // (output, gradients of the input, weights and bias) stays f32, accumulated in f32.
  const DataType in = bf16 ? DataType::bf16 : DataType::f32;
  memory::desc src({n, ic, h, w}, in, Tag::nChw16c), diff_src({n, ic, h, w}, DataType::f32, Tag::nChw16c);
  memory::desc dst({n, oc, h, w}, DataType::f32, Tag::nChw16c), diff_dst({n, oc, h, w}, in, Tag::nChw16c);
  memory::desc weights({oc, ic, 3, 3}, in, Tag::any), diff_weights({oc, ic, 3, 3}, DataType::f32, Tag::any);
  memory::desc bias({oc}, DataType::f32, Tag::x);
  // oneDNN has no bf16 Winograd.
  const auto algorithm = bf16 ? dnnl::algorithm::convolution_direct : dnnl::algorithm::convolution_auto;
  const dnnl::engine& e = Engine();
  dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algorithm, src, weights,
                                      bias, dst, strides, pad, pad),
      e);
  auto backward_weights = [&](dnnl::algorithm a) {
    return dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(a, src, diff_weights, bias, diff_dst, strides, pad, pad),
        e, fwd_pd);
  };
  // For the weights' gradient oneDNN's auto choice is the direct algorithm, where its Winograd
  // kernel takes two thirds of the time (2.8 against 4.3 ms for the CNN's 32 -> 64 layer at
  // batch 64 on one core): asked for by name, where the CPU has it.
  std::optional<dnnl::convolution_backward_weights::primitive_desc> winograd;
  if (algorithm == dnnl::algorithm::convolution_auto) {
    try {
      winograd = backward_weights(dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
    }
  }
  const auto bwd_weights_pd = winograd ? *winograd : backward_weights(algorithm);
  const dnnl::convolution_backward_data::primitive_desc bwd_data_pd(
      dnnl::convolution_backward_data::desc(algorithm, diff_src, weights, diff_dst, strides, pad, pad), e, fwd_pd);
  return std::make_shared<Conv>(Conv{fwd_pd, bwd_weights_pd, bwd_data_pd, dnnl::convolution_forward(fwd_pd),
                                     dnnl::convolution_backward_weights(bwd_weights_pd),
                                     dnnl::convolution_backward_data(bwd_data_pd),
                                     memory::desc({oc, ic, 3, 3}, DataType::f32, Tag::oihw), diff_src, dst});
}

// x's convolution with weight (O x I x 3 x 3): the weight says the channels, which a blocked x
// holds in blocks of 16.
ConvKey KeyOf(const torch::Tensor& x, const torch::Tensor& weight, bool bf16) {
  return {x.size(0), weight.size(1), weight.size(0), x.size(2), x.size(3), bf16};
}

// Each thread its own primitives: oneDNN's Winograd weight gradient is not safe to run from two
// threads at once (it crashed where two ranks of a test are threads of one process).
std::shared_ptr<const Conv> GetConv(const ConvKey& key) {
  static thread_local std::map<ConvKey, std::shared_ptr<const Conv>> cache;
  auto& conv = cache[key];
  if (!conv) conv = MakeConv(key);
  return conv;
}

memory Wrap(const memory::desc& desc, const torch::Tensor& t) {
  return memory(desc, Engine(), t.data_ptr());
}

torch::Tensor Empty(const memory::desc& desc) {
  const bool bf16 = desc.data_type() == memory::data_type::bf16;
  return torch::empty({static_cast<int64_t>(desc.get_size() / (bf16 ? 2 : 4))},
                      bf16 ? torch::kBFloat16 : torch::kFloat32);
}

// `from` (in desc `from_desc`) in desc `to`, converting the layout and the data type: the
// tensor itself when they agree.
torch::Tensor Reorder(dnnl::stream& s, const torch::Tensor& from, const memory::desc& from_desc,
                      const memory::desc& to) {
  if (from_desc == to) return from;
  torch::Tensor out = Empty(to);
  memory src = Wrap(from_desc, from), dst = Wrap(to, out);
  dnnl::reorder(src, dst).execute(s, src, dst);
  return out;
}

class Conv3x3Function : public torch::autograd::Function<Conv3x3Function> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               torch::Tensor bias, bool bf16) {
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t oc = weight.size(0);
    auto conv = GetConv(KeyOf(x, weight, bf16));
    dnnl::stream s(Engine());
    // In bf16 the input's bf16 copy is what backward needs: half the memory kept.
    x = Reorder(s, x, conv->src_f32, conv->fwd_pd.src_desc()).view(x.sizes());
    torch::Tensor w = Reorder(s, weight, conv->user_weights, conv->fwd_pd.weights_desc());
    torch::Tensor out = torch::empty({x.size(0), oc / kBlock, x.size(2), x.size(3), kBlock}, torch::kFloat32);
    conv->fwd.execute(s, {{DNNL_ARG_SRC, Wrap(conv->fwd_pd.src_desc(), x)},
                          {DNNL_ARG_WEIGHTS, Wrap(conv->fwd_pd.weights_desc(), w)},
                          {DNNL_ARG_BIAS, Wrap(conv->fwd_pd.bias_desc(), bias)},
                          {DNNL_ARG_DST, Wrap(conv->fwd_pd.dst_desc(), out)}});
    s.wait();
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bf16"] = bf16;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const bool bf16 = ctx->saved_data["bf16"].toBool();
    auto conv = GetConv(KeyOf(x, weight, bf16));
    const int64_t oc = weight.size(0);
    dnnl::stream s(Engine());
    torch::Tensor g = Reorder(s, grads[0].contiguous(), conv->diff_dst_f32, conv->bwd_weights_pd.diff_dst_desc());
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      const auto& pd = conv->bwd_data_pd;
      torch::Tensor w = Reorder(s, weight, conv->user_weights, pd.weights_desc());
      dx = torch::empty(x.sizes(), torch::kFloat32);
      conv->bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, Wrap(pd.diff_dst_desc(), g)},
                                  {DNNL_ARG_WEIGHTS, Wrap(pd.weights_desc(), w)},
                                  {DNNL_ARG_DIFF_SRC, Wrap(pd.diff_src_desc(), dx)}});
    }
    const auto& pd = conv->bwd_weights_pd;
    torch::Tensor dw = Empty(pd.diff_weights_desc());
    torch::Tensor db = torch::empty({oc}, torch::kFloat32);
    conv->bwd_weights.execute(s, {{DNNL_ARG_SRC, Wrap(pd.src_desc(), x)},
                                  {DNNL_ARG_DIFF_DST, Wrap(pd.diff_dst_desc(), g)},
                                  {DNNL_ARG_DIFF_WEIGHTS, Wrap(pd.diff_weights_desc(), dw)},
                                  {DNNL_ARG_DIFF_BIAS, Wrap(pd.diff_bias_desc(), db)}});
    dw = Reorder(s, dw, pd.diff_weights_desc(), conv->user_weights).view(weight.sizes());
    s.wait();
    return {dx, dw, db, torch::Tensor()};
  }
};

// One row-major GEMM through oneDNN's own (AVX-512 where the CPU has it): c = a(T) * b(T).
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
          float* c) {
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, ta ? m : k, b,
                                tb ? k : n, 0.0f, c, n);
  TORCH_CHECK(st == dnnl_success, "oneDNN sgemm failed (status ", int(st), ")");
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight,
                               torch::Tensor bias) {
    x = x.contiguous();
    weight = weight.contiguous();
    const int64_t batch = x.size(0), in = x.size(1), out = weight.size(0);
    torch::Tensor y = torch::empty({batch, out}, x.options());
    Gemm(false, true, batch, out, in, x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>());
    y.add_(bias);
    ctx->save_for_backward({x, weight});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    torch::Tensor g = grads[0].contiguous();
    const int64_t batch = x.size(0), in = x.size(1), out = weight.size(0);
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty_like(x);
      Gemm(false, false, batch, in, out, g.data_ptr<float>(), weight.data_ptr<float>(), dx.data_ptr<float>());
    }
    torch::Tensor dw = torch::empty_like(weight);
    Gemm(true, false, out, in, batch, g.data_ptr<float>(), x.data_ptr<float>(), dw.data_ptr<float>());
    return {dx, dw, g.sum(0)};
  }
};

}  // namespace

bool Bf16Convolutions() {
  static const bool hardware = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return hardware;
}

bool BlockedConvolutions() {
  static const bool fast = [] {
    // oneDNN names what it chose; "ref:any" is its reference loops.
    auto jit = [](const std::string& impl) { return impl.rfind("ref", 0) != 0; };
    try {
      auto conv = MakeConv({1, kBlock, kBlock, 8, 8, false});
      return jit(conv->fwd_pd.impl_info_str()) && jit(conv->bwd_weights_pd.impl_info_str()) &&
             jit(conv->bwd_data_pd.impl_info_str());
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return fast;
}

torch::Tensor Conv3x3(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                      bool bf16) {
  CheckBlocked(x, "Conv3x3");
  const int64_t ic = x.size(1) * kBlock;
  TORCH_CHECK(weight.dim() == 4 && weight.size(1) == ic && weight.size(2) == 3 && weight.size(3) == 3 &&
                  weight.size(0) % kBlock == 0 && bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                  weight.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32,
              "Conv3x3 takes an O x ", ic, " x 3 x 3 weight (O a multiple of 16) and an O bias");
  try {
    return Conv3x3Function::apply(x, weight, bias, bf16);
  } catch (const dnnl::error& e) {
    TORCH_CHECK(false, "oneDNN convolution failed: ", e.what());
  }
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu() &&
                  weight.dim() == 2 && weight.size(1) == x.size(1) &&
                  weight.scalar_type() == torch::kFloat32 && bias.dim() == 1 &&
                  bias.size(0) == weight.size(0) && bias.scalar_type() == torch::kFloat32,
              "Linear takes a float CPU batch N x I, an O x I weight and an O bias");
  return LinearFunction::apply(x, weight, bias);
}

}  // namespace trainctl::models
