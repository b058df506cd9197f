// The SSD-streaming expert source: a small cache of expert slots per MoE layer, filled with
// positioned reads from the expert files (docs/format.md: one aligned read of `stride` bytes
// per expert).
//
// Per layer there are N slots, allocated once as aligned buffers. A request pins the experts
// already in slots (hits) and reads the missing ones into free or evicted slots on a bounded
// pool of I/O threads. Eviction takes an empty slot first, else (LRFU, the default) the expert
// with the smallest combined recency-frequency value: every past use counts 2^(-age / h), age in
// requests of that layer, half-life h = lrfu_half_life (Lee et al., IEEE Trans. Computers 2001;
// on the demo model's real routing it matches LFU on running text and beats it by about 3 points
// of hit rate on chats, `npm run bench -- cache-policy`), or (LFU) the expert with the fewest
// uses over the whole run, ties to the least recently used, or (LRU) the least recently used.
// Pinned slots are never evicted. With fewer slots than experts in a request, the experts are
// processed in waves: a slot is reused as soon as its expert has been computed. Reads bypass the
// page cache (platform::ReadFile::open_uncached) unless turned off, so the memory the cache is
// given is the memory it uses.
//
// A backend with its own expert slots (GPU) takes the experts through for_each_slot. With as
// many backend slots as host slots, its slots mirror the host's (same index, same expert). With
// fewer (device_slots < slots: the RAM tier), the store also keeps the record of the backend's
// slots, replaced by the same policy: a request's experts already in a backend slot (GPU hits)
// are delivered first and cost nothing; the others come from a host slot (RAM hits) or a read
// (misses) and are delivered with the backend slot to copy them into, one the request does not
// use when there is one. A GPU hit touches no host slot, so the two tiers together hold up to
// slots + device_slots experts per layer.
//
// Hybrid experts (device_copies >= 0, the RAM tier only): the GPU's misses are computed by the
// host where they are, so a RAM hit or a miss is delivered with its data and backend slot -1
// (nothing to copy); only the device_copies of them that the policy ranks highest (evict_first:
// the ones it would evict last) may also be given a backend slot to copy them into, after the
// host has used them, so the backend's slots still learn the hot experts: each such copy goes to
// the slot pick_device_slot names, and only where the slot is empty or the policy would evict
// its expert before the newcomer (the one policy decides both which experts and whether).
// Among the experts ready at once, those chosen for a copy are delivered last, so a taker that
// computes the ready ones together (for_each_slot_batched) computes them all before the copy.
// With the misses split (device_computes_copies), the backend computes its copies instead of the
// host (SlotDelivery::host_computes false): every one of the request's device_copies copies goes
// to a backend slot that none of the request's GPU hits uses, admission or not, and they are
// delivered first, so the link carries them while the host computes the rest.
//
// Every delivery of for_each_slot_batched says whether its taker may hold on to it (`more`):
// only when no expert of the request still waits for a host slot (so none is reused before the
// request ends; the slot stays pinned until then) and another expert is ready to follow.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "models/expert_source.h"
#include "runtime/defaults.h"

namespace redwing {

enum class EvictionPolicy { lrfu, lfu, lru };
// "lrfu" | "lfu" | "lru"; std::invalid_argument otherwise
EvictionPolicy parse_eviction_policy(const std::string& s);

struct ExpertStoreOptions {
  int slots = defaults::kExpertCacheSlots;  // per MoE layer; any N >= 1 works (N < top_k processes
                                            // in waves)
  // A backend's own slots per MoE layer, numbered by for_each_slot: 0 (or `slots`): as many as
  // the host's, mirroring them; 1..slots-1: the RAM tier above. At most `slots`.
  int device_slots = 0;
  EvictionPolicy policy = EvictionPolicy::lrfu;
  double lrfu_half_life = 16;  // LRFU: requests of a layer after which a use counts half
  int io_threads = defaults::kExpertIoThreads;  // reads in flight at most
  bool direct_io = true;  // bypass the page cache where the filesystem allows it
  int read_attempts = 3;  // a failed read is retried this many times in all before reporting
  // Under the RAM tier: -1 copies every expert that is not a GPU hit into a backend slot (the
  // backend computes every expert); N >= 0 makes the host compute them (hybrid experts) and
  // copies at most N of them per layer request into backend slots (0: none).
  int device_copies = -1;
  // Hybrid experts with the misses split between the link and the host's memory: the request's
  // device_copies copies (the highest-ranked non-GPU hits) all go to backend slots, whatever the
  // policy would evict there, and the backend computes them instead of the host; they are
  // delivered before the host's, so their copies and products run beside the host's products.
  bool device_computes_copies = false;
  // An expert is read in pieces of at most this many bytes (multiples of 16 KiB), so a layer
  // with few misses still keeps the I/O threads busy; 0: one read per expert.
  uint64_t read_piece_bytes = defaults::kExpertReadPieceBytes;
};

class ExpertStore final : public ExpertSource {
 public:
  // Opens every expert file and checks its size; throws FormatError / platform::FileError
  // naming the file.
  ExpertStore(const ModelDir& dir, const ExpertStoreOptions& options);
  ~ExpertStore() override;
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  // acquire/release: pins every listed expert at once, so it needs slots >= experts.size().
  std::vector<ExpertMatrices> acquire(int layer, std::span<const int32_t> experts) override;
  void release(int layer) override;
  void prefetch(int layer, std::span<const int32_t> experts) override;
  void for_each(int layer, std::span<const int32_t> experts,
                const std::function<void(size_t, const ExpertMatrices&)>& fn) override;
  ExpertStats stats() const override;
  int slots_per_layer() const override { return tiered() ? options_.device_slots : options_.slots; }
  void for_each_slot(int layer, std::span<const int32_t> experts,
                     const std::function<void(size_t, int, const ExpertMatrices&)>& fn) override;
  void for_each_slot_batched(int layer, std::span<const int32_t> experts,
                             const std::function<void(const SlotDelivery&)>& fn) override;

  const ExpertStoreOptions& options() const { return options_; }
  // Whether reads bypass the page cache (false if asked not to or the filesystem refused).
  bool direct_io() const { return direct_; }
  uint64_t slot_bytes() const { return slot_bytes_; }  // memory held by all slots
  // Each MoE layer's host slots as one block (aligned to kHostBlockAlignment, its size a
  // multiple of it), for a GPU backend to map so that copies into its slots read them in place
  // (Backend::map_host_memory). A layer's slots are written only while a request or prefetch of
  // that layer runs, and (with slots_hold_every_expert) never refilled within a request, so a
  // copy recorded from them during a request reads the bytes it was recorded for as long as it
  // runs before the layer's next request (the engine waits for the GPU at every layer's
  // routing).
  std::vector<std::span<const std::byte>> host_blocks() const;
  // Whether no request can reuse a host slot before it ends: every layer has a slot for each of
  // its experts (otherwise a request needing more experts than slots refills a slot within the
  // request, while copies recorded from it may not have run: its blocks must not be mapped).
  bool slots_hold_every_expert() const;
  static constexpr size_t kHostBlockAlignment = 65536;
  // Whether the backend's slots are fewer than the host's (the RAM tier).
  bool tiered() const {
    return options_.device_slots > 0 && options_.device_slots < options_.slots;
  }
  // Whether the GPU's misses are computed by the host (hybrid experts: the RAM tier with
  // device_copies >= 0).
  bool hybrid() const { return tiered() && options_.device_copies >= 0; }

 private:
  enum class SlotState { empty, loading, ready, failed };
  struct Slot {
    int expert = -1;
    SlotState state = SlotState::empty;
    int pins = 0;
    uint64_t last_use = 0;
    int pieces_left = 0;        // reads of this slot still running
    bool delivered = false;     // handed to for_each_slot since it was read (a mirroring backend
                                // holds a copy)
    std::string error;          // why the last read failed
    uint64_t read_for = 0;      // the layer request that queued the last read (Layer::requests)
    std::byte* data = nullptr;  // the slot's bytes, inside its layer's block
  };
  // A backend slot of the RAM tier: what the backend's copy holds (set once a delivery into it
  // returned, so a failed copy leaves it empty).
  struct DeviceSlot {
    int expert = -1;
    uint64_t last_use = 0;
    uint64_t request = 0;  // the layer request that last delivered into it
  };
  // Who takes a request's experts: for_each/acquire (the CPU: host slots only), for_each_slot
  // with backend slots mirroring the host's, or for_each_slot over the RAM tier.
  enum class Taker { host, mirror, tiered };
  struct Layer {
    ExpertLayerInfo info;
    platform::ReadFile file;
    // Every host slot of the layer in one block (slot i at i * slot_stride), so that a GPU
    // backend can map the layer's slots at once (host_blocks).
    platform::AlignedBytes block;
    size_t block_bytes = 0;
    std::vector<Slot> slots;
    std::vector<uint64_t> uses;  // per expert, over the whole run (LFU)
    std::vector<double> crf;     // per expert: LRFU value as of request crf_at (LRFU)
    std::vector<uint64_t> crf_at;
    uint64_t requests = 0;         // requests of this layer so far (LRFU's clock)
    std::map<int, int> where;      // expert -> slot holding it (loading or ready)
    std::vector<int32_t> active;   // the experts of the current request
    std::deque<size_t> waiting;    // indices into `active` that have no slot yet
    std::vector<int> active_slot;  // per index of `active`: its slot, or -1
    bool announced = false;        // prefetch() ran for `active`
    // The RAM tier (tiered() only): the backend's slots, the expert -> backend slot map, and per
    // index of `active` the backend slot that already held it at the request's start, or -1.
    std::vector<DeviceSlot> device;
    std::map<int, int> on_device;
    std::vector<int> active_device;
    // Hybrid experts: per index of `active`, whether it goes to a backend slot after the host
    // computed it (the request's device_copies highest-ranked non-GPU hits).
    std::vector<bool> active_copy;
  };
  struct ReadJob {
    int layer;
    int slot;
    int expert;
    uint64_t begin, size;  // the piece, relative to the expert's blob
  };

  Layer& layer_at(int layer);
  // Starts a request: counts uses, pins hits, queues misses; with `tiered`, experts in a
  // backend slot are GPU hits (nothing pinned or read). Requires the lock.
  void begin(Layer& l, int layer, std::span<const int32_t> experts, bool tiered);
  // Gives queued misses free slots and submits their reads. Requires the lock.
  void assign_slots(Layer& l, int layer);
  // Queues the reads that fill slot s with its expert. Requires the lock.
  void queue_read(Layer& l, int layer, int s);
  // A slot of the current request whose read failed: false if that read was queued by this
  // request (the failure is this request's); true if it was queued by an earlier, abandoned
  // request, in which case it is read again for this one. Requires the lock.
  bool retry_stale_failure(Layer& l, int layer, size_t k);
  // Whether `experts` is the request prefetch() started, as the taker (tiered or not) needs it.
  bool announced(const Layer& l, std::span<const int32_t> experts, bool tiered) const;
  // The policy: whether expert a (last used at tick a_use) goes before expert b.
  bool evict_first(const Layer& l, int a, uint64_t a_use, int b, uint64_t b_use) const;
  int pick_victim(const Layer& l) const;       // a host slot, or -1 when all are pinned
  int pick_device_slot(const Layer& l) const;  // a backend slot to refill (RAM tier)
  // Hybrid experts: marks in active_copy the request's non-GPU hits to copy (at most
  // device_copies, and never more than the backend has slots), ranked by evict_first.
  void choose_copies(Layer& l);
  double crf_now(const Layer& l, int expert) const;  // LRFU value at the current request
  ExpertMatrices matrices(const Layer& l, const Slot& s) const;
  void deliver(int layer, std::span<const int32_t> experts, Taker taker,
               const std::function<void(const SlotDelivery&)>& fn);
  void io_main();
  void read_slot(const ReadJob& job);

  ExpertStoreOptions options_;
  bool direct_ = false;
  uint64_t slot_bytes_ = 0;
  std::map<int, Layer> layers_;

  mutable std::mutex mu_;
  std::condition_variable done_cv_;  // a read finished
  std::condition_variable job_cv_;   // a read was queued, or stopping
  std::deque<ReadJob> jobs_;
  int in_flight_ = 0;  // reads queued or running
  bool stopping_ = false;
  uint64_t tick_ = 0;
  ExpertStats stats_;
  std::vector<std::thread> io_threads_;
};

}  // namespace redwing
