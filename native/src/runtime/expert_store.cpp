#include "runtime/expert_store.h"

#include "format/checked.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

namespace redwing {
namespace {

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// An expert's matrices without their data: what a delivery into a backend slot that already holds
// the expert carries (for_each_slot, the RAM tier's GPU hits).
ExpertMatrices shapes_of(const ExpertLayerInfo& info) {
  return {quant_shape(info.gate), quant_shape(info.up), quant_shape(info.down)};
}

}  // namespace

EvictionPolicy parse_eviction_policy(const std::string& s) {
  if (s == "lrfu") return EvictionPolicy::lrfu;
  if (s == "lfu") return EvictionPolicy::lfu;
  if (s == "lru") return EvictionPolicy::lru;
  throw std::invalid_argument("expert cache policy must be lrfu, lfu or lru, not \"" + s + "\"");
}

ExpertStore::ExpertStore(const ModelDir& dir, const ExpertStoreOptions& options)
    : options_(options) {
  if (options_.slots < 1) throw std::invalid_argument("expert cache slots must be >= 1");
  if (options_.device_slots < 0 || options_.device_slots > options_.slots)
    throw std::invalid_argument("backend expert slots must be in [0, " +
                                std::to_string(options_.slots) + "] (the host's slots), not " +
                                std::to_string(options_.device_slots));
  if (options_.device_copies < -1)
    throw std::invalid_argument("copies into backend slots per layer must be >= 0, not " +
                                std::to_string(options_.device_copies));
  if (options_.io_threads < 1) throw std::invalid_argument("I/O threads must be >= 1");
  if (options_.read_attempts < 1) options_.read_attempts = 1;
  if (!(options_.lrfu_half_life > 0))
    throw std::invalid_argument("the LRFU half-life must be positive");
  const Architecture& arch = dir.arch();
  bool all_direct = options_.direct_io;
  for (int i = 0; i < arch.num_layers; ++i) {
    if (!arch.layers[static_cast<size_t>(i)].moe) continue;
    const ExpertLayerInfo& info = checked_expert_layer(dir, i);
    const std::string path = dir.file_path(info.file);
    Layer l;
    l.info = info;
    l.file = options_.direct_io ? platform::ReadFile::open_uncached(path)
                                : platform::ReadFile::open(path);
    check_expert_file_size(path, info, l.file.size());
    all_direct = all_direct && l.file.direct();
    l.uses.assign(static_cast<size_t>(info.count), 0);
    l.crf.assign(static_cast<size_t>(info.count), 0.0);
    l.crf_at.assign(static_cast<size_t>(info.count), 0);
    // Slots are allocated once, aligned for direct I/O; pages become resident when first read.
    l.slots.resize(static_cast<size_t>(options_.slots));
    if (tiered()) l.device.resize(static_cast<size_t>(options_.device_slots));
    const size_t slot_size = checked::to_size_t(info.stride, "expert slot bytes");
    // Each slot starts on a direct-I/O boundary (16 KiB covers every filesystem's).
    const size_t slot_stride = (slot_size + 16383) / 16384 * 16384;
    l.block_bytes =
        checked::to_size_t(checked::mul(static_cast<uint64_t>(slot_stride),
                                        static_cast<uint64_t>(options_.slots), "expert slot bytes"),
                           "expert slot bytes");
    l.block_bytes =
        (l.block_bytes + kHostBlockAlignment - 1) / kHostBlockAlignment * kHostBlockAlignment;
    if (l.block_bytes > 0) l.block = platform::allocate_aligned(l.block_bytes, kHostBlockAlignment);
    for (size_t k = 0; k < l.slots.size(); ++k) l.slots[k].data = l.block.get() + k * slot_stride;
    slot_bytes_ = checked::add(
        slot_bytes_,
        checked::mul(static_cast<uint64_t>(options_.slots), info.stride, "expert slot bytes"),
        "expert slot bytes");
    layers_.emplace(i, std::move(l));
  }
  direct_ = all_direct && !layers_.empty();
  try {
    for (int t = 0; t < options_.io_threads; ++t) io_threads_.emplace_back([this] { io_main(); });
  } catch (const std::exception& e) {
    // The destructor does not run for a constructor that throws: stop the started threads here
    // (a joinable std::thread destroyed would abort the process) and report the refusal.
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    job_cv_.notify_all();
    for (auto& t : io_threads_) t.join();
    throw std::runtime_error("cannot start " + std::to_string(options_.io_threads) +
                             " expert I/O threads: " + e.what());
  }
}

ExpertStore::~ExpertStore() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  job_cv_.notify_all();
  for (auto& t : io_threads_) t.join();
}

std::vector<std::span<const std::byte>> ExpertStore::host_blocks() const {
  std::vector<std::span<const std::byte>> out;
  for (const auto& [index, l] : layers_)
    if (l.block_bytes > 0) out.emplace_back(l.block.get(), l.block_bytes);
  return out;
}

bool ExpertStore::slots_hold_every_expert() const {
  for (const auto& [index, l] : layers_)
    if (options_.slots < l.info.count) return false;
  return true;
}

ExpertStore::Layer& ExpertStore::layer_at(int layer) {
  auto it = layers_.find(layer);
  if (it == layers_.end())
    throw std::logic_error("layer " + std::to_string(layer) + " has no experts");
  return it->second;
}

ExpertMatrices ExpertStore::matrices(const Layer& l, const Slot& s) const {
  const std::byte* blob = s.data;
  return {host_quant_at(l.info.gate, blob), host_quant_at(l.info.up, blob),
          host_quant_at(l.info.down, blob)};
}

bool ExpertStore::announced(const Layer& l, std::span<const int32_t> experts, bool tiered) const {
  if (!l.announced || !std::equal(l.active.begin(), l.active.end(), experts.begin(), experts.end()))
    return false;
  // A request looked up in the backend's slots, taken without them: look it up again.
  return tiered ||
         std::all_of(l.active_device.begin(), l.active_device.end(), [](int d) { return d < 0; });
}

double ExpertStore::crf_now(const Layer& l, int expert) const {
  const auto e = static_cast<size_t>(expert);
  const double age = static_cast<double>(l.requests - l.crf_at[e]);
  return l.crf[e] * std::exp2(-age / options_.lrfu_half_life);
}

bool ExpertStore::evict_first(const Layer& l, int a, uint64_t a_use, int b, uint64_t b_use) const {
  if (options_.policy == EvictionPolicy::lrfu) {
    const double va = crf_now(l, a);
    const double vb = crf_now(l, b);
    return va < vb || (va == vb && a_use < b_use);
  }
  if (options_.policy == EvictionPolicy::lfu) {
    const uint64_t ua = l.uses[static_cast<size_t>(a)];
    const uint64_t ub = l.uses[static_cast<size_t>(b)];
    return ua < ub || (ua == ub && a_use < b_use);
  }
  return a_use < b_use;
}

int ExpertStore::pick_victim(const Layer& l) const {
  int best = -1;
  for (int s = 0; s < static_cast<int>(l.slots.size()); ++s) {
    const Slot& c = l.slots[static_cast<size_t>(s)];
    if (c.pins > 0 || c.state == SlotState::loading) continue;
    if (c.state == SlotState::empty || c.state == SlotState::failed) return s;
    if (best < 0) {
      best = s;
      continue;
    }
    const Slot& b = l.slots[static_cast<size_t>(best)];
    if (evict_first(l, c.expert, c.last_use, b.expert, b.last_use)) best = s;
  }
  return best;
}

int ExpertStore::pick_device_slot(const Layer& l) const {
  // An empty slot, else the policy's pick among the slots this request has not delivered into,
  // else among those it has (the backend then records their products before the refill: waves).
  int best = -1;
  for (int s = 0; s < static_cast<int>(l.device.size()); ++s) {
    const DeviceSlot& c = l.device[static_cast<size_t>(s)];
    if (c.expert < 0) return s;
    if (best < 0) {
      best = s;
      continue;
    }
    const DeviceSlot& b = l.device[static_cast<size_t>(best)];
    const bool c_used = c.request == l.requests, b_used = b.request == l.requests;
    if (c_used != b_used) {
      if (b_used) best = s;
      continue;
    }
    if (evict_first(l, c.expert, c.last_use, b.expert, b.last_use)) best = s;
  }
  return best;
}

void ExpertStore::begin(Layer& l, int layer, std::span<const int32_t> experts, bool tiered) {
  // An earlier request of this layer that was announced but never run: let its slots go.
  for (int s : l.active_slot)
    if (s >= 0) --l.slots[static_cast<size_t>(s)].pins;
  l.active.assign(experts.begin(), experts.end());
  l.active_slot.assign(experts.size(), -1);
  l.active_device.assign(experts.size(), -1);
  l.active_copy.assign(experts.size(), false);
  l.waiting.clear();
  ++l.requests;
  for (size_t k = 0; k < experts.size(); ++k) {
    const int32_t e = experts[k];
    if (e < 0 || e >= l.info.count)
      throw std::out_of_range("expert " + std::to_string(e) + " out of range in " + l.file.path());
    ++l.uses[static_cast<size_t>(e)];
    l.crf[static_cast<size_t>(e)] = crf_now(l, e) + 1.0;
    l.crf_at[static_cast<size_t>(e)] = l.requests;
    ++stats_.requests;
    if (tiered) {
      auto d = l.on_device.find(e);
      if (d != l.on_device.end()) {  // a GPU hit: in a backend slot, no host slot needed
        l.active_device[k] = d->second;
        ++stats_.hits;
        continue;
      }
    }
    auto it = l.where.find(e);
    if (it != l.where.end()) {
      Slot& s = l.slots[static_cast<size_t>(it->second)];
      ++s.pins;
      s.last_use = ++tick_;
      l.active_slot[k] = it->second;
      ++stats_.hits;
    } else {
      ++stats_.misses;
      l.waiting.push_back(k);
    }
  }
  if (tiered && options_.device_copies >= 0) choose_copies(l);
  assign_slots(l, layer);
}

void ExpertStore::choose_copies(Layer& l) {
  std::vector<size_t> candidates;
  for (size_t k = 0; k < l.active.size(); ++k)
    if (l.active_device[k] < 0) candidates.push_back(k);
  // Highest rank first: a before b when the policy would evict b first. Every candidate was
  // just used by this request, so recency does not tell them apart (ties keep request order).
  std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
    return evict_first(l, l.active[b], 0, l.active[a], 0);
  });
  // A copy the backend computes goes to a slot none of the request's GPU hits uses (a slot the
  // request already used would have to wait for its products: waves for nothing).
  const size_t free_slots = options_.device_computes_copies
                                ? l.device.size() - (l.active.size() - candidates.size())
                                : l.device.size();
  const size_t copies =
      std::min({candidates.size(), static_cast<size_t>(options_.device_copies), free_slots});
  for (size_t i = 0; i < copies; ++i) l.active_copy[candidates[i]] = true;
}

void ExpertStore::assign_slots(Layer& l, int layer) {
  bool queued = false;
  while (!l.waiting.empty()) {
    const int s = pick_victim(l);
    if (s < 0) break;  // every slot is pinned: the rest wait for a wave to finish
    const size_t k = l.waiting.front();
    l.waiting.pop_front();
    Slot& slot = l.slots[static_cast<size_t>(s)];
    if (slot.expert >= 0) l.where.erase(slot.expert);
    slot.expert = l.active[k];
    slot.state = SlotState::loading;
    slot.pins = 1;
    slot.last_use = ++tick_;
    l.where[slot.expert] = s;
    l.active_slot[k] = s;
    queue_read(l, layer, s);
    queued = true;
  }
  if (queued) job_cv_.notify_all();
}

void ExpertStore::queue_read(Layer& l, int layer, int s) {
  Slot& slot = l.slots[static_cast<size_t>(s)];
  const uint64_t stride = l.info.stride;
  uint64_t piece = stride;
  if (options_.read_piece_bytes > 0 && options_.read_piece_bytes < stride) {
    const uint64_t n = (stride + options_.read_piece_bytes - 1) / options_.read_piece_bytes;
    piece = ((stride / n + 16383) / 16384) * 16384;  // aligned for direct I/O
  }
  slot.pieces_left = 0;
  slot.delivered = false;
  slot.error.clear();
  slot.read_for = l.requests;
  for (uint64_t b = 0; b < stride; b += piece) {
    jobs_.push_back({layer, s, slot.expert, b, std::min(piece, stride - b)});
    ++slot.pieces_left;
    ++in_flight_;
  }
}

bool ExpertStore::retry_stale_failure(Layer& l, int layer, size_t k) {
  const int s = l.active_slot[k];
  Slot& slot = l.slots[static_cast<size_t>(s)];
  // A read queued by an earlier request that was abandoned (its generation failed or was
  // cancelled) may have failed for a reason that is gone now, e.g. a file since restored: this
  // request found the expert loading, counted a hit, and must not inherit that failure.
  if (slot.read_for == l.requests) return false;
  slot.expert = l.active[k];
  slot.state = SlotState::loading;
  l.where[slot.expert] = s;
  --stats_.hits;
  ++stats_.misses;
  queue_read(l, layer, s);
  job_cv_.notify_all();
  return true;
}

void ExpertStore::io_main() {
  std::unique_lock lk(mu_);
  for (;;) {
    job_cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    const ReadJob job = jobs_.front();
    jobs_.pop_front();
    lk.unlock();
    read_slot(job);
    lk.lock();
    --in_flight_;
    done_cv_.notify_all();
  }
}

void ExpertStore::read_slot(const ReadJob& job) {
  // The slot is loading and pinned, so nothing else touches its buffer; layers_ and each
  // layer's slot vector never change shape after construction.
  Layer& l = layers_.at(job.layer);
  Slot& slot = l.slots[static_cast<size_t>(job.slot)];
  const uint64_t offset = static_cast<uint64_t>(job.expert) * l.info.stride + job.begin;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  for (int attempt = 0; attempt < options_.read_attempts; ++attempt) {
    try {
      l.file.read_exact(slot.data + job.begin, job.size, offset);
      error.clear();
      break;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const double took = seconds_between(t0, std::chrono::steady_clock::now());
  std::lock_guard lk(mu_);
  stats_.read_seconds += took;
  if (error.empty()) {
    stats_.bytes_read += job.size;
  } else if (slot.error.empty()) {
    slot.error = "expert " + std::to_string(job.expert) + " of layer " + std::to_string(job.layer) +
                 ": " + error + " (after " + std::to_string(options_.read_attempts) + " attempts)";
  }
  // The slot changes state only when its last piece is in, so a failed slot is never handed
  // out again while one of its reads is still writing into it.
  if (--slot.pieces_left > 0) return;
  if (slot.error.empty()) {
    slot.state = SlotState::ready;
  } else {
    slot.state = SlotState::failed;
    l.where.erase(job.expert);
    slot.expert = -1;
  }
}

void ExpertStore::prefetch(int layer, std::span<const int32_t> experts) {
  std::lock_guard lk(mu_);
  Layer& l = layer_at(layer);
  // A store with the RAM tier serves a backend's slots: its requests come through for_each_slot.
  begin(l, layer, experts, tiered());
  l.announced = true;
}

void ExpertStore::for_each(int layer, std::span<const int32_t> experts,
                           const std::function<void(size_t, const ExpertMatrices&)>& fn) {
  deliver(layer, experts, Taker::host, [&](const SlotDelivery& d) { fn(d.k, d.matrices); });
}

void ExpertStore::for_each_slot(int layer, std::span<const int32_t> experts,
                                const std::function<void(size_t, int, const ExpertMatrices&)>& fn) {
  deliver(layer, experts, tiered() ? Taker::tiered : Taker::mirror,
          [&](const SlotDelivery& d) { fn(d.k, d.slot, d.matrices); });
}

void ExpertStore::for_each_slot_batched(int layer, std::span<const int32_t> experts,
                                        const std::function<void(const SlotDelivery&)>& fn) {
  deliver(layer, experts, tiered() ? Taker::tiered : Taker::mirror, fn);
}

void ExpertStore::deliver(int layer, std::span<const int32_t> experts, Taker taker,
                          const std::function<void(const SlotDelivery&)>& fn) {
  std::unique_lock lk(mu_);
  Layer& l = layer_at(layer);
  const bool tier = taker == Taker::tiered;
  if (!announced(l, experts, tier)) begin(l, layer, experts, tier);
  l.announced = false;
  const size_t n = experts.size();
  std::vector<bool> done(n, false);
  // Delivered with `more`: the taker may still read the slot, which stays pinned until the end.
  std::vector<bool> held(n, false);
  size_t remaining = n;
  // Unpins what this request still holds; the reads in flight finish into their slots (which
  // stay valid cache entries) on their own.
  auto finish = [&] {
    for (size_t k = 0; k < n; ++k) {
      const int s = l.active_slot[k];
      if (s >= 0 && (!done[k] || held[k])) --l.slots[static_cast<size_t>(s)].pins;
    }
    l.active.clear();
    l.active_slot.clear();
    l.waiting.clear();
  };
  // fn without the lock (the I/O threads keep reading); the lock is held again when it returns
  // or throws.
  auto call = [&](size_t k, int slot, const ExpertMatrices& m, bool more,
                  bool host_computes = false) {
    lk.unlock();
    try {
      fn(SlotDelivery{k, slot, m, more, host_computes});
    } catch (...) {
      lk.lock();
      throw;
    }
    lk.lock();
  };
  try {
    if (tier) {
      // GPU hits first: nothing to wait for or copy, and once delivered their slots may take
      // this request's other experts (a wave) if the backend has too few slots for all.
      for (size_t k = 0; k < n; ++k) {
        const int d = l.active_device[k];
        if (d < 0) continue;
        call(k, d, shapes_of(l.info), false);
        DeviceSlot& ds = l.device[static_cast<size_t>(d)];
        ds.request = l.requests;
        ds.last_use = ++tick_;
        ++stats_.device_hits;
        done[k] = true;
        --remaining;
      }
    }
    while (remaining > 0) {
      // A slot may have come free (a read left over from an abandoned request landed).
      if (!l.waiting.empty()) assign_slots(l, layer);
      // Compute whatever is ready (hits first, then reads as they land) before waiting; of the
      // ready ones, hybrid experts to be copied to the backend last, or first where the backend
      // computes its copies (its copy and products then run beside the host's products).
      const bool copies_first = options_.device_computes_copies;
      size_t pick = n;
      size_t ready = 0;
      for (size_t k = 0; k < n; ++k) {
        const int s = l.active_slot[k];
        if (done[k] || s < 0) continue;
        const Slot& slot = l.slots[static_cast<size_t>(s)];
        if (slot.state == SlotState::ready) {
          ++ready;
          if (pick == n ||
              (l.active_copy[pick] != copies_first && l.active_copy[k] == copies_first))
            pick = k;
        }
        if (slot.state == SlotState::failed && !retry_stale_failure(l, layer, k))
          throw platform::FileError(slot.error);
      }
      // The taker may hold this one for a batch with the next: another is ready, and no expert
      // waits for a host slot (waiting only shrinks within a request), so none is reused.
      const bool more = ready > 1 && l.waiting.empty();
      if (pick == n) {
        const auto t0 = std::chrono::steady_clock::now();
        done_cv_.wait(lk);
        stats_.io_wait_seconds += seconds_between(t0, std::chrono::steady_clock::now());
        continue;
      }
      const int slot_index = l.active_slot[pick];
      Slot& slot = l.slots[static_cast<size_t>(slot_index)];
      const ExpertMatrices mats = matrices(l, slot);
      if (taker == Taker::mirror) {
        // The backend's slot of the same index holds what this one held when last delivered.
        if (slot.delivered)
          ++stats_.device_hits;
        else
          stats_.device_bytes += l.info.stride;
        call(pick, slot_index, mats, more);
        slot.delivered = true;
      } else if (tier) {
        const int d = pick_device_slot(l);
        DeviceSlot& ds = l.device[static_cast<size_t>(d)];
        // Hybrid experts: the host computes it; it also goes to the backend's slot d when it is
        // one of the request's copies and the policy would evict d's expert before it. Where the
        // backend computes its copies, every one of the request's copies goes to slot d (the
        // backend needs it there) and the host leaves it.
        const bool hybrid_experts = options_.device_copies >= 0;
        const bool backend_computes =
            hybrid_experts && options_.device_computes_copies && l.active_copy[pick];
        const bool copy =
            !hybrid_experts || backend_computes ||
            (l.active_copy[pick] &&
             (ds.expert < 0 || evict_first(l, ds.expert, ds.last_use, experts[pick], tick_ + 1)));
        if (hybrid_experts && !backend_computes) ++stats_.host_computed;
        if (copy) {
          if (ds.expert >= 0) l.on_device.erase(ds.expert);
          ds.expert = -1;  // until the backend has the copy
          stats_.device_bytes += l.info.stride;
          call(pick, d, mats, more, hybrid_experts && !backend_computes);
          ds.expert = experts[pick];
          ds.request = l.requests;
          ds.last_use = ++tick_;
          l.on_device[ds.expert] = d;
        } else {
          call(pick, -1, mats, more, true);
        }
      } else {
        call(pick, slot_index, mats, more);
      }
      done[pick] = true;
      held[pick] = more;
      --remaining;
      if (!more) --slot.pins;
      slot.last_use = ++tick_;
      assign_slots(l, layer);  // a slot may have come free for the next wave
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
}

std::vector<ExpertMatrices> ExpertStore::acquire(int layer, std::span<const int32_t> experts) {
  std::unique_lock lk(mu_);
  Layer& l = layer_at(layer);
  if (experts.size() > l.slots.size())
    throw std::logic_error("acquire needs at least as many slots as experts; use for_each");
  if (!announced(l, experts, false)) begin(l, layer, experts, false);
  l.announced = false;
  for (;;) {
    if (!l.waiting.empty()) assign_slots(l, layer);
    bool all_ready = true;
    for (size_t k = 0; k < l.active_slot.size(); ++k) {
      const int s = l.active_slot[k];
      if (s < 0) {
        all_ready = false;
        continue;
      }
      const Slot& slot = l.slots[static_cast<size_t>(s)];
      if (slot.state == SlotState::failed && retry_stale_failure(l, layer, k)) {
        all_ready = false;
        continue;
      }
      if (slot.state == SlotState::failed) {
        const std::string error = slot.error;
        for (int t : l.active_slot)
          if (t >= 0) --l.slots[static_cast<size_t>(t)].pins;
        l.active.clear();
        l.active_slot.clear();
        throw platform::FileError(error);
      }
      if (slot.state != SlotState::ready) all_ready = false;
    }
    if (all_ready) break;
    const auto t0 = std::chrono::steady_clock::now();
    done_cv_.wait(lk);
    stats_.io_wait_seconds += seconds_between(t0, std::chrono::steady_clock::now());
  }
  std::vector<ExpertMatrices> out;
  for (int s : l.active_slot) out.push_back(matrices(l, l.slots[static_cast<size_t>(s)]));
  return out;
}

void ExpertStore::release(int layer) {
  std::lock_guard lk(mu_);
  Layer& l = layer_at(layer);
  for (int s : l.active_slot)
    if (s >= 0) --l.slots[static_cast<size_t>(s)].pins;
  l.active.clear();
  l.active_slot.clear();
  l.waiting.clear();
}

ExpertStats ExpertStore::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace redwing
