// The GPU device layer: the little that differs between GPU APIs. The GPU backend
// (gpu_backend.cpp) implements every op of backend.h once over this interface; a device only
// provides memory, the compiled kernels, ordered command recording and synchronization.
// Vulkan (vulkan/) is the first implementation; a Metal device would implement the same class
// over the same kernels translated by SPIRV-Cross (docs/gpu.md).
//
// Commands are recorded, not run: write(), fill_zero(), copy() and dispatch() append to the
// current batch in call order, and nothing runs until flush() (or read(), which flushes). The
// device does not track hazards: the caller inserts barrier() between commands where a later
// one reads or writes memory an earlier one wrote (or writes memory an earlier one read).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace redwing::gpu {

// The compute kernels (gpu-kernels/<name>.comp). Every kernel uses the bindings of set 0 in
// order and one block of push constants (at most kMaxPushBytes).
enum class Kernel : int {
  qmatvec,
  qmatmul,
  embed,
  rms_norm,
  elementwise,
  rope,
  gather_rows,
  scatter_add_rows,
  kv_store,
  attention_partial,
  attention_combine,
  route,
  moe_matvec,
  moe_combine,
  penalize,
  topk_partial,
  topk_merge,
  norm_rope,
  // The routed experts' down product (moe_matvec_down.comp: moe_matvec's bank and push
  // constants, x read from memory in teams of lanes; its shape is DeviceInfo::matvec_down).
  moe_matvec_down,
  ffn_tail,
  // The register-tiled prefill product (qmatmul_tiled.comp): BM x BN tiles, 4 x 4 per thread;
  // qmatmul is the narrow one (16 rows x 8 tokens), for products with few tiles.
  qmatmul_tiled,
  // The routed experts' grouped prefill product (moe_matmul.comp): qmatmul's 16 x 8 tiles over a
  // table of (expert, first row, rows) tiles of the expert-grouped input, the bank in one binding;
  // moe_matmul_tiled the same over qmatmul_tiled's register tiles (choose_grouped_matmul_tile).
  moe_matmul,
  moe_matmul_tiled,
  // The k norm and RoPE, the v norm and the cache store of a layer in one pass
  // (kv_norm_store.comp: norm_rope's, rms_norm's and kv_store's arithmetic).
  kv_norm_store,
  // A MoE layer's router product whose last workgroup also routes (router.comp: qmatvec's and
  // route's arithmetic), where DeviceInfo::workgroups_see_writes.
  router,
  // Attention's output product whose last workgroup adds its post-norm to the residual and
  // writes the feed-forward's two norms (qmatvec_norms.comp), where workgroups_see_writes.
  qmatvec_norms,
  // One of attention's q/k/v products whose last workgroup per head norms and rotates the head
  // in place or stores it in the KV cache (qmatvec_heads.comp), where workgroups_see_writes.
  qmatvec_heads,
  // Prefill attention over tiles of query rows sharing each block of keys (attention_tiled.comp).
  attention_tiled,
  // The register-tiled prefill products with 8 rows per thread (qmatmul_tiled_r8.comp: 8 x 8
  // outputs; moe_matmul_tiled_r8.comp: 8 x 4): a CPU device's choice where the tokens fill their
  // tiles (choose_matmul_tile, choose_grouped_matmul_tile).
  qmatmul_tiled_r8,
  moe_matmul_tiled_r8,
  // qmatvec's looping grid with 4 blocks of rows at once (qmatvec_wide.comp), for products of
  // at least kWideBlocksPerGroup blocks a workgroup where the device's matvec_loop_rows is less.
  qmatvec_wide,
  kv_prefetch,
  // One of a decode row's q/k/v products whose workgroups each compute the previous layer's
  // feed-forward end (ffn_tail's arithmetic) and stage its h as their input (qmatvec_tail.comp),
  // where workgroups_see_writes and REDWING_GPU_FFN_TAIL=next.
  qmatvec_tail,
  count,
};
// The name a profile shows.
const char* kernel_name(Kernel k);
// The kernel's source, gpu-kernels/<name>.comp (the function name in the Metal library).
const char* kernel_source_name(Kernel k);
// Storage buffers a kernel binds (qmatvec_tail.comp takes 15; Metal gives a kernel 31 buffers).
constexpr int kMaxBindings = 16;
constexpr size_t kMaxPushBytes = 128;

// The shape of the experts' down product (gpu-kernels/matvec_teams.glsl's specialization
// constants 1 to 4): a workgroup is threads / lanes teams of `lanes` threads, each team computing
// rows_per_team rows with its lanes splitting the columns. The defaults are the GLSL's (what
// Metal runs: its device sets no function constants): the shape measured best on the H200.
struct MatvecShape {
  uint32_t rows_per_team = 4;    // MV_RPT, 1 to 4
  uint32_t lanes = 32;           // MV_LANES, a power of two up to the workgroup's threads
  bool subgroup_reduce = false;  // MV_SUBGROUP: the team's sums by subgroupAdd
  uint32_t unroll = 1;           // MV_UNROLL: words per thread whose loads go out together
  uint32_t rows_per_group(uint32_t threads) const { return threads / lanes * rows_per_team; }
};

// How the prefill products (more than 4 tokens) pick their kernel: REDWING_GPU_QMATMUL =
// "narrow" (qmatmul.comp always), "tiled" (the 4 x 4 register blocks of qmatmul_tiled.comp always,
// the tile fitted to the tokens), "tiled:32|64|128" (that many rows per tile), "r8" (the 8-row
// blocks of qmatmul_tiled_r8.comp always) or "r8:64|128|256"; unset: automatic
// (choose_matmul_tile). A forced row count that the block or the device's threads cannot take
// (the tile's rows plus tokens above the kernel's shared memory) is fitted instead.
struct MatmulPolicy {
  enum Mode { automatic, narrow, tiled, r8 } mode = automatic;
  uint32_t tile_rows = 0;  // with tiled or r8: the forced BM, 0 to fit it to the tokens
};

// How decode attention splits a row's keys (attention_partial.comp, then an exact combine): about
// `workgroups` workgroups in all (rows x heads x splits), each split at least `min_keys` keys
// and at most the kernel's 256. The defaults are a GPU's: on the H200 1,024 x 16 decoded 5-7%
// faster than 256 x 32 (docs/gpu.md, "Tenth round"); with two query heads a workgroup, 768 x 16
// took the H100's sliding attention over 1,024 keys from 42 to 29 us and over 4,096 from 91 to
// 62, a full-attention layer's over 4,096 from 126 to 102, level over 512 (512 and 384 were
// slower: "Twenty-sixth round"); a CPU device (lavapipe) keeps 256 x 32,
// since every workgroup there costs a core's time. The splits are merged by the last workgroup
// of each (row, head) in the same dispatch (an arrival counter in device memory: docs/gpu.md,
// "Eleventh round"), or by attention_combine.comp in a second dispatch where the device layer
// does not promise that one workgroup sees another's writes within a dispatch (Metal).
// REDWING_GPU_ATTENTION = "workgroups,min_keys[,last|separate]" forces them (A/B runs).
struct AttentionSplit {
  uint32_t workgroups = 768;
  uint32_t min_keys = 16;
  bool merge_in_last_workgroup = true;
  // Query heads of one KV head that a decode attention workgroup scores from one read of each
  // key and value (the backend takes the most up to this that divide the group and fit the
  // kernel); REDWING_GPU_ATTENTION_HEADS. 4 (2 on the 26B-A4B's layers) against 1 on the H100:
  // 512 keys 34 -> 26 us, decode after 512 tokens +8%; lavapipe: 512 keys 30 -> 16 ms
  // (docs/gpu.md, "Twenty-fifth round").
  uint32_t heads_per_workgroup = 4;
  // Calls with at least this many query rows take the tiled prefill kernel
  // (attention_tiled.comp), fewer the split one; 0: never tiled. REDWING_GPU_ATTENTION_TILES.
  uint32_t tiled_min_rows = 16;
};

// A leave-one-out diagnostic for real GPUs (REDWING_GPU_KNOCKOUT, docs/gpu.md "Knockout runs"):
// work the device drops from what it records, so that a run's time without it says what it costs
// on the GPU's critical path. Per-dispatch timestamps cannot say that: each pair waits for the
// work before it, so they serialize what they time. The results of such a run are wrong by
// design (the engine says so on stderr); it is for measurements only.
struct Knockout {
  bool barriers = false;  // no barrier at all (races: wrong numbers, but their cost shows)
  std::array<bool, static_cast<size_t>(Kernel::count)> kernels{};  // dispatches dropped
  bool drops(Kernel k) const { return kernels[static_cast<size_t>(k)]; }
  bool any() const;
};
// A comma-separated list: "barriers", a kernel's name (kernel_name), "all" (every kernel), or
// "-name" to keep one that an earlier "all" dropped; empty: nothing. Throws
// std::invalid_argument on an unknown word.
Knockout parse_knockout(const std::string& value);

struct DeviceInfo {
  std::string api;            // "vulkan"
  std::string name;           // e.g. "NVIDIA H200", "llvmpipe (LLVM 15.0.6, 256 bits)"
  bool discrete = false;      // a discrete GPU, or an integrated one with its own memory (Apple)
  bool software = false;      // a CPU implementation (lavapipe): never chosen automatically
  uint64_t memory_bytes = 0;  // the largest device-local heap
  uint64_t max_binding_bytes = 0;  // the most one storage binding may cover
  uint64_t binding_alignment = 0;  // required alignment of a binding's offset
  // Threads per workgroup of the kernels whose shape is a specialization constant (constant_id
  // 0: the products, norms, attention and sampling passes; each kernel derives its loop strides
  // from it). Real GPUs take kGpuWorkgroupThreads; a CPU device (lavapipe) runs every idle lane
  // and every barrier of a workgroup on one core, so it takes kCpuWorkgroupThreads.
  uint32_t workgroup_threads = 256;
  // Subgroups (0 and false where the API does not report them): the size the device runs
  // compute shaders with, and whether it has arithmetic subgroup operations there.
  uint32_t subgroup_size = 0;
  bool subgroup_arithmetic = false;
  // The experts' down product's shape (Kernel::moe_matvec_down; choose_matvec_shapes).
  MatvecShape matvec_down;
  // The other decode products (matvec.glsl: qmatvec, moe_matvec) sum a row's lanes
  // (workgroup_threads / 8) by subgroupAdd: where they are one subgroup with arithmetic
  // operations (choose_matvec_shapes; specialization constant 5).
  bool matvec_subgroup_reduce = false;
  // The decode products' workgroups (qmatvec per token; the experts' gate/up, moe_matvec, shared
  // among a token's slots) where a product has more blocks of 8 rows than that (0: one workgroup
  // per block): each then stages x once and loops over blocks (qmatvec.glsl's qmatvec_blocks), for
  // rows of at most 4,096 columns. Staging x costs a block as much traffic as its weights on a
  // 2,816-column row; kGpuMatvecLoopGroups / kCpuMatvecLoopGroups (docs/gpu.md, "Eighteenth
  // round").
  uint32_t matvec_loop_groups = 0;
  // Blocks of 8 rows a workgroup of that looping grid computes at once (1, 2 or 4;
  // specialization constant 6): with more, each thread reads x from shared memory once for
  // that many rows and has their weight loads in flight together (qmatvec.glsl).
  uint32_t matvec_loop_rows = 1;
  // Which kernel the prefill products take (choose_matmul_tile).
  MatmulPolicy matmul;
  // Decode attention's splits and where prefill's tiles start (choose_attention_split).
  AttentionSplit attention;
  // Whether the last workgroup of a dispatch to arrive (an atomic counter) may read what the
  // other workgroups wrote in it: the products' epilogues (router.comp, qmatvec_norms.comp) rely
  // on it. Vulkan promises it for coherent buffers; Metal runs the separate dispatches (not
  // measured there).
  bool workgroups_see_writes = true;
  // What the device drops (REDWING_GPU_KNOCKOUT; nothing unless set).
  Knockout knockout;
};
// The decode products' shapes, from info's workgroup_threads and subgroup fields. The experts'
// down product, info.matvec_down: 4 rows x 32 lanes x 1 word on a GPU (the H200's best,
// docs/gpu.md's seventh and twenty-first rounds), 2 x 8 x 2 on a CPU device (one lavapipe subgroup
// per team); subgroupAdd where the subgroup size divides the lanes and the workgroup.
// REDWING_GPU_MATVEC_DOWN = "rows,lanes,unroll" forces a shape (A/B runs, tests; lanes is capped at
// the workgroup's threads). info.matvec_subgroup_reduce where a row of the other decode products is
// one subgroup. REDWING_GPU_SUBGROUP = "0" (shared-memory reductions everywhere), "down"
// (subgroupAdd in this product only) or "1" (the default: wherever it fits).
// info.matvec_loop_groups: REDWING_GPU_MATVEC_GROUPS (0 to 65,535) when set, else
// kCpuMatvecLoopGroups on a CPU device and kGpuMatvecLoopGroups on a GPU;
// info.matvec_loop_rows: REDWING_GPU_MATVEC_LOOP_ROWS (1, 2 or 4) when set, else
// kCpuMatvecLoopRows on a CPU device and kGpuMatvecLoopRows on a GPU. Throws std::invalid_argument
// on a malformed value.
void choose_matvec_shapes(DeviceInfo& info);
// Reads REDWING_GPU_QMATMUL into info.matmul; throws std::invalid_argument on a malformed value.
void choose_matmul_policy(DeviceInfo& info);
// Reads REDWING_GPU_KNOCKOUT into info.knockout (parse_knockout).
void choose_knockout(DeviceInfo& info);
// Reads REDWING_GPU_ATTENTION into info.attention ("workgroups,min_keys[,last|separate]":
// workgroups 1 to 65,536, min_keys 1 to 256, who merges the splits); throws
// std::invalid_argument on a malformed value.
void choose_attention_split(DeviceInfo& info);

// A prefill product's kernel and tile: tiled, a register-tiled kernel with `rows` x `tokens`
// tiles (its push constant tile_rows = rows), with 8 rows per thread where r8
// (qmatmul_tiled_r8 / moe_matmul_tiled_r8) and 4 x 4 otherwise (qmatmul_tiled /
// moe_matmul_tiled); else qmatmul's 16 x 8.
struct MatmulTile {
  bool tiled = false;
  bool r8 = false;
  uint32_t rows = 16, tokens = 8;
};
constexpr uint32_t kNarrowTileRows = 16;   // qmatmul.comp's TILE_ROWS
constexpr uint32_t kNarrowTileTokens = 8;  // qmatmul.comp's TILE_TOKENS
// On a GPU, the fewest tiled workgroups for which the register-tiled kernel is taken in
// automatic mode: below it (an expert's product over a few tokens) the narrow kernel's many small
// workgroups keep more of the GPU busy (docs/gpu.md: a 64 x 32 tile of the first round ran 2.7x
// slower on the H200 for ~32-token expert products). A CPU device (lavapipe) always takes a
// register-tiled kernel.
constexpr uint64_t kMinTiledWorkgroups = 64;
// The kernel and tile for a product of `rows` weight rows over `tokens` tokens (> 4) on this
// device. A tile is fitted to the tokens: the square one (for 4 x 4 blocks 64 x 64 at 256
// threads, 32 x 32 at 64; for 8 x 8 128 x 128 and 64 x 64), made taller and narrower while the
// tokens still fill it, within the kernel's shared memory. A GPU takes the 4 x 4 blocks where
// their tiles fill it, else the narrow kernel: on the H200 the 8 x 8 blocks were slower (their 64
// accumulators leave one workgroup per multiprocessor; docs/gpu.md, "Seventeenth round"). A CPU
// device takes the 8 x 8 blocks where the tokens fill a column of their tiles (every shared
// memory read there is a real load; through lavapipe they cut the products' time by 15-40%), else
// the 4 x 4 ones. REDWING_GPU_QMATMUL forces a kernel (MatmulPolicy).
MatmulTile choose_matmul_tile(const DeviceInfo& info, int64_t rows, int64_t tokens);
// The tile of the routed experts' grouped prefill product (moe_matmul / moe_matmul_tiled /
// moe_matmul_tiled_r8), whose experts have rows_per_expert grouped rows on average. A GPU: the
// 4 x 4 blocks' tile fitted to that count where its tiles are full on average (every expert's
// tiles are one dispatch, so there are always enough workgroups), else the narrow 16 x 8 one (at
// chunk 128 an expert has ~8 rows: a 128 x 32 tile would compute 3/4 zeros). A CPU device: the
// 8 x 4 blocks' fitted tile where it is full on average, else the 4 x 4 blocks'.
// REDWING_GPU_QMATMUL applies as to choose_matmul_tile.
MatmulTile choose_grouped_matmul_tile(const DeviceInfo& info, int64_t rows_per_expert);
// The decode products' looping grid (DeviceInfo::matvec_loop_groups). On the H200 (132
// multiprocessors) 264 workgroups took the output head from 511 to 385 us and a MoE layer's
// experts from 49 to 43 us (132, 396, 528, 1,056 and 2,112 were slower), decode after 512 tokens
// 1.046x; through lavapipe on 2 cores 4 to 64 took q's product from 22 to 13 ms.
constexpr uint32_t kGpuMatvecLoopGroups = 264;
constexpr uint32_t kCpuMatvecLoopGroups = 16;
// DeviceInfo::matvec_loop_rows' defaults (docs/gpu.md, "Twenty-second round"): on the H200 2
// blocks at once took decode after 512 tokens from 158.1 to 163.0 tok/s (4 gave 162.2: the head
// faster, the products of a few blocks per workgroup slower); through lavapipe on 2 cores 4 took
// the dense gate/up product from 8.8 to 4.5 ms and 16,384 rows from 33 to 17 ms. The GPU's is
// also the kernels' own default (matvec.glsl), which Metal runs.
constexpr uint32_t kGpuMatvecLoopRows = 2;
// Products of at least this many blocks per looping workgroup take Kernel::qmatvec_wide (4
// blocks at once) where the device's matvec_loop_rows is less: on the H100 4 blocks took the
// head (124 blocks a workgroup) from 305 to 270 us, left 16,384 rows (8) level and made q, o and
// the dense MLP (1-2) 1-2 us slower (docs/gpu.md, "Twenty-sixth round").
constexpr uint32_t kWideBlocksPerGroup = 16;
constexpr uint32_t kCpuMatvecLoopRows = 4;
constexpr uint32_t kGpuWorkgroupThreads = 256;
constexpr uint32_t kCpuWorkgroupThreads = 64;
// The workgroup_threads a device of this kind uses: REDWING_GPU_WORKGROUP (64, 128 or 256)
// when set (tests and benchmarks force either shape with it), else by the device type.
uint32_t choose_workgroup_threads(bool software);
// Whether n is a shape the kernels accept (a power of two from 64 to 256: qmatmul stages a
// fixed 1,024 vec4s over at most 16 per thread; the shared arrays hold 256).
bool valid_workgroup_threads(uint32_t n);

// Device memory, zero-initialized.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual size_t size_bytes() const = 0;
};

// A storage-buffer binding: `bytes` of `buffer` from `offset` (aligned to
// DeviceInfo::binding_alignment, at most max_binding_bytes).
struct Binding {
  const DeviceBuffer* buffer = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() const = 0;

  virtual std::unique_ptr<DeviceBuffer> create_buffer(size_t bytes) = 0;
  // Device memory currently allocated through create_buffer (for the memory report).
  virtual uint64_t allocated_bytes() const = 0;

  // Records a copy of host data (taken now) into dst; from inside a range given to map_host(),
  // a copy read from there when it runs (see map_host).
  virtual void write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) = 0;
  // Host memory the device may read in place (Vulkan: VK_EXT_external_memory_host): a later
  // write() whose source lies inside [p, p + bytes) records a copy straight from it, with no
  // staging copy on the host; the bytes are read when the copy runs, at the latest before the
  // flush that follows returns, so the caller keeps them unchanged until then. False where the
  // device cannot (no such extension, a range it does not accept): writes then stage as before.
  // The range stays mapped until unmap_host(p), which waits for the work that may read it; call it
  // before the memory is freed.
  virtual bool map_host(const void* p, size_t bytes) { return false; }
  virtual void unmap_host(const void* p) {}
  // Flushes the recorded commands, waits for them, then copies device data to the host.
  virtual void read(const DeviceBuffer& src, size_t offset, void* dst, size_t bytes) = 0;
  // Records a dispatch of groups_x * groups_y * groups_z workgroups.
  virtual void dispatch(Kernel kernel, std::span<const Binding> bindings, const void* push,
                        size_t push_bytes, uint32_t groups_x, uint32_t groups_y,
                        uint32_t groups_z) = 0;
  // Records a full memory barrier between what was recorded before and what comes after.
  virtual void barrier() = 0;
  // Submits everything recorded and waits for it to finish.
  virtual void flush() = 0;
  // Starts what is recorded so far without waiting for it (flush() still waits for it); the
  // default leaves it for the next flush.
  virtual void submit() {}
  // Submissions since the device was created (for tests and benchmarks).
  virtual uint64_t submissions() const = 0;
  // Starts building every kernel's pipeline on a thread of its own, so that the driver's
  // compilation (seconds with a cold shader cache: the first run after an install or an update)
  // overlaps what the caller does next, a model's weight upload, instead of landing in the first
  // prompt's and tokens' dispatches. The first dispatch after it waits for it. The default, and a
  // kernel the thread could not build, builds at first use.
  virtual void prepare_kernels() {}

  // Host time the device layer spent since it was created (for profiles): recording commands
  // (dispatch, barrier, write, read's copy), handing command buffers to the GPU, and waiting for
  // it. A host wait is time the host cannot record; recording while the GPU is idle (between a
  // read and the next submission) is time on the critical path. Zero where not measured.
  struct HostTimes {
    double record_ms = 0, submit_ms = 0, wait_ms = 0;
    uint64_t waits = 0;
  };
  virtual HostTimes host_times() const { return {}; }

  // Per-kernel GPU time, when enabled: each dispatch is bracketed by timestamps and the totals
  // accumulate at every flush.
  virtual void enable_timestamps(bool on) = 0;
  struct KernelTime {
    uint64_t dispatches = 0;
    double ms = 0;
  };
  virtual std::vector<KernelTime> kernel_times() const = 0;  // indexed by Kernel
};

// The Vulkan devices this machine has (empty when there is no Vulkan loader or driver).
std::vector<DeviceInfo> list_vulkan_devices();
// Opens Vulkan device `index` of list_vulkan_devices(); throws std::runtime_error.
// workgroup_threads 0: choose_workgroup_threads() for the device; else that shape (tests).
std::unique_ptr<Device> open_vulkan_device(int index, uint32_t workgroup_threads = 0);
// How many VkInstances this process has made: one at most once any succeeded (enumeration and
// every device share it; vulkan_device.cpp says why).
int vulkan_instances_created();

// The embedded SPIR-V of a kernel (generated at build time from gpu-kernels/).
std::span<const uint32_t> kernel_spirv(Kernel k);

}  // namespace redwing::gpu
