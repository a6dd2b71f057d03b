#include "kernels/onednn.h"

#include <torch/csrc/autograd/custom_function.h>

#include <dnnl.hpp>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "jobspec/layers.h"  // SlideWindow: the output size PyTorch gives a window

namespace trainctl::kernels {
namespace {

using dnnl::memory;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
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
  memory::desc user_weights;  // O x I x k x k, as torch holds them
  // What the layers around hold, in their layout: the input (in its data type); the output and
  // its gradient, f32; the input's gradient, f32.
  memory::desc src_user, y_f32, x_f32;
  memory::dims out;  // N, O, rows, cols
  // The conversions between the two, made once: src_user -> the forward's input; the user's
  // weights -> forward's and backward data's; the output's gradient -> backward's; the weights'
  // gradient -> the user's layout; the output and the input's gradient -> the user's. Null where
  // the two agree.
  std::shared_ptr<const dnnl::reorder> to_src, to_fwd_weights, to_bwd_weights, to_diff_dst, from_diff_weights, from_dst,
      from_diff_src;
};

// A conversion from one layout or data type to another, made once; null where none is needed.
std::shared_ptr<const dnnl::reorder> MakeReorder(const memory::desc& from, const memory::desc& to) {
  if (from == to) return nullptr;
  return std::make_shared<const dnnl::reorder>(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
}

// One convolution: its shape, its layout, whether it multiplies in bf16 and the input's type.
struct ConvKey {
  int64_t n, ic, oc, h, w, kernel, stride, padding;
  bool bias, blocked, bf16, bf16_input;
  auto Tie() const { return std::tie(n, ic, oc, h, w, kernel, stride, padding, bias, blocked, bf16, bf16_input); }
  bool operator<(const ConvKey& o) const { return Tie() < o.Tie(); }
};

std::shared_ptr<const Conv> MakeConv(const ConvKey& key) {
  const int64_t k = key.kernel, oh = SlideWindow(key.h, k, key.stride, key.padding),
                ow = SlideWindow(key.w, k, key.stride, key.padding);
  const memory::dims strides{key.stride, key.stride}, pad{key.padding, key.padding};
  using DataType = memory::data_type;
  // In bf16, what is multiplied (input, weights, output gradient) is bf16; what is produced
  // (output, gradients of the input, weights and bias) stays f32, accumulated in f32.
  const DataType in = key.bf16 ? DataType::bf16 : DataType::f32, f32 = DataType::f32;
  const Tag layout = key.blocked ? Tag::nChw16c : Tag::nhwc;
  // oneDNN 2.6's bf16 kernels for channels-last are slower (brgconv forward: 0.18 against 0.09 ms
  // for the recipe's 16 -> 48 layer at batch 64; 0.29 against 0.17 for 48 -> 96) than its
  // blocked ones, and it has none that mix the two: channels-last bf16 convolutions of channels
  // in blocks of 16 compute blocked, converting their output and input gradient back (about
  // 0.02 ms each for those layers), as they convert the input and output gradient to bf16 anyway.
  const bool inner_blocked = key.blocked || (key.bf16 && key.ic % kBlock == 0 && key.oc % kBlock == 0);
  const Tag inner = inner_blocked ? Tag::nChw16c : Tag::nhwc;
  const memory::dims x_dims{key.n, key.ic, key.h, key.w}, y_dims{key.n, key.oc, oh, ow};
  memory::desc src(x_dims, in, inner), diff_src(x_dims, f32, inner);
  memory::desc dst(y_dims, f32, inner), diff_dst(y_dims, in, inner);
  memory::desc weights({key.oc, key.ic, k, k}, in, Tag::any), diff_weights({key.oc, key.ic, k, k}, f32, Tag::any);
  memory::desc bias({key.oc}, f32, Tag::x), no_bias;
  const memory::desc& b = key.bias ? bias : no_bias;
  // oneDNN has no bf16 Winograd, nor one for strides or other kernels than 3x3.
  const bool winograd = !key.bf16 && k == 3 && key.stride == 1;
  const auto algorithm = winograd ? dnnl::algorithm::convolution_auto : dnnl::algorithm::convolution_direct;
  const dnnl::engine& e = Engine();
  dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algorithm, src, weights, b, dst, strides, pad,
                                      pad),
      e);
  auto backward_weights = [&](dnnl::algorithm a) {
    return dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(a, src, diff_weights, b, diff_dst, strides, pad, pad), e, fwd_pd);
  };
  // For the weights' gradient oneDNN's auto choice is the direct algorithm, where its Winograd
  // kernel takes two thirds of the time (2.8 against 4.3 ms for the CNN's 32 -> 64 layer at
  // batch 64 on one core): asked for by name, where the CPU has it.
  std::optional<dnnl::convolution_backward_weights::primitive_desc> by_winograd;
  if (winograd) {
    try {
      by_winograd = backward_weights(dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
    }
  }
  const auto bwd_weights_pd = by_winograd ? *by_winograd : backward_weights(algorithm);
  const dnnl::convolution_backward_data::primitive_desc bwd_data_pd(
      dnnl::convolution_backward_data::desc(algorithm, diff_src, weights, diff_dst, strides, pad, pad), e, fwd_pd);
  const memory::desc user_weights({key.oc, key.ic, k, k}, f32, Tag::oihw);
  const memory::desc src_user(x_dims, key.bf16_input ? DataType::bf16 : f32, layout);
  const memory::desc y_f32(y_dims, f32, layout), x_f32(x_dims, f32, layout);
  return std::make_shared<Conv>(Conv{
      fwd_pd, bwd_weights_pd, bwd_data_pd, dnnl::convolution_forward(fwd_pd),
      dnnl::convolution_backward_weights(bwd_weights_pd), dnnl::convolution_backward_data(bwd_data_pd), user_weights,
      src_user, y_f32, x_f32, y_dims, MakeReorder(src_user, fwd_pd.src_desc()),
      MakeReorder(user_weights, fwd_pd.weights_desc()), MakeReorder(user_weights, bwd_data_pd.weights_desc()),
      MakeReorder(y_f32, bwd_weights_pd.diff_dst_desc()), MakeReorder(bwd_weights_pd.diff_weights_desc(), user_weights),
      MakeReorder(fwd_pd.dst_desc(), y_f32), MakeReorder(bwd_data_pd.diff_src_desc(), x_f32)});
}

// x's convolution with weight (O x I x k x k): the weight says the channels, which a blocked x
// holds in blocks of 16.
ConvKey KeyOf(const torch::Tensor& x, const torch::Tensor& weight, bool bias, int64_t stride, int64_t padding,
              bool bf16) {
  return {x.size(0), weight.size(1), weight.size(0), x.size(2),    x.size(3), weight.size(2),
          stride,    padding,        bias,           x.dim() == 5, bf16,      x.scalar_type() == torch::kBFloat16};
}

// Each thread its own primitives: oneDNN's Winograd weight gradient is not safe to run from two
// threads at once (it crashed where two ranks of a test are threads of one process). Null where
// oneDNN has no generated kernel for one of the three (it would run its reference loops, hundreds
// of times slower than ATen's convolutions) or none at all.
std::shared_ptr<const Conv> GetConv(const ConvKey& key) {
  static thread_local std::map<ConvKey, std::shared_ptr<const Conv>> cache;
  auto [it, fresh] = cache.try_emplace(key);
  if (fresh) {
    // oneDNN names what it chose; "ref:any" is its reference loops.
    auto jit = [](const std::string& impl) { return impl.rfind("ref", 0) != 0; };
    try {
      auto conv = MakeConv(key);
      if (jit(conv->fwd_pd.impl_info_str()) && jit(conv->bwd_weights_pd.impl_info_str()) &&
          jit(conv->bwd_data_pd.impl_info_str())) {
        it->second = conv;
      }
    } catch (const dnnl::error&) {
    }
  }
  return it->second;
}

memory Wrap(const memory::desc& desc, const torch::Tensor& t) { return memory(desc, Engine(), t.data_ptr()); }

torch::Tensor Empty(const memory::desc& desc) {
  const bool bf16 = desc.data_type() == memory::data_type::bf16;
  return torch::empty({static_cast<int64_t>(desc.get_size() / (bf16 ? 2 : 4))},
                      bf16 ? torch::kBFloat16 : torch::kFloat32);
}

// `from` (in `from_desc`) into `to` (in `to_desc`) by `reorder` (MakeReorder's of the two),
// converting the layout and the data type; nothing where there is no reorder.
void Convert(dnnl::stream& s, const std::shared_ptr<const dnnl::reorder>& reorder, const torch::Tensor& from,
             const memory::desc& from_desc, const torch::Tensor& to, const memory::desc& to_desc) {
  if (!reorder) return;
  memory src = Wrap(from_desc, from), dst = Wrap(to_desc, to);
  reorder->execute(s, src, dst);
}

// `from` converted into a new tensor in desc `to`: the tensor itself where there is no reorder.
torch::Tensor Reorder(dnnl::stream& s, const std::shared_ptr<const dnnl::reorder>& reorder, const torch::Tensor& from,
                      const memory::desc& from_desc, const memory::desc& to) {
  if (!reorder) return from;
  torch::Tensor out = Empty(to);
  Convert(s, reorder, from, from_desc, out, to);
  return out;
}

// An f32 tensor of `dims` (N, C, H, W), blocked (5-D) or channels-last.
torch::Tensor EmptyLike(const memory::dims& dims, bool blocked) {
  if (blocked) return torch::empty({dims[0], dims[1] / kBlock, dims[2], dims[3], kBlock}, torch::kFloat32);
  return torch::empty({dims[0], dims[1], dims[2], dims[3]},
                      torch::TensorOptions(torch::kFloat32).memory_format(at::MemoryFormat::ChannelsLast));
}

class ConvFunction : public torch::autograd::Function<ConvFunction> {
 public:
  // GetConv(KeyOf(...)) is not null for these; bias is empty where there is none.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                               int64_t stride, int64_t padding, bool bf16) {
    const ConvKey key = KeyOf(x, weight, bias.numel() > 0, stride, padding, bf16);
    const auto conv = GetConv(key);
    const bool blocked = key.blocked;
    x = blocked ? x.contiguous() : x.contiguous(at::MemoryFormat::ChannelsLast);
    weight = weight.contiguous();
    dnnl::stream s(Engine());
    // In bf16 the input's bf16 copy is what backward needs: half the memory kept.
    const torch::Tensor src = Reorder(s, conv->to_src, x, conv->src_user, conv->fwd_pd.src_desc());
    torch::Tensor w = Reorder(s, conv->to_fwd_weights, weight, conv->user_weights, conv->fwd_pd.weights_desc());
    torch::Tensor out = EmptyLike(conv->out, blocked);
    const torch::Tensor dst = conv->from_dst ? Empty(conv->fwd_pd.dst_desc()) : out;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, Wrap(conv->fwd_pd.src_desc(), src)},
                                         {DNNL_ARG_WEIGHTS, Wrap(conv->fwd_pd.weights_desc(), w)},
                                         {DNNL_ARG_DST, Wrap(conv->fwd_pd.dst_desc(), dst)}};
    if (key.bias) args.emplace(DNNL_ARG_BIAS, Wrap(conv->fwd_pd.bias_desc(), bias = bias.contiguous()));
    conv->fwd.execute(s, args);
    Convert(s, conv->from_dst, dst, conv->fwd_pd.dst_desc(), out, conv->y_f32);
    s.wait();
    ctx->save_for_backward({src, weight});
    ctx->saved_data["key"] =
        std::vector<int64_t>{key.n,      key.ic,      key.oc,   key.h,       key.w,    key.kernel,
                             key.stride, key.padding, key.bias, key.blocked, key.bf16, key.bf16_input};
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& src = saved[0];
    const torch::Tensor& weight = saved[1];
    const std::vector<int64_t> k = ctx->saved_data["key"].toIntVector();
    const ConvKey key{k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8] != 0, k[9] != 0, k[10] != 0, k[11] != 0};
    const auto conv = GetConv(key);
    const bool blocked = key.blocked;
    dnnl::stream s(Engine());
    const torch::Tensor g0 = blocked ? grads[0].contiguous() : grads[0].contiguous(at::MemoryFormat::ChannelsLast);
    torch::Tensor g =
        Reorder(s, conv->to_diff_dst, g0.to(torch::kFloat32), conv->y_f32, conv->bwd_weights_pd.diff_dst_desc());
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      const auto& pd = conv->bwd_data_pd;
      torch::Tensor w = Reorder(s, conv->to_bwd_weights, weight, conv->user_weights, pd.weights_desc());
      dx = EmptyLike(conv->src_user.dims(), blocked);
      const torch::Tensor diff_src = conv->from_diff_src ? Empty(pd.diff_src_desc()) : dx;
      conv->bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, Wrap(pd.diff_dst_desc(), g)},
                                 {DNNL_ARG_WEIGHTS, Wrap(pd.weights_desc(), w)},
                                 {DNNL_ARG_DIFF_SRC, Wrap(pd.diff_src_desc(), diff_src)}});
      Convert(s, conv->from_diff_src, diff_src, pd.diff_src_desc(), dx, conv->x_f32);
      if (conv->src_user.data_type() == memory::data_type::bf16) dx = dx.to(torch::kBFloat16);
    }
    const auto& pd = conv->bwd_weights_pd;
    torch::Tensor dw = Empty(pd.diff_weights_desc()), db;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, Wrap(pd.src_desc(), src)},
                                         {DNNL_ARG_DIFF_DST, Wrap(pd.diff_dst_desc(), g)},
                                         {DNNL_ARG_DIFF_WEIGHTS, Wrap(pd.diff_weights_desc(), dw)}};
    if (key.bias) {
      db = torch::empty({weight.size(0)}, torch::kFloat32);
      args.emplace(DNNL_ARG_DIFF_BIAS, Wrap(pd.diff_bias_desc(), db));
    }
    conv->bwd_weights.execute(s, args);
    dw = Reorder(s, conv->from_diff_weights, dw, pd.diff_weights_desc(), conv->user_weights).view(weight.sizes());
    s.wait();
    return {dx, dw, db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// One row-major GEMM through oneDNN's own (AVX-512 where the CPU has it): c = a(T) * b(T).
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 0.0f, c, n);
  TORCH_CHECK(st == dnnl_success, "oneDNN sgemm failed (status ", int(st), ")");
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
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
  static const bool fast = GetConv({1, kBlock, kBlock, 8, 8, 3, 1, 1, true, true, false, false}) != nullptr;
  return fast;
}

torch::Tensor Conv3x3(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, bool bf16) {
  CheckBlocked(x, "Conv3x3");
  const int64_t ic = x.size(1) * kBlock;
  TORCH_CHECK(weight.dim() == 4 && weight.size(1) == ic && weight.size(2) == 3 && weight.size(3) == 3 &&
                  weight.size(0) % kBlock == 0 && bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                  weight.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32,
              "Conv3x3 takes an O x ", ic, " x 3 x 3 weight (O a multiple of 16) and an O bias");
  torch::Tensor y = Convolution(x, weight, bias, 1, 1, bf16);
  TORCH_CHECK(y.defined(), "oneDNN has no generated kernels for Conv3x3 on this CPU");
  return y;
}

torch::Tensor Convolution(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                          int64_t stride, int64_t padding, bool bf16) {
  const bool blocked = x.dim() == 5;
  if (blocked) CheckBlocked(x, "Convolution");
  const int64_t ic = blocked ? x.size(1) * kBlock : x.size(1);
  TORCH_CHECK(x.dim() == 4 || blocked, "Convolution takes an N x C x H x W or a blocked input");
  TORCH_CHECK(x.is_cpu() && (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16),
              "Convolution takes a float or bfloat16 CPU input");
  TORCH_CHECK(weight.dim() == 4 && weight.size(1) == ic && weight.size(2) == weight.size(3) &&
                  weight.scalar_type() == torch::kFloat32 && (!blocked || weight.size(0) % kBlock == 0) &&
                  (!bias.defined() ||
                   (bias.dim() == 1 && bias.size(0) == weight.size(0) && bias.scalar_type() == torch::kFloat32)) &&
                  stride >= 1 && padding >= 0 && x.size(2) + 2 * padding >= weight.size(2) &&
                  x.size(3) + 2 * padding >= weight.size(3),
              "Convolution takes an O x ", ic, " x k x k float weight, an O bias or none, and a window that fits");
  try {
    if (!GetConv(KeyOf(x, weight, bias.defined(), stride, padding, bf16))) return {};
    // An empty tensor for no bias: autograd's functions take no undefined inputs.
    return ConvFunction::apply(x, weight, bias.defined() ? bias : torch::empty({0}), stride, padding, bf16);
  } catch (const dnnl::error& e) {
    TORCH_CHECK(false, "oneDNN convolution failed: ", e.what());
  }
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu() && weight.dim() == 2 &&
                  weight.size(1) == x.size(1) && weight.scalar_type() == torch::kFloat32 && bias.dim() == 1 &&
                  bias.size(0) == weight.size(0) && bias.scalar_type() == torch::kFloat32,
              "Linear takes a float CPU batch N x I, an O x I weight and an O bias");
  return LinearFunction::apply(x, weight, bias);
}

}  // namespace trainctl::kernels
