// The one naming room of the GEMM family: every kernel's public name, spelled from its configuration in the
// order of CUTLASS's generator (cutlass_library's procedural_name: arch, element type, tile, cluster, layouts,
// alignment, schedule, then the fused epilogue), and the one list of every kernel of every kind as JSON
// (ops.kernels()). The names are the tactic names, the tuning cache's keys and plan()'s kernels.
#include "kernel_names.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "../../csrc/json.h"
#include "../kernels/scaled_args.h"
#include "../kernels/scaled_grouped_args.h"
#include "choice.h"  // json_names
#include "tactic.h"  // config_name

namespace ops::cutlass_gemm {

// ---- Dense (kernels/kernel_list.h) ----------------------------------------------------------------

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Half: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float: return "float32";
    case DType::Double: return "float64";
  }
  return "?";
}

const char* math_name(Math math) {
  switch (math) {
    case Math::Standard: return "standard";
    case Math::TF32: return "tf32";
    case Math::Fast3xTF32: return "3xtf32";
  }
  return "?";
}

const char* layout_name(Layout layout) { return layout == Layout::Row ? "row" : "col"; }

const char* schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::Multistage: return "multistage";
    case Schedule::Cooperative: return "cooperative";
    case Schedule::Pingpong: return "pingpong";
    case Schedule::Simt: return "simt";
  }
  return "?";
}

const char* epilogue_name(Epilogue epilogue) {
  // "plain", "bias", then "bias_<activation>" (csrc/activation.h).
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = {"plain", "bias"};
    for (int i = 1; i < kNumActivations; ++i) out.push_back("bias_" + std::string(kActivationNames[i]));
    return out;
  }();
  return names.at(static_cast<size_t>(epilogue)).c_str();
}

namespace {

// CUTLASS's element names for a dtype and math (cutlass_library DataTypeNames), 3xtf32 for the split.
const char* element_token(DType dtype, Math math) {
  if (math == Math::TF32) return "tf32";
  if (math == Math::Fast3xTF32) return "3xtf32";
  switch (dtype) {
    case DType::Half: return "f16";
    case DType::BFloat16: return "bf16";
    case DType::Float: return "f32";
    case DType::Double: return "f64";
  }
  return "?";
}

// BLAS letters, as CUTLASS's ShortLayoutTypeNames: t for row-major, n for column-major.
char layout_letter(Layout layout) { return layout == Layout::Row ? 't' : 'n'; }

std::string spell_kernel_name(const KernelInfo& info) {
  const ConfigShape s = config_shape(info);
  // The kernel's own operands: swap-AB reads B^T as A and A^T as B and writes D column-major.
  const Layout a = s.swap_ab ? flip(info.b) : info.a, b = s.swap_ab ? flip(info.a) : info.b;
  std::ostringstream o;
  o << "sm" << info.sm << "_" << element_token(info.dtype, info.math) << "_";
  if (info.sm == 80) {  // the 2.x generator: <M>x<N>_<K>x<stages>_<layout A><layout B>
    o << s.tile_m << "x" << s.tile_n << "_" << s.tile_k << "x" << s.stages << "_" << layout_letter(a)
      << layout_letter(b);
  } else {  // the 3.x generator: <M>x<N>x<K>_<cluster>_<layout A><layout B><layout D>
    o << s.tile_m << "x" << s.tile_n << "x" << s.tile_k << "_" << s.cluster_m << "x" << s.cluster_n << "x1_"
      << layout_letter(a) << layout_letter(b) << (s.swap_ab ? 'n' : 't');
  }
  o << "_align" << info.alignment;
  if (s.stream_k) o << "_stream_k";
  switch (s.schedule) {
    case Schedule::Multistage: break;
    case Schedule::Cooperative: o << "_warpspecialized_cooperative"; break;
    case Schedule::Pingpong: o << "_warpspecialized_pingpong"; break;
    case Schedule::Simt: o << "_simt_gemv"; break;
  }
  if (info.epilogue != Epilogue::Plain) o << "_" << epilogue_name(info.epilogue);
  return o.str();
}

}  // namespace

std::string family_name(KernelId id) {
  const KernelInfo& info = kernel_info(id);
  std::string name = std::string("sm") + std::to_string(info.sm) + "_" + element_token(info.dtype, info.math) + "_" +
                     layout_letter(info.a) + layout_letter(info.b);
  if (info.epilogue != Epilogue::Plain) name += std::string("_") + epilogue_name(info.epilogue);
  return name;
}

const std::string& kernel_name(KernelId id) {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const KernelInfo& info : kKernels) out.push_back(spell_kernel_name(info));
    return out;
  }();
  return names.at(static_cast<size_t>(id));
}

// ---- Scaled (kernels/scaled_args.h, OPS_SCALED_GEMM_CONFIGS) ---------------------------------------

namespace {

const char* out_name(at::ScalarType out) { return out == at::kBFloat16 ? "bf16" : out == at::kHalf ? "f16" : "f32"; }

// The recipes a row serves: tensorwise and rowwise (one epilogue broadcasts a scalar or a vector), or one
// block shape of B.
std::vector<ScaleRecipe> row_recipes(bool block_scaled, int block_n) {
  if (!block_scaled) return {ScaleRecipe::Tensorwise, ScaleRecipe::Rowwise};
  return {block_n == 1 ? ScaleRecipe::Block1x128 : ScaleRecipe::Block128};
}

}  // namespace

std::string scaled_kernel_name(at::ScalarType out, ScaleRecipe recipe, Activation act, bool fast_accum, bool swap_ab) {
  if (scaled_block_recipe(recipe)) {
    return std::string("sm90_e4m3_") + (swap_ab ? kSwappedBlockScaledGemmConfig : kBlockScaledGemmConfig) + "_" +
           out_name(out) +
           (recipe == ScaleRecipe::Block128 ? "_sfa1x128_sfb128x128" : "_sfa1x128_sfb1x128") + "_bias_" +
           std::string(activation_name(act));
  }
  return std::string("sm90_e4m3_") + (swap_ab ? kSwappedScaledGemmConfig : kScaledGemmConfig) +
         (fast_accum ? "_fp8_fastaccum" : "") + "_" + out_name(out) + "_scaled_bias_" +
         std::string(activation_name(act));
}

namespace {

// Every row of OPS_SCALED_GEMM_CONFIGS, as with_scaled_config instantiates them, per output dtype and activation.
std::vector<std::string> scaled_kernels_json() {
  std::vector<std::string> kernels;
  const auto add = [&](at::ScalarType out, const std::vector<ScaleRecipe>& recipes, Activation act,
                       bool fast_accum, bool swap_ab) {
    std::vector<std::string> names;
    for (const ScaleRecipe r : recipes) names.emplace_back(scale_recipe_name(r));
    JsonObject o;
    o.add("name", scaled_kernel_name(out, *recipes.begin(), act, fast_accum, swap_ab))
        .add("op", "scaled_gemm")
        .add("sm", 90)
        .add("dtype", std::string(c10::getDtypeNames(at::kFloat8_e4m3fn).first))  // torch's names, as ops.kernels() spells all
        .add("out_dtype", std::string(c10::getDtypeNames(out).first))
        .raw("recipes", json_names(names))
        .add("activation", std::string(activation_name(act)))
        .add("accumulation", scaled_block_recipe(*recipes.begin()) ? "blockwise promotion"
                             : fast_accum                          ? "fast"
                                                                   : "two-level")
        .add("swap_ab", swap_ab)
        .add("candidate_only", true);
    kernels.push_back(o.str());
  };
  for (const at::ScalarType out : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (int a = 0; a < kNumActivations; ++a) {
      const Activation act = static_cast<Activation>(a);
#define OPS_SCALED_ROW(block, block_n, fast, swap) add(out, row_recipes(block, block_n), act, fast, swap);
      OPS_SCALED_GEMM_CONFIGS(OPS_SCALED_ROW)
#undef OPS_SCALED_ROW
    }
  }
  return kernels;
}

}  // namespace

// ---- Grouped (kernels/grouped_args.h, OPS_GROUPED_GEMM_KERNELS) ------------------------------------

std::string grouped_kernel_name(const GroupedGemmLaunchArgs& args, at::ScalarType dtype) {
  // The kernel's own A, B and D in BLAS letters (t row-major, n column-major), as kernel_name() spells them:
  // swapped, A is B^T (B's layout flipped), B is A^T and D column-major.
  const std::string layouts = args.swap_ab ? std::string(args.b_row_major ? "n" : "t") + "nn"
                                           : std::string(args.a_row_major ? "t" : "n") + (args.b_row_major ? "t" : "n") + "t";
  return std::string("sm90_") + (dtype == at::kBFloat16 ? "bf16" : "f16") + "_" +
         (args.swap_ab ? kGroupedGemmSwapTile : kGroupedGemmTile) + "_" + layouts + "_align8_" + kGroupedGemmSchedule;
}

namespace {

// Every row of OPS_GROUPED_GEMM_KERNELS (kernels/grouped_args.h), as with_grouped_config instantiates them,
// per element type.
std::vector<std::string> grouped_kernels_json() {
  struct Variant {
    bool a_row_major, b_row_major, swap_ab;
  };
#define OPS_GROUPED_ROW(a_row, b_row, swap) {a_row, b_row, swap},
  constexpr Variant kVariants[] = {OPS_GROUPED_GEMM_KERNELS(OPS_GROUPED_ROW)};
#undef OPS_GROUPED_ROW
  static_assert(sizeof(kVariants) / sizeof(kVariants[0]) == kNumGroupedGemmKernels);
  const std::string row_a_modes =
      json_names({grouped_mode_name(GroupedMode::RaggedM), grouped_mode_name(GroupedMode::Batched)});
  const std::string column_a_modes = json_names({grouped_mode_name(GroupedMode::RaggedK)});
  std::vector<std::string> kernels;
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const Variant& v : kVariants) {
      GroupedGemmLaunchArgs args;
      args.a_row_major = v.a_row_major;
      args.b_row_major = v.b_row_major;
      args.swap_ab = v.swap_ab;
      JsonObject o;
      o.add("name", grouped_kernel_name(args, dtype))
          .add("op", "grouped_gemm")
          .add("sm", 90)
          .add("dtype", std::string(c10::getDtypeNames(dtype).first))  // torch's names, as ops.kernels() spells all
          .raw("modes", v.a_row_major ? row_a_modes : column_a_modes)
          .add("layout_a", v.a_row_major ? "row" : "col")
          .add("layout_b", v.b_row_major ? "row" : "col")
          .add("swap_ab", v.swap_ab)
          .add("candidate_only", true);
      kernels.push_back(o.str());
    }
  }
  return kernels;
}

}  // namespace

// ---- Scaled grouped (kernels/scaled_grouped_args.h, OPS_SCALED_GROUPED_GEMM_KERNELS) --------------------

std::string scaled_grouped_kernel_name(at::ScalarType out, int block_n) {
  return std::string("sm90_e4m3_") + kScaledGroupedGemmConfig + "_" + out_name(out) +
         (block_n == 1 ? "_sfa1x128_sfb1x128" : "_sfa1x128_sfb128x128");
}

namespace {

// Every row of OPS_SCALED_GROUPED_GEMM_KERNELS, per output dtype: block_n 1 serves the rowwise recipe (its
// scales repeated along K), 128 the blockwise one.
std::vector<std::string> scaled_grouped_kernels_json() {
  const std::string modes =
      json_names({grouped_mode_name(GroupedMode::RaggedM), grouped_mode_name(GroupedMode::Batched)});
  std::vector<std::string> kernels;
  for (const at::ScalarType out : {at::kBFloat16, at::kHalf, at::kFloat}) {
#define OPS_SCALED_GROUPED_ROW(block_n)                                                                     \
    {                                                                                                     \
      JsonObject o;                                                                                       \
      o.add("name", scaled_grouped_kernel_name(out, block_n))                                             \
          .add("op", "scaled_grouped_gemm")                                                               \
          .add("sm", 90)                                                                                  \
          .add("dtype", std::string(c10::getDtypeNames(at::kFloat8_e4m3fn).first))                        \
          .add("out_dtype", std::string(c10::getDtypeNames(out).first))                                   \
          .raw("recipes", json_names({scale_recipe_name(block_n == 1 ? ScaleRecipe::Rowwise : ScaleRecipe::Block128)})) \
          .raw("modes", modes)                                                                            \
          .add("accumulation", "blockwise promotion")                                                     \
          .add("swap_ab", false)                                                                          \
          .add("candidate_only", true);                                                                   \
      kernels.push_back(o.str());                                                                         \
    }
    OPS_SCALED_GROUPED_GEMM_KERNELS(OPS_SCALED_GROUPED_ROW)
#undef OPS_SCALED_GROUPED_ROW
  }
  return kernels;
}

}  // namespace

// ---- Every kind --------------------------------------------------------------------------------------

std::string kernels_json() {
  std::string out = "[";
  for (int i = 0; i < kNumKernels; ++i) {
    const KernelInfo& info = kKernels[i];
    const ConfigShape shape = config_shape(info);
    JsonObject tile, cluster;
    tile.add("m", shape.tile_m).add("n", shape.tile_n).add("k", shape.tile_k);
    cluster.add("m", shape.cluster_m).add("n", shape.cluster_n);
    JsonObject o;
    o.add("name", kernel_name(static_cast<KernelId>(i)))
        .add("op", "cutlass_gemm")
        .add("id", info.id)
        .add("sm", info.sm)
        .add("dtype", dtype_name(info.dtype))
        .add("math", math_name(info.math))
        .add("layout_a", layout_name(info.a))
        .add("layout_b", layout_name(info.b))
        .add("alignment", info.alignment)
        .add("on_sm90", info.on_sm90)
        .add("epilogue", epilogue_name(info.epilogue))
        .add("config", config_name(info.config))
        .add("tile", tile)
        .add("cluster", cluster)
        .add("stages", shape.stages)
        .add("schedule", schedule_name(shape.schedule))
        .add("stream_k", shape.stream_k)
        .add("swap_ab", shape.swap_ab)
        .add("candidate_only", candidate_only(info.config));
    out += (i ? "," : "") + o.str();
  }
  for (const std::vector<std::string>& family :
       {scaled_kernels_json(), grouped_kernels_json(), scaled_grouped_kernels_json()}) {
    for (const std::string& o : family) out += "," + o;
  }
  return out + "]";
}

}  // namespace ops::cutlass_gemm
