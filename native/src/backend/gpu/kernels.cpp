// The embedded SPIR-V of the kernels in gpu-kernels/ (compiled by glslangValidator at build
// time into headers of uint32 arrays, see native/CMakeLists.txt).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/gpu/device.h"
#include "gpu_kernels/attention_combine.h"
#include "gpu_kernels/attention_partial.h"
#include "gpu_kernels/attention_tiled.h"
#include "gpu_kernels/elementwise.h"
#include "gpu_kernels/embed.h"
#include "gpu_kernels/ffn_tail.h"
#include "gpu_kernels/gather_rows.h"
#include "gpu_kernels/kv_norm_store.h"
#include "gpu_kernels/kv_prefetch.h"
#include "gpu_kernels/kv_store.h"
#include "gpu_kernels/moe_combine.h"
#include "gpu_kernels/moe_matmul.h"
#include "gpu_kernels/moe_matmul_tiled.h"
#include "gpu_kernels/moe_matmul_tiled_r8.h"
#include "gpu_kernels/moe_matvec.h"
#include "gpu_kernels/moe_matvec_down.h"
#include "gpu_kernels/norm_rope.h"
#include "gpu_kernels/penalize.h"
#include "gpu_kernels/qmatmul.h"
#include "gpu_kernels/qmatmul_tiled.h"
#include "gpu_kernels/qmatmul_tiled_r8.h"
#include "gpu_kernels/qmatvec.h"
#include "gpu_kernels/qmatvec_heads.h"
#include "gpu_kernels/qmatvec_norms.h"
#include "gpu_kernels/qmatvec_tail.h"
#include "gpu_kernels/qmatvec_wide.h"
#include "gpu_kernels/rms_norm.h"
#include "gpu_kernels/rope.h"
#include "gpu_kernels/route.h"
#include "gpu_kernels/router.h"
#include "gpu_kernels/scatter_add_rows.h"
#include "gpu_kernels/topk_merge.h"
#include "gpu_kernels/topk_partial.h"

namespace redwing::gpu {
namespace {

struct KernelCode {
  const char* name;
  std::span<const uint32_t> spirv;
  const char* source = name;  // gpu-kernels/<source>.comp
};

// Indexed by Kernel (the order of the enum in device.h).
const KernelCode kKernels[] = {
    {"qmatvec", spirv_qmatvec},
    {"qmatmul", spirv_qmatmul},
    {"embed", spirv_embed},
    {"rms_norm", spirv_rms_norm},
    {"elementwise", spirv_elementwise},
    {"rope", spirv_rope},
    {"gather_rows", spirv_gather_rows},
    {"scatter_add_rows", spirv_scatter_add_rows},
    {"kv_store", spirv_kv_store},
    {"attention_partial", spirv_attention_partial},
    {"attention_combine", spirv_attention_combine},
    {"route", spirv_route},
    {"moe_matvec", spirv_moe_matvec},
    {"moe_combine", spirv_moe_combine},
    {"penalize", spirv_penalize},
    {"topk_partial", spirv_topk_partial},
    {"topk_merge", spirv_topk_merge},
    {"norm_rope", spirv_norm_rope},
    {"moe_matvec_down", spirv_moe_matvec_down},
    {"ffn_tail", spirv_ffn_tail},
    {"qmatmul_tiled", spirv_qmatmul_tiled},
    {"moe_matmul", spirv_moe_matmul},
    {"moe_matmul_tiled", spirv_moe_matmul_tiled},
    {"kv_norm_store", spirv_kv_norm_store},
    {"router", spirv_router},
    {"qmatvec_norms", spirv_qmatvec_norms},
    {"qmatvec_heads", spirv_qmatvec_heads},
    {"attention_tiled", spirv_attention_tiled},
    {"qmatmul_tiled_r8", spirv_qmatmul_tiled_r8},
    {"moe_matmul_tiled_r8", spirv_moe_matmul_tiled_r8},
    {"qmatvec_wide", spirv_qmatvec_wide},
    {"kv_prefetch", spirv_kv_prefetch},
    {"qmatvec_tail", spirv_qmatvec_tail},
};
static_assert(std::size(kKernels) == static_cast<size_t>(Kernel::count));

}  // namespace

namespace {

// The comma-separated words of an environment setting, empty ones included ("a,,b" is three).
std::vector<std::string> comma_words(const std::string& text) {
  std::vector<std::string> words;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    words.push_back(text.substr(start, comma - start));  // to the end when no comma is left
    if (comma == std::string::npos) return words;
    start = comma + 1;
  }
}

// A setting's word as a number of at most 6 decimal digits; nothing for anything else (a sign,
// spaces, an empty word).
std::optional<uint32_t> setting_number(const std::string& word) {
  if (word.empty() || word.size() > 6 || word.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return static_cast<uint32_t>(std::stoul(word));
}

}  // namespace

bool valid_workgroup_threads(uint32_t n) { return n == 64 || n == 128 || n == 256; }

uint32_t choose_workgroup_threads(bool software) {
  if (const char* forced = std::getenv("REDWING_GPU_WORKGROUP"); forced && *forced) {
    const auto n = static_cast<uint32_t>(std::strtoul(forced, nullptr, 10));
    if (!valid_workgroup_threads(n))
      throw std::invalid_argument(std::string("REDWING_GPU_WORKGROUP=") + forced +
                                  ": expected 64, 128 or 256");
    return n;
  }
  return software ? kCpuWorkgroupThreads : kGpuWorkgroupThreads;
}

namespace {

// "rows,lanes,unroll" (REDWING_GPU_MATVEC_DOWN), or the fallback when unset.
MatvecShape parse_matvec_shape(const char* variable, MatvecShape fallback) {
  const char* value = std::getenv(variable);
  if (!value || !*value) return fallback;
  unsigned rows = 0, lanes = 0, unroll = 0;
  char rest = 0;
  const auto is_pow2 = [](unsigned n) { return n != 0 && (n & (n - 1)) == 0; };
  if (std::sscanf(value, "%u,%u,%u%c", &rows, &lanes, &unroll, &rest) != 3 || rows < 1 ||
      rows > 4 || !is_pow2(lanes) || lanes > 256 || (unroll != 1 && unroll != 2 && unroll != 4))
    throw std::invalid_argument(std::string(variable) + "=" + value +
                                ": expected rows,lanes,unroll (rows 1-4, lanes a power of two up "
                                "to 256, unroll 1, 2 or 4)");
  fallback.rows_per_team = rows;
  fallback.lanes = lanes;
  fallback.unroll = unroll;
  return fallback;
}

}  // namespace

void choose_matvec_shapes(DeviceInfo& info) {
  const uint32_t threads = info.workgroup_threads;
  // A CPU device (lavapipe: 8-wide subgroups, one core per workgroup) wants teams of one
  // subgroup (no barrier at all) and few idle lanes; a GPU the H200's best (docs/gpu.md, seventh
  // round: 48.4 ms per 65 tokens against 73.0 for the staged product; twenty-first round: one
  // word in flight, not two, since a 704-column row's 88 words fill 3 rounds of 32 lanes but
  // only 69% of 2 rounds of 64).
  MatvecShape down = threads <= 64 ? MatvecShape{2, 8, false, 2} : MatvecShape{4, 32, false, 1};
  down = parse_matvec_shape("REDWING_GPU_MATVEC_DOWN", down);
  // REDWING_GPU_SUBGROUP: unset or "1" every product that can, "down" only this one (the
  // reductions before the twelfth round), "0" none.
  const char* sub = std::getenv("REDWING_GPU_SUBGROUP");
  const std::string sub_value = sub ? sub : "";
  if (!sub_value.empty() && sub_value != "0" && sub_value != "1" && sub_value != "down")
    throw std::invalid_argument("REDWING_GPU_SUBGROUP=" + sub_value + ": expected 0, 1 or down");
  const bool subgroups_allowed = sub_value != "0";
  down.lanes = std::min(down.lanes, threads);
  // subgroupAdd sums whole subgroups: a team must be whole subgroups (both are powers of two).
  down.subgroup_reduce = subgroups_allowed && info.subgroup_arithmetic && info.subgroup_size > 0 &&
                         down.lanes % info.subgroup_size == 0 && threads % info.subgroup_size == 0;
  info.matvec_down = down;
  // matvec.glsl's rows: 8 per workgroup, threads / 8 lanes each (32 on a GPU, 8 on lavapipe).
  info.matvec_subgroup_reduce = subgroups_allowed && sub_value != "down" &&
                                info.subgroup_arithmetic && info.subgroup_size == threads / 8;
  info.matvec_loop_groups = info.software ? kCpuMatvecLoopGroups : kGpuMatvecLoopGroups;
  if (const char* groups = std::getenv("REDWING_GPU_MATVEC_GROUPS"); groups && *groups) {
    const auto n = setting_number(groups);
    if (!n || *n > 65535)
      throw std::invalid_argument(std::string("REDWING_GPU_MATVEC_GROUPS=") + groups +
                                  ": expected a number from 0 to 65535");
    info.matvec_loop_groups = *n;
  }
  info.matvec_loop_rows = info.software ? kCpuMatvecLoopRows : kGpuMatvecLoopRows;
  if (const char* rows = std::getenv("REDWING_GPU_MATVEC_LOOP_ROWS"); rows && *rows) {
    const auto n = setting_number(rows);
    if (!n || (*n != 1 && *n != 2 && *n != 4))
      throw std::invalid_argument(std::string("REDWING_GPU_MATVEC_LOOP_ROWS=") + rows +
                                  ": expected 1, 2 or 4");
    info.matvec_loop_rows = *n;
  }
}

void choose_matmul_policy(DeviceInfo& info) {
  const char* value = std::getenv("REDWING_GPU_QMATMUL");
  MatmulPolicy policy;
  if (value && *value) {
    const std::string v = value;
    if (v == "narrow") {
      policy.mode = MatmulPolicy::narrow;
    } else if (v == "tiled" || v == "r8") {
      policy.mode = v == "r8" ? MatmulPolicy::r8 : MatmulPolicy::tiled;
    } else if (v == "tiled:32" || v == "tiled:64" || v == "tiled:128") {
      policy.mode = MatmulPolicy::tiled;
      policy.tile_rows = static_cast<uint32_t>(std::stoul(v.substr(6)));
    } else if (v == "r8:64" || v == "r8:128" || v == "r8:256") {
      policy.mode = MatmulPolicy::r8;
      policy.tile_rows = static_cast<uint32_t>(std::stoul(v.substr(3)));
    } else {
      throw std::invalid_argument("REDWING_GPU_QMATMUL=" + v +
                                  ": expected narrow, tiled, tiled:32, tiled:64, tiled:128, r8, "
                                  "r8:64, r8:128 or r8:256");
    }
  }
  info.matmul = policy;
}

bool Knockout::any() const { return barriers || std::ranges::any_of(kernels, std::identity{}); }

Knockout parse_knockout(const std::string& value) {
  Knockout out;
  for (std::string word : comma_words(value)) {
    if (word.empty()) continue;
    const bool keep = word[0] == '-';
    if (keep) word.erase(0, 1);
    if (word == "barriers" && !keep) {
      out.barriers = true;
    } else if (word == "all" && !keep) {
      out.kernels.fill(true);
    } else {
      size_t i = 0;
      while (i < std::size(kKernels) && word != kKernels[i].name) ++i;
      if (i == std::size(kKernels))
        throw std::invalid_argument("REDWING_GPU_KNOCKOUT: unknown word '" + word +
                                    "' (expected barriers, all, a kernel's name or -name)");
      out.kernels[i] = !keep;
    }
  }
  return out;
}

void choose_attention_split(DeviceInfo& info) {
  AttentionSplit split;
  if (info.software) {
    split.workgroups = 256;
    split.min_keys = 32;
  }
  const char* value = std::getenv("REDWING_GPU_ATTENTION");
  if (value && *value) {
    const std::string text = value;
    const auto refuse = [&] {
      return std::invalid_argument("REDWING_GPU_ATTENTION=" + text +
                                   ": expected workgroups,min_keys[,last|separate] "
                                   "(1-65536, 1-256)");
    };
    const std::vector<std::string> words = comma_words(text);
    const auto number = [&](const std::string& w, uint32_t low, uint32_t high) {
      const std::optional<uint32_t> n = setting_number(w);
      if (!n || *n < low || *n > high) throw refuse();
      return *n;
    };
    if (words.size() != 2 && words.size() != 3) throw refuse();
    split.workgroups = number(words[0], 1, 65536);
    split.min_keys = number(words[1], 1, 256);
    if (words.size() == 3) {
      if (words[2] != "last" && words[2] != "separate") throw refuse();
      split.merge_in_last_workgroup = words[2] == "last";
    }
  }
  if (const char* heads = std::getenv("REDWING_GPU_ATTENTION_HEADS"); heads && *heads) {
    const std::optional<uint32_t> n = setting_number(heads);
    if (!n || *n < 1 || *n > 4)
      throw std::invalid_argument(std::string("REDWING_GPU_ATTENTION_HEADS=") + heads +
                                  ": expected the query heads a decode attention workgroup "
                                  "scores together (1-4)");
    split.heads_per_workgroup = *n;
  }
  if (const char* tiles = std::getenv("REDWING_GPU_ATTENTION_TILES"); tiles && *tiles) {
    const std::optional<uint32_t> rows = setting_number(tiles);
    if (!rows)
      throw std::invalid_argument(std::string("REDWING_GPU_ATTENTION_TILES=") + tiles +
                                  ": expected the query rows from which prefill attention is "
                                  "tiled (0: never)");
    split.tiled_min_rows = *rows;
  }
  info.attention = split;
}

void choose_knockout(DeviceInfo& info) {
  const char* value = std::getenv("REDWING_GPU_KNOCKOUT");
  info.knockout = parse_knockout(value ? value : "");
}

namespace {

// A register-tiled kernel's block: rows x tokens outputs per thread, and the most tile rows plus
// tile tokens its shared memory holds (qmatmul_tiled.glsl: 5,120 / TILE_SLAB).
struct RegisterBlock {
  uint32_t rows, tokens, max_tile_sum;
  bool r8;
};
constexpr RegisterBlock kBlock4x4{4, 4, 160, false};      // qmatmul_tiled, moe_matmul_tiled
constexpr RegisterBlock kDenseBlock8{8, 8, 320, true};    // qmatmul_tiled_r8
constexpr RegisterBlock kGroupedBlock8{8, 4, 320, true};  // moe_matmul_tiled_r8

// Whether a tile of bm rows fits the block at `threads` threads: bm / block.rows threads along the
// rows (a power of two dividing the threads), at least one along the tokens, within the kernel's
// shared memory.
bool tile_fits(const RegisterBlock& block, uint32_t threads, uint32_t bm) {
  const uint32_t outputs = block.rows * block.tokens * threads;
  if (bm < block.rows || bm % block.rows != 0 || outputs % bm != 0) return false;
  const uint32_t along_rows = bm / block.rows;
  return (along_rows & (along_rows - 1)) == 0 && along_rows <= threads &&
         bm + outputs / bm <= block.max_tile_sum;
}

// The block's tile fitted to `tokens` (the policy's forced rows where they fit): the square one
// (the least power of two of rows not below the tokens), made taller and narrower while the
// tokens still fill it and it fits.
MatmulTile fitted_tile(const DeviceInfo& info, const RegisterBlock& block, int64_t tokens) {
  const uint32_t threads = info.workgroup_threads;  // 64, 128 or 256
  const uint32_t outputs = block.rows * block.tokens * threads;
  const auto tokens_of = [&](uint32_t bm) { return outputs / bm; };
  uint32_t bm = info.matmul.tile_rows;
  if (bm == 0 || !tile_fits(block, threads, bm)) {
    bm = block.rows;
    while (tokens_of(bm) > bm) bm *= 2;
    while (tile_fits(block, threads, bm * 2) && tokens <= static_cast<int64_t>(tokens_of(bm * 2)))
      bm *= 2;
  }
  return MatmulTile{true, block.r8, bm, tokens_of(bm)};
}

uint64_t tile_count(const MatmulTile& tile, int64_t rows, int64_t tokens) {
  return static_cast<uint64_t>((rows + tile.rows - 1) / tile.rows) *
         static_cast<uint64_t>((tokens + tile.tokens - 1) / tile.tokens);
}

constexpr MatmulTile kNarrowTile{false, false, kNarrowTileRows, kNarrowTileTokens};

// The kernel REDWING_GPU_QMATMUL forces (`wide`: the 8-row blocks of this product), nothing in
// automatic mode.
std::optional<MatmulTile> forced_tile(const DeviceInfo& info, const RegisterBlock& wide,
                                      int64_t tokens) {
  switch (info.matmul.mode) {
    case MatmulPolicy::narrow:
      return kNarrowTile;
    case MatmulPolicy::tiled:
      return fitted_tile(info, kBlock4x4, tokens);
    case MatmulPolicy::r8:
      return fitted_tile(info, wide, tokens);
    case MatmulPolicy::automatic:
      break;
  }
  return std::nullopt;
}

}  // namespace

MatmulTile choose_matmul_tile(const DeviceInfo& info, int64_t rows, int64_t tokens) {
  if (const auto forced = forced_tile(info, kDenseBlock8, tokens)) return *forced;
  if (info.software) {
    const MatmulTile wide = fitted_tile(info, kDenseBlock8, tokens);
    return tokens >= static_cast<int64_t>(wide.tokens) ? wide
                                                       : fitted_tile(info, kBlock4x4, tokens);
  }
  const MatmulTile tiled = fitted_tile(info, kBlock4x4, tokens);
  return tile_count(tiled, rows, tokens) >= kMinTiledWorkgroups ? tiled : kNarrowTile;
}

MatmulTile choose_grouped_matmul_tile(const DeviceInfo& info, int64_t rows_per_expert) {
  if (const auto forced = forced_tile(info, kGroupedBlock8, rows_per_expert)) return *forced;
  const MatmulTile tiled = fitted_tile(info, kBlock4x4, rows_per_expert);
  if (info.software) {
    const MatmulTile wide = fitted_tile(info, kGroupedBlock8, rows_per_expert);
    return rows_per_expert >= static_cast<int64_t>(wide.tokens) ? wide : tiled;
  }
  return rows_per_expert >= static_cast<int64_t>(tiled.tokens) ? tiled : kNarrowTile;
}

const char* kernel_name(Kernel k) {
  const auto i = static_cast<size_t>(k);
  return i < std::size(kKernels) ? kKernels[i].name : "?";
}

const char* kernel_source_name(Kernel k) {
  const auto i = static_cast<size_t>(k);
  return i < std::size(kKernels) ? kKernels[i].source : "?";
}

std::span<const uint32_t> kernel_spirv(Kernel k) {
  const auto i = static_cast<size_t>(k);
  if (i >= std::size(kKernels)) throw std::logic_error("no such kernel");
  return kKernels[i].spirv;
}

}  // namespace redwing::gpu
