// Where the MoE layers get their experts' weights from.
//
// The model asks for the experts one layer needs, uses them, then releases them. The resident
// source below reads every expert file into memory at start; the SSD-streaming cache
// (runtime/expert_store.h) replaces it behind the same interface, and MappedExpertSource maps
// the files (the page-cache baseline of the streaming benchmark).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/host_tensor.h"
#include "format/model_dir.h"
#include "platform/file.h"

namespace redwing {

struct ExpertMatrices {
  HostQuantMatrix gate, up, down;
};

// Counters of an expert source since it was made (all zero for the resident source).
struct ExpertStats {
  uint64_t requests = 0;       // expert uses asked for (one per expert per layer per call)
  uint64_t hits = 0;           // of those, found in a slot
  uint64_t misses = 0;         // of those, read from the file
  uint64_t bytes_read = 0;     // bytes read from expert files
  double io_wait_seconds = 0;  // time the model thread waited for reads with nothing else to do
  double read_seconds = 0;     // time spent inside reads, summed over the I/O threads
  // Experts delivered into a backend's slots (for_each_slot, GPU expert slots):
  uint64_t device_hits = 0;   // of the hits, already in the backend's slot: nothing copied
  uint64_t device_bytes = 0;  // bytes of the experts handed over to be copied into its slots
  // Hybrid experts (runtime/expert_store.h): of the uses that were not GPU hits, those handed to
  // the host to compute (every RAM hit and miss).
  uint64_t host_computed = 0;
  double hit_rate() const {
    return requests ? static_cast<double>(hits) / static_cast<double>(requests) : 0.0;
  }
  // The tiers: device_hits (GPU) + ram_hits() (host slots) + misses (read from the file) =
  // requests. On the CPU every hit is a RAM hit.
  uint64_t ram_hits() const { return hits - device_hits; }
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // The matrices of the listed experts of `layer`, in the same order. They stay valid until
  // release(layer) is called; the model releases a layer before acquiring the next one.
  virtual std::vector<ExpertMatrices> acquire(int layer, std::span<const int32_t> experts) = 0;
  virtual void release(int layer) = 0;

  // Streaming hooks. The model announces a layer's experts as soon as the router has chosen
  // them (before its dense MLP) so a store can start reading the missing ones; then for_each
  // calls fn(k, matrices of experts[k]) exactly once for every k, in any order (cached experts
  // first, the rest as their reads complete). The matrices are valid only during the call. If
  // a read fails, for_each throws (the error names the file and offset) without calling fn for
  // the rest; reads still in flight land in their slots, and the source stays usable. The
  // defaults acquire everything, in order.
  virtual void prefetch(int layer, std::span<const int32_t> experts) {}
  virtual void for_each(int layer, std::span<const int32_t> experts,
                        const std::function<void(size_t, const ExpertMatrices&)>& fn);
  // Sources with a fixed number of backend slots per MoE layer (the streaming store): that
  // number, and for_each also telling the backend slot each expert goes to. An expert keeps its
  // slot while it stays cached, so a backend may keep a copy of each slot (GPU expert slots) and
  // refresh it only when a slot is delivered with another expert. Where the source keeps more
  // experts in host memory than the backend has slots (the RAM tier, runtime/expert_store.h),
  // it numbers the backend's slots itself, and an expert already in its backend slot is
  // delivered first with its shapes only (null data pointers): the backend holds it, nothing is
  // to be copied. With hybrid experts (the host computes the backend's misses) an expert with
  // data comes with slot -1 when it is not to be copied to the backend at all. The defaults: no
  // slots, and slot -1.
  virtual int slots_per_layer() const { return 0; }
  virtual void for_each_slot(int layer, std::span<const int32_t> experts,
                             const std::function<void(size_t, int, const ExpertMatrices&)>& fn);
  // for_each_slot for a taker that computes several experts at once (hybrid experts: the host's
  // share of a layer as grouped products). Each delivery also says whether the taker may hold on
  // to it: `more` is true when its matrices stay valid until for_each_slot_batched returns (its
  // host slot stays pinned: no later expert of the request needs it) and the next delivery is
  // another expert that is ready now (no read to wait for), so computing this one with the next
  // ones loses nothing. With `more` false the taker should compute what it holds before
  // returning: the next expert waits for a read (compute overlaps it), or would reuse a host slot
  // (fewer host slots than experts: waves), or there is none. The default delivers
  // for_each_slot's experts with `more` false.
  struct SlotDelivery {
    size_t k = 0;   // index into `experts`
    int slot = -1;  // the backend slot, as for_each_slot
    ExpertMatrices matrices;
    bool more = false;
    // Hybrid experts: the host computes this one (with slot >= 0 it is also copied into that
    // backend slot); false where the backend computes it from its slot.
    bool host_computes = false;
  };
  virtual void for_each_slot_batched(int layer, std::span<const int32_t> experts,
                                     const std::function<void(const SlotDelivery&)>& fn);
  virtual ExpertStats stats() const { return {}; }
  // Whether an expert's matrices stay at the same host addresses with the same contents for the
  // source's lifetime (every expert resident). A backend that copies weights to a device may
  // then import each expert once and keep it there.
  virtual bool stable() const { return false; }
  // True when acquire() never waits for a read (every expert is in memory or mapped), so the
  // model can take a layer's experts all at once and run their products together instead of
  // one expert at a time as for_each delivers them.
  virtual bool holds_every_expert() const { return false; }
};

// The expert layout of MoE layer i, checked against the architecture (shapes, count); throws
// FormatError naming the manifest and file.
const ExpertLayerInfo& checked_expert_layer(const ModelDir& dir, int i);
// Throws FormatError naming `path` unless `actual` is count * stride bytes.
void check_expert_file_size(const std::string& path, const ExpertLayerInfo& info, uint64_t actual);

// Reads each MoE layer's expert file fully into an aligned buffer when constructed.
class ResidentExpertSource final : public ExpertSource {
 public:
  // Throws FormatError / platform::FileError naming the file. With a backend, the experts'
  // matrices are laid out in its preferred_row_group() (Backend::lay_out_rows) once read.
  explicit ResidentExpertSource(const ModelDir& dir, const Backend* layout = nullptr);

  std::vector<ExpertMatrices> acquire(int layer, std::span<const int32_t> experts) override;
  void release(int layer) override {}
  bool stable() const override { return true; }
  bool holds_every_expert() const override { return true; }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Layer {
    ExpertLayerInfo info;
    std::string path;
    platform::AlignedBytes data;
    int row_group = 1;  // of the matrices whose rows are whole groups; the others stay 1
  };
  std::map<int, Layer> layers_;
  uint64_t bytes_ = 0;
};

// Maps each MoE layer's expert file read-only and lets the OS page experts in on first touch
// (the llama.cpp-style baseline the streaming store is benchmarked against).
class MappedExpertSource final : public ExpertSource {
 public:
  explicit MappedExpertSource(const ModelDir& dir);
  std::vector<ExpertMatrices> acquire(int layer, std::span<const int32_t> experts) override;
  void release(int layer) override {}
  bool holds_every_expert() const override { return true; }

 private:
  struct Layer {
    ExpertLayerInfo info;
    platform::MappedFile map;
  };
  std::map<int, Layer> layers_;
};

}  // namespace redwing
