// Gemma 4 text decoder (transformers' Gemma4ForCausalLM; dense and mixture-of-experts), read
// top to bottom:
//
//   x = embed_tokens[ids] * embed_scale                      (embed_scale bf16-rounded sqrt(H))
//   per layer:
//     x = x + post_attention_layernorm(attention(input_layernorm(x)))       (gemma_common)
//     r = x
//     m = mlp(pre_feedforward_layernorm(r))                                 dense GeGLU
//     MoE layers:
//       h1 = post_feedforward_layernorm_1(m)
//       z = rmsnorm_noweight(r) * router.scale * H^-1/2;  p = softmax(router.proj z)
//       top-k of p, renormalized, times per_expert_scale[expert]
//       h2 = post_feedforward_layernorm_2(sum_k w_k expert_k(pre_feedforward_layernorm_2(r)))
//       m = h1 + h2
//     x = (r + post_feedforward_layernorm(m)) * layer_scalar
//   logits = softcap(embed_tokens . norm(x))
//
// RMSNorm multiplies by the weight itself (norm_weight_offset 0); v_norm and the router norm
// have no weight; the attention scale is 1.
#include "models/gemma4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "models/gemma_common.h"

namespace redwing {
namespace {

using gemma::Scratch;

enum Gemma4Slot : int {
  kFfnOut = gemma::kFirstFamilySlot,  // [T, hidden] dense branch, then h1 + h2
  kRouterIn,                          // [T, hidden]
  kRouterLogits,                      // [T, experts]
  kExpertIn,                          // [T, hidden] pre_feedforward_layernorm_2(r)
  kExpertSum,                         // [T, hidden] sum_k w_k expert_k
  kExpertRows,                        // [n, hidden] the rows routed to one expert
  kExpertGate,                        // [n, moe_intermediate]
  kExpertUp,                          // [n, moe_intermediate]
  kExpertOut,                         // [T * top_k, hidden] every expert's output rows
  kPredictIn,                         // [T, hidden] a RoutingObserver's router input
  kPredictLogits,                     // [T, experts] its logits
};

class Gemma4 final : public Model {
 public:
  Gemma4(const ModelDir& dir, Backend& backend, ExpertSource* experts, Backend* host)
      : arch_(dir.arch()), backend_(backend), experts_(experts), scratch_(backend) {
    const int64_t hidden = arch_.hidden_size;
    embed_ = gemma::load_matrix(backend, dir, "embed_tokens", arch_.vocab_size, hidden,
                                ProductKind::head);  // tied: also the output head
    norm_ = gemma::load_vector(backend, dir, "norm", hidden);
    for (int i = 0; i < arch_.num_layers; ++i) {
      const LayerConfig& lc = arch_.layers[static_cast<size_t>(i)];
      const std::string p = "layers." + std::to_string(i) + ".";
      Layer l;
      l.attn = gemma::load_attention(backend, dir, i);
      l.pre_ffn_norm = gemma::load_vector(backend, dir, p + "pre_feedforward_layernorm", hidden);
      l.post_ffn_norm = gemma::load_vector(backend, dir, p + "post_feedforward_layernorm", hidden);
      l.mlp = gemma::load_mlp(backend, dir, p + "mlp", hidden, arch_.intermediate_size);
      if (dir.has_tensor(p + "layer_scalar"))
        l.layer_scalar = dir.load_f32(p + "layer_scalar", 1)[0];
      if (lc.moe) {
        const MoeConfig& moe = *arch_.moe;
        if (experts_ == nullptr) throw std::logic_error("an MoE model needs an expert source");
        l.post_ffn_norm_1 =
            gemma::load_vector(backend, dir, p + "post_feedforward_layernorm_1", hidden);
        l.pre_ffn_norm_2 =
            gemma::load_vector(backend, dir, p + "pre_feedforward_layernorm_2", hidden);
        l.post_ffn_norm_2 =
            gemma::load_vector(backend, dir, p + "post_feedforward_layernorm_2", hidden);
        l.router_proj = gemma::load_matrix(backend, dir, p + "router.proj", moe.num_experts, hidden,
                                           ProductKind::router);
        l.router_scale = gemma::load_vector(backend, dir, p + "router.scale", hidden);
        l.per_expert_scale =
            gemma::load_vector(backend, dir, p + "router.per_expert_scale", moe.num_experts);
      }
      layers_.push_back(std::move(l));
    }
    // Resident experts are imported once, at load, each layer's as one bank (a GPU backend
    // uploads them all now and picks them by ids it keeps on the device); streamed ones go into
    // a backend's slots (slotted_experts) or, on the CPU, are used where the store holds them
    // (moe_branch).
    if (experts_ != nullptr && experts_->stable() && experts_->holds_every_expert()) {
      banks_.resize(static_cast<size_t>(arch_.num_layers));
      for (int i = 0; i < arch_.num_layers; ++i) {
        if (!arch_.layers[static_cast<size_t>(i)].moe) continue;
        std::vector<int32_t> all(static_cast<size_t>(arch_.moe->num_experts));
        for (size_t e = 0; e < all.size(); ++e) all[e] = static_cast<int32_t>(e);
        const auto mats = experts_->acquire(i, all);
        std::vector<HostQuantMatrix> gate, up, down;
        for (const ExpertMatrices& m : mats) {
          gate.push_back(m.gate);
          up.push_back(m.up);
          down.push_back(m.down);
        }
        banks_[static_cast<size_t>(i)] = backend.import_experts(gate, up, down);
        experts_->release(i);
      }
    } else if (experts_ != nullptr && experts_->slots_per_layer() > 0 &&
               backend.supports_expert_slots()) {
      // Streamed experts on a GPU: slots in device memory mirroring the store's (slotted_experts).
      slotted_ = true;
      slot_banks_.resize(static_cast<size_t>(arch_.num_layers));
      // Hybrid experts: the host computes what the GPU's slots do not hold (hybrid_experts).
      if (host != nullptr) {
        host_ = host;
        host_scratch_ = std::make_unique<Scratch>(*host);
      }
    }
  }

  const Architecture& arch() const override { return arch_; }

  void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
               std::vector<float>& logits) override {
    const int64_t T = static_cast<int64_t>(tokens.size());
    if (T == 0) return;
    cache.check_room(T);
    const int64_t pos0 = cache.length();
    const float off = arch_.norm_weight_offset;
    const float eps = arch_.rms_norm_eps;
    const int64_t hidden = arch_.hidden_size;

    Mat x = scratch_.get(gemma::kResidual, T, hidden);
    timed(parts_.embed_ms, [&] { backend_.embed(*embed_, tokens, arch_.embed_scale, x); });

    bool input_normed = false;  // the previous layer's end wrote this layer's input norm
    for (int i = 0; i < arch_.num_layers; ++i) {
      const Layer& l = layers_[static_cast<size_t>(i)];
      // Feed-forward: x is the residual r from here on.
      // MoE layers route first and announce their experts, so a streaming expert source
      // reads the missing ones while the dense MLP runs.
      const bool moe = arch_.layers[static_cast<size_t>(i)].moe;
      const bool banked = moe && !banks_.empty();
      const bool slotted = moe && !banked && slotted_;
      const bool hybrid = slotted && host_ != nullptr;
      Routing routing;
      SlotRouting slot_routing;
      Mat h = scratch_.get(gemma::kNormed, T, hidden);
      // The experts' input, pre_feedforward_layernorm_2(x), beside the dense MLP's. Where the
      // host computes some of the experts (hybrid), it comes back with the routes.
      Mat e_in;
      if (moe) e_in = hybrid ? expert_input_beside_routes(T) : scratch_.get(kExpertIn, T, hidden);
      // MoE layers: the feed-forward norms with the attention's residual add, before the
      // routing: the router's product reads only x and the dense MLP's products only h, so a
      // GPU runs them side by side.
      const gemma::NormPairOut ffn_norms{l.pre_ffn_norm.get(), l.pre_ffn_norm_2.get(), h, e_in};
      timed(parts_.attention_ms, [&] {
        gemma::attention_block(backend_, arch_, i, l.attn, cache.layer(i), x, pos0, scratch_,
                               input_normed, moe ? &ffn_norms : nullptr);
      });
      input_normed = false;
      if (routing_observer_ != nullptr) {
        observe_router(i, RoutingSource::own, x);
        observe_router(i + 1, RoutingSource::after_attention, x);
      }
      if (banked) {
        timed(parts_.router_ms, [&] { route_to_backend(i, l, x); });
      } else if (slotted) {
        timed(parts_.router_ms, [&] {
          // The layer's one host round trip.
          slot_routing = hybrid ? route_to_host(i, l, x, e_in) : route_to_host(i, l, x);
          experts_->prefetch(i, slot_routing.distinct);
        });
      } else if (moe) {
        timed(parts_.router_ms, [&] {
          routing = route(i, l, x);
          experts_->prefetch(i, routing.ids);
        });
      }
      Mat m = scratch_.get(kFfnOut, T, hidden);
      timed(parts_.dense_mlp_ms, [&] {
        if (!moe) backend_.rms_norm(x, l.pre_ffn_norm.get(), off, eps, h);  // MoE: normed above
        gemma::gated_mlp(backend_, l.mlp, h, m, scratch_);
      });
      if (moe) {
        // x = (x + post_ffn_norm(post_ffn_norm_1(m) + post_ffn_norm_2(sum))) * layer_scalar,
        // and the next layer's input norm of it while the backend holds x.
        Backend::FfnTail tail{.m = m,
                              .dense_norm = l.post_ffn_norm_1.get(),
                              .experts_norm = l.post_ffn_norm_2.get(),
                              .ffn_norm = l.post_ffn_norm.get(),
                              .weight_offset = off,
                              .eps = eps,
                              .x = x,
                              .layer_scalar = l.layer_scalar,
                              .next_norm = nullptr,
                              .next = {}};
        if (i + 1 < arch_.num_layers) {
          tail.next_norm = layers_[static_cast<size_t>(i) + 1].attn.input_norm.get();
          tail.next = scratch_.get(gemma::kNormed, T, hidden);  // attention_block's h
          input_normed = true;
        }
        timed(parts_.experts_ms, [&] {
          if (banked) {
            backend_.routed_experts_tail(*banks_[static_cast<size_t>(i)], e_in, *routes_,
                                         arch_.moe->top_k,
                                         scratch_.get(kExpertSum, e_in.rows, hidden), tail);
            return;
          }
          const Mat sum = hybrid    ? hybrid_experts(i, e_in, slot_routing)
                          : slotted ? slotted_experts(i, e_in, slot_routing)
                                    : moe_branch(i, e_in, routing);
          backend_.moe_ffn_tail(sum, tail);
        });
      } else {
        // x = (x + post_ffn_norm(m)) * layer_scalar
        backend_.add_rms_norm(m, l.post_ffn_norm.get(), off, eps, x, l.layer_scalar);
      }
      if (routing_observer_ != nullptr) observe_router(i + 1, RoutingSource::before_attention, x);
    }
    cache.advance(T);

    timed(parts_.head_ms, [&] {
      gemma::finish_logits(backend_, arch_, *norm_, *embed_, x, which, scratch_, logits,
                           kept_logits_);
    });
  }

 private:
  struct Layer {
    gemma::AttentionWeights attn;
    std::unique_ptr<Buffer> pre_ffn_norm, post_ffn_norm;
    gemma::MlpWeights mlp;
    float layer_scalar = 1.0f;
    // MoE layers only.
    std::unique_ptr<Buffer> post_ffn_norm_1, pre_ffn_norm_2, post_ffn_norm_2;
    std::unique_ptr<QWeight> router_proj;
    std::unique_ptr<Buffer> router_scale, per_expert_scale;
  };

  // The chosen experts of a [T, hidden] residual: ids ascending, each with the rows that picked
  // it and their weights.
  struct Routing {
    std::vector<int32_t> ids;
    std::vector<std::vector<int32_t>> rows;
    std::vector<std::vector<float>> weights;
  };

  // The router's logits for the residual r [T, hidden] (on the un-normed residual).
  Mat router_logits(const Layer& l, Mat r, int in_slot = kRouterIn,
                    int logits_slot = kRouterLogits) {
    const RouterProduct router = router_product(l, r, in_slot, logits_slot);
    backend_.qmatmul_normed(r, router.norm, router.product.x,
                            std::span<const Backend::QProduct>(&router.product, 1));
    return router.product.y;
  }
  // rl = router_proj * z, z = rms_norm(r) * router_scale * hidden^-0.5 (folded into the product
  // on a GPU): the norm and the product, z and rl in scratch.
  struct RouterProduct {
    Backend::InputNorm norm;
    Backend::QProduct product;
  };
  RouterProduct router_product(const Layer& l, Mat r, int in_slot = kRouterIn,
                               int logits_slot = kRouterLogits) {
    const int64_t hidden = arch_.hidden_size;
    Mat z = scratch_.get(in_slot, r.rows, hidden);
    Mat rl = scratch_.get(logits_slot, r.rows, arch_.moe->num_experts);
    return {{l.router_scale.get(), 0.0f, arch_.rms_norm_eps,
             static_cast<float>(std::pow(static_cast<double>(hidden), -0.5))},
            {l.router_proj.get(), z, rl}};
  }

  // For a RoutingObserver: `layer`'s router logits on the residual r, read back (own scratch
  // slots, so the layer's routing is left as it was). Nothing for a dense or missing layer.
  void observe_router(int layer, RoutingSource source, Mat r) {
    if (layer >= arch_.num_layers || !arch_.layers[static_cast<size_t>(layer)].moe) return;
    const int experts = arch_.moe->num_experts;
    Mat rl = router_logits(layers_[static_cast<size_t>(layer)], r, kPredictIn, kPredictLogits);
    std::vector<float> host(static_cast<size_t>(r.rows) * static_cast<size_t>(experts));
    backend_.download(*rl.buf, static_cast<size_t>(rl.offset) * sizeof(float), host.data(),
                      host.size() * sizeof(float));
    routing_observer_->router_logits(layer, source, r.rows, experts, host.data());
  }

  // The router's choice for the residual r into routes_ (grown as needed); returns the number of
  // routed entries, r.rows * top_k.
  size_t route_on_backend(const Layer& l, Mat r) {
    const MoeConfig& moe = *arch_.moe;
    const size_t count = static_cast<size_t>(r.rows) * static_cast<size_t>(moe.top_k);
    if (!routes_ || routes_->size_bytes() < route_buffer_bytes(count))
      routes_ = backend_.alloc(route_buffer_bytes(count));
    const RouterProduct router = router_product(l, r);
    backend_.route_product_to(r, router.norm, router.product.x, router.product, moe.top_k,
                              *l.per_expert_scale, *routes_);
    return count;
  }

  // Where the routes of T rows end in routes_, rounded up to 256 bytes: hybrid experts keep the
  // experts' input there (expert_input_beside_routes).
  size_t routes_end(int64_t T) const {
    const size_t count = static_cast<size_t>(T) * static_cast<size_t>(arch_.moe->top_k);
    return (route_buffer_bytes(count) + 255) / 256 * 256;
  }
  // A [T, hidden] view of routes_ right after the routes of T rows (routes_ grown to hold it), so
  // one read-back brings the routes and the experts' input to the host.
  Mat expert_input_beside_routes(int64_t T) {
    const int64_t hidden = arch_.hidden_size;
    const size_t at = routes_end(T);
    const size_t bytes = at + static_cast<size_t>(T * hidden) * sizeof(float);
    if (!routes_ || routes_->size_bytes() < bytes) routes_ = backend_.alloc(bytes);
    return Mat{routes_.get(), static_cast<int64_t>(at / sizeof(float)), T, hidden, hidden};
  }

  // The router's choice for the residual r, into routes_ (backend memory: no host round trip
  // unless a routing hook or observer must see the ids).
  void route_to_backend(int layer, const Layer& l, Mat r) {
    const MoeConfig& moe = *arch_.moe;
    const size_t count = route_on_backend(l, r);
    if (routing_hook_ != nullptr || routing_observer_ != nullptr) {
      std::vector<int32_t> idx(count);
      backend_.download(*routes_, 0, idx.data(), idx.size() * sizeof(int32_t));
      if (routing_hook_ != nullptr) {
        routing_hook_->apply(layer, r.rows, moe.top_k, moe.num_experts, idx.data());
        backend_.upload(*routes_, 0, idx.data(), idx.size() * sizeof(int32_t));
      }
      if (routing_observer_ != nullptr)
        routing_observer_->routed(layer, r.rows, moe.top_k, moe.num_experts, idx.data());
    }
  }

  // The routing in routes_, also on the host, for streamed experts in backend slots.
  struct SlotRouting {
    std::vector<int32_t> ids;       // T * top_k, route_to's order
    std::vector<float> weights;     // likewise
    std::vector<int32_t> distinct;  // the chosen experts, ascending
    std::vector<float> input;       // hybrid experts: the experts' input [T, hidden]
  };
  // The router's choice for the residual r in routes_ (as route_to_backend) and on the host: one
  // download of ids and weights (and of e_in, when it is expert_input_beside_routes' view); a
  // routing hook edits the ids there and they go back up.
  SlotRouting route_to_host(int layer, const Layer& l, Mat x, Mat e_in = {}) {
    const MoeConfig& moe = *arch_.moe;
    const size_t count = route_on_backend(l, x);
    const size_t input_floats = e_in.buf ? static_cast<size_t>(e_in.rows * e_in.cols) : 0;
    std::vector<std::byte> host(input_floats ? routes_end(x.rows) + input_floats * sizeof(float)
                                             : route_buffer_bytes(count));
    backend_.download(*routes_, 0, host.data(), host.size());
    SlotRouting r;
    r.ids.resize(count);
    r.weights.resize(count);
    std::memcpy(r.ids.data(), host.data(), count * sizeof(int32_t));
    std::memcpy(r.weights.data(), host.data() + route_weights_offset(count), count * sizeof(float));
    r.input.resize(input_floats);
    if (input_floats)
      std::memcpy(r.input.data(), host.data() + routes_end(x.rows), input_floats * sizeof(float));
    if (routing_hook_ != nullptr) {
      routing_hook_->apply(layer, x.rows, moe.top_k, moe.num_experts, r.ids.data());
      backend_.upload(*routes_, 0, r.ids.data(), count * sizeof(int32_t));
    }
    if (routing_observer_ != nullptr)
      routing_observer_->routed(layer, x.rows, moe.top_k, moe.num_experts, r.ids.data());
    for (int32_t e : r.ids)
      if (e < 0 || e >= arch_.moe->num_experts)
        throw std::logic_error("routing chose expert " + std::to_string(e) + ", outside the model");
    r.distinct = r.ids;
    std::sort(r.distinct.begin(), r.distinct.end());
    r.distinct.erase(std::unique(r.distinct.begin(), r.distinct.end()), r.distinct.end());
    return r;
  }

  // moe_branch's sum with the experts streamed into backend slots, numbered by the expert store
  // (mirroring its host slots, or its record of the GPU's own fewer slots under a RAM tier): a
  // slot is filled only when the store delivers it with an expert the backend copy does not hold
  // (a miss or a RAM hit, or a slot refilled since). The products run once every delivered
  // expert is in its slot; when a slot must be refilled within the layer (fewer slots than
  // experts: waves), the products of the experts delivered so far run first.
  Mat slotted_experts(int layer, Mat e_in, const SlotRouting& r) {
    const int top_k = arch_.moe->top_k;
    std::unique_ptr<ExpertBank>& bank = slot_banks_[static_cast<size_t>(layer)];
    const size_t count = r.ids.size();
    std::vector<int32_t> pending(count, -1);  // entries delivered, products not yet recorded
    bool any_pending = false;
    auto run_pending = [&] {
      if (!any_pending) return;
      backend_.slot_expert_products(*bank, e_in, r.ids, pending, top_k);
      std::fill(pending.begin(), pending.end(), -1);
      any_pending = false;
    };
    experts_->for_each_slot(layer, r.distinct, [&](size_t k, int slot, const ExpertMatrices& m) {
      const int32_t expert = r.distinct[k];
      if (!bank)
        bank = backend_.create_expert_slots(m.gate, m.up, m.down, experts_->slots_per_layer());
      if (!backend_.slot_holds(*bank, slot, expert)) {
        if (m.gate.packed == nullptr)  // the store counted a GPU hit the bank does not hold
          throw std::logic_error("expert " + std::to_string(expert) + " of layer " +
                                 std::to_string(layer) + " delivered without data to GPU slot " +
                                 std::to_string(slot) + ", which does not hold it");
        if (std::find(pending.begin(), pending.end(), slot) != pending.end()) run_pending();
        backend_.fill_expert_slot(*bank, slot, expert, m.gate, m.up, m.down);
      }
      for (size_t j = 0; j < count; ++j)
        if (r.ids[j] == expert) pending[j] = slot, any_pending = true;
    });
    run_pending();
    Mat sum = scratch_.get(kExpertSum, e_in.rows, arch_.hidden_size);
    backend_.combine_slot_products(*routes_, r.ids, r.weights, top_k, sum);
    return sum;
  }

  // slotted_experts' sum under the RAM tier with hybrid experts: the GPU computes the experts
  // its slots hold (GPU hits, delivered first), the host (host_, the CPU backend) every other
  // one straight from the store's host slot (RAM hits, then misses as their reads land), and
  // its products join the GPU's for the one combine. The host holds the experts that are ready
  // together and computes them as grouped products (host_experts: a decode step's RAM hits are
  // one batch, two thread-pool rounds in all instead of two per expert); it computes what it
  // holds before the store would wait for a read (compute overlaps it) or reuse a held expert's
  // host slot (ExpertSource::for_each_slot_batched). The store hands a few of the host's experts
  // on to a GPU slot (ExpertStoreOptions::device_copies), delivered after the other ready ones;
  // its copy is recorded after the products that read the slot's old expert and started before
  // the host computes it (the store counts the slot filled once the delivery returns). With the
  // misses split (ExpertStoreOptions::device_computes_copies) those copies come first and the GPU
  // computes them instead of the host: the link moves a few while the host computes the rest.
  Mat hybrid_experts(int layer, Mat e_in, const SlotRouting& r) {
    const int top_k = arch_.moe->top_k;
    std::unique_ptr<ExpertBank>& bank = slot_banks_[static_cast<size_t>(layer)];
    const size_t count = r.ids.size();
    std::vector<int32_t> on_gpu(count, -1);  // GPU hits' entries: their slot, until recorded
    bool any_on_gpu = false;
    auto record_gpu_products = [&] {
      if (!any_on_gpu) return;
      backend_.slot_expert_products(*bank, e_in, r.ids, on_gpu, top_k);
      std::fill(on_gpu.begin(), on_gpu.end(), -1);
      any_on_gpu = false;
    };
    HostProducts host;
    std::vector<HeldExpert> held;  // delivered to the host, not computed yet
    bool gpu_started = false;
    experts_->for_each_slot_batched(layer, r.distinct, [&](const ExpertSource::SlotDelivery& d) {
      const int32_t expert = r.distinct[d.k];
      const int slot = d.slot;
      const ExpertMatrices& m = d.matrices;
      if (!bank)
        bank = backend_.create_expert_slots(m.gate, m.up, m.down, experts_->slots_per_layer());
      if (m.gate.packed == nullptr) {  // a GPU hit
        if (!backend_.slot_holds(*bank, slot, expert))
          throw std::logic_error("expert " + std::to_string(expert) + " of layer " +
                                 std::to_string(layer) + " delivered without data to GPU slot " +
                                 std::to_string(slot) + ", which does not hold it");
        for (size_t j = 0; j < count; ++j)
          if (r.ids[j] == expert) on_gpu[j] = slot, any_on_gpu = true;
        return;
      }
      if (!d.host_computes) {  // a copy the GPU computes (the misses split, delivered first)
        if (slot < 0)
          throw std::logic_error("expert " + std::to_string(expert) + " of layer " +
                                 std::to_string(layer) +
                                 " delivered to neither the host nor a slot");
        if (std::find(on_gpu.begin(), on_gpu.end(), slot) != on_gpu.end()) record_gpu_products();
        backend_.fill_expert_slot(*bank, slot, expert, m.gate, m.up, m.down);
        backend_.submit();  // the copy starts now, beside what the host does next
        for (size_t j = 0; j < count; ++j)
          if (r.ids[j] == expert) on_gpu[j] = slot, any_on_gpu = true;
        return;
      }
      if (!gpu_started) {  // the GPU runs the dense MLP and its hits while the host computes
        record_gpu_products();
        backend_.submit();
        gpu_started = true;
      }
      if (slot >= 0) {  // also into a GPU slot, for the tokens after this one: recorded and
        // started before the host computes it, so that a copy the GPU reads from the host slot
        // in place (Backend::map_host_memory) runs beside the host's products
        if (std::find(on_gpu.begin(), on_gpu.end(), slot) != on_gpu.end()) record_gpu_products();
        backend_.fill_expert_slot(*bank, slot, expert, m.gate, m.up, m.down);
        backend_.submit();
      }
      held.push_back({expert, m});
      if (d.more && slot < 0) return;  // computed with the next ones
      timed(parts_.host_experts_ms, [&] { host_experts(held, r, host); });
      held.clear();
    });
    if (!held.empty())  // their host slots may be reused now
      throw std::logic_error("the expert store ended layer " + std::to_string(layer) +
                             "'s request with experts still held");
    record_gpu_products();
    if (!host.entries.empty())
      backend_.host_expert_products(*bank, e_in, r.ids, host.entries, host.products, top_k);
    Mat sum = scratch_.get(kExpertSum, e_in.rows, arch_.hidden_size);
    backend_.combine_slot_products(*routes_, r.ids, r.weights, top_k, sum);
    return sum;
  }

  // The host's share of a hybrid layer: the entries it computed and their unweighted products
  // (hidden floats each), for Backend::host_expert_products.
  struct HostProducts {
    Mat input;  // the experts' input on the host backend, uploaded on first use
    std::vector<int32_t> entries;
    std::vector<float> products;
  };

  // An expert delivered to the host whose products are not computed yet.
  struct HeldExpert {
    int32_t expert;
    ExpertMatrices matrices;
  };

  // Experts of a hybrid layer on the host backend, each over the tokens that chose it, as the
  // CPU engine runs a layer's experts (grouped_products), appended to `out` for the GPU.
  void host_experts(std::span<const HeldExpert> batch, const SlotRouting& r, HostProducts& out) {
    const auto top_k = static_cast<size_t>(arch_.moe->top_k);
    const int64_t hidden = arch_.hidden_size;
    Backend& cpu = *host_;
    if (!out.input.buf) {
      const int64_t T = static_cast<int64_t>(r.input.size()) / hidden;
      out.input = host_scratch_->get(kExpertIn, T, hidden);
      cpu.upload(*out.input.buf, 0, r.input.data(), r.input.size() * sizeof(float));
    }
    const size_t n_experts = batch.size();
    std::vector<std::vector<int32_t>> rows(n_experts);
    std::vector<int64_t> first_row(n_experts + 1, 0);
    std::vector<ImportedExpert> imported(n_experts);
    std::vector<const ImportedExpert*> experts;
    for (size_t k = 0; k < n_experts; ++k) {
      // Entries in order per expert, experts in batch order: the products' order below.
      for (size_t j = 0; j < r.ids.size(); ++j)
        if (r.ids[j] == batch[k].expert) {
          out.entries.push_back(static_cast<int32_t>(j));
          rows[k].push_back(static_cast<int32_t>(j / top_k));
        }
      first_row[k + 1] = first_row[k] + static_cast<int64_t>(rows[k].size());
      import_expert(cpu, batch[k].matrices, imported[k]);
      experts.push_back(&imported[k]);
    }
    const int64_t n = first_row[n_experts];
    Mat y = host_scratch_->get(kExpertOut, n, hidden);
    grouped_products(cpu, *host_scratch_, out.input, experts, rows, first_row, y);
    const size_t at = out.products.size();
    out.products.resize(at + static_cast<size_t>(n * hidden));
    cpu.download(*y.buf, static_cast<size_t>(y.offset) * sizeof(float), out.products.data() + at,
                 static_cast<size_t>(n * hidden) * sizeof(float));
  }

  Routing route(int layer, const Layer& l, Mat r) {
    const MoeConfig& moe = *arch_.moe;
    const int64_t T = r.rows;
    Mat rl = router_logits(l, r);
    std::vector<int32_t> idx(static_cast<size_t>(T * moe.top_k));
    std::vector<float> wts(idx.size());
    backend_.route(rl, moe.top_k, *l.per_expert_scale, idx.data(), wts.data());
    if (routing_hook_ != nullptr)
      routing_hook_->apply(layer, T, moe.top_k, moe.num_experts, idx.data());
    if (routing_observer_ != nullptr)
      routing_observer_->routed(layer, T, moe.top_k, moe.num_experts, idx.data());

    // Rows per expert, experts in ascending id (transformers' order of accumulation).
    std::map<int32_t, std::pair<std::vector<int32_t>, std::vector<float>>> groups;
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < moe.top_k; ++j) {
        auto& g = groups[idx[static_cast<size_t>(t * moe.top_k + j)]];
        g.first.push_back(static_cast<int32_t>(t));
        g.second.push_back(wts[static_cast<size_t>(t * moe.top_k + j)]);
      }
    Routing out;
    for (auto& [e, g] : groups) {
      out.ids.push_back(e);
      out.rows.push_back(std::move(g.first));
      out.weights.push_back(std::move(g.second));
    }
    return out;
  }

  // h2 = post_feedforward_layernorm_2(sum_k w_k expert_k(pre_feedforward_layernorm_2(r))) for
  // the residual r [T, hidden]. Each chosen expert runs once over all the rows that picked it.
  // The experts may arrive in any order (cached ones first); each one's output is kept in its
  // own rows of kExpertOut and summed in ascending expert id afterwards, so the result is the
  // same bits whatever the arrival order. e_in is pre_feedforward_layernorm_2 of the residual.
  // Returns the weighted sum before post_ffn_norm_2 (the
  // caller applies it fused with its add: h2 = post_ffn_norm_2(sum)).
  Mat moe_branch(int layer, Mat e_in, const Routing& routing) {
    const MoeConfig& moe = *arch_.moe;
    const int64_t T = e_in.rows;
    const int64_t hidden = arch_.hidden_size;

    Mat sum = scratch_.get(kExpertSum, T, hidden);
    backend_.fill_zero(sum);

    const size_t n_experts = routing.ids.size();
    std::vector<int64_t> first_row(n_experts + 1, 0);
    for (size_t k = 0; k < n_experts; ++k)
      first_row[k + 1] = first_row[k] + static_cast<int64_t>(routing.rows[k].size());
    Mat y_all = scratch_.get(kExpertOut, first_row[n_experts], hidden);

    if (experts_->holds_every_expert()) {
      grouped_experts(layer, routing, e_in, y_all, first_row);
    } else {
      experts_->for_each(layer, routing.ids, [&](size_t k, const ExpertMatrices& mats) {
        const auto& rows = routing.rows[k];
        const int64_t n = static_cast<int64_t>(rows.size());
        ImportedExpert once;
        const ImportedExpert& e = import_expert(layer, routing.ids[k], mats, once);
        const Backend::ExpertRows one[] = {{e.gate.get(), e.up.get(), e.down.get(), rows}};
        backend_.expert_products(one, e_in, scratch_.get(kExpertRows, n, hidden),
                                 scratch_.get(kExpertGate, n, moe.intermediate_size),
                                 scratch_.get(kExpertUp, n, moe.intermediate_size),
                                 y_all.row_range(first_row[k], n));
      });
    }
    for (size_t k = 0; k < n_experts; ++k)
      backend_.scatter_add_rows(y_all.row_range(first_row[k], first_row[k + 1] - first_row[k]),
                                routing.rows[k], routing.weights[k], sum);

    return sum;
  }

  struct ImportedExpert {
    std::unique_ptr<QWeight> gate, up, down;
  };

  // An expert's matrices as backend weights. Experts that stay put in host memory are imported
  // once and kept (a GPU backend copies them to the device on first use); streamed ones are
  // imported into `once`, for this call only.
  const ImportedExpert& import_expert(int layer, int32_t id, const ExpertMatrices& mats,
                                      ImportedExpert& once) {
    ImportedExpert& e = experts_->stable() ? imported_[{layer, id}] : once;
    if (!e.gate) import_expert(backend_, mats, e);
    return e;
  }
  static void import_expert(Backend& backend, const ExpertMatrices& mats, ImportedExpert& e) {
    e.gate = backend.import_qweight(mats.gate);
    e.up = backend.import_qweight(mats.up);
    e.down = backend.import_qweight(mats.down);
    e.gate->kind = e.up->kind = e.down->kind = ProductKind::experts;
  }

  // Every chosen expert of a layer at once, when the source has them all in memory
  // (grouped_products).
  void grouped_experts(int layer, const Routing& routing, Mat e_in, Mat y_all,
                       const std::vector<int64_t>& first_row) {
    const size_t n_experts = routing.ids.size();
    std::vector<ExpertMatrices> mats = experts_->acquire(layer, routing.ids);
    struct Release {
      ExpertSource* source;
      int layer;
      ~Release() { source->release(layer); }
    } release{experts_, layer};
    std::vector<ImportedExpert> once(n_experts);
    std::vector<const ImportedExpert*> experts;
    for (size_t k = 0; k < n_experts; ++k)
      experts.push_back(&import_expert(layer, routing.ids[k], mats[k], once[k]));
    grouped_products(backend_, scratch_, e_in, experts, routing.rows, first_row, y_all);
  }

  // Several experts, each over its rows of e_in, on `backend` (Backend::expert_products): expert
  // k's rows[k] are rows [first_row[k], first_row[k + 1]) of y.
  void grouped_products(Backend& backend, Scratch& scratch, Mat e_in,
                        std::span<const ImportedExpert* const> experts,
                        std::span<const std::vector<int32_t>> rows,
                        std::span<const int64_t> first_row, Mat y) {
    const int64_t inter = arch_.moe->intermediate_size;
    const int64_t total = first_row[experts.size()];
    std::vector<Backend::ExpertRows> chosen;
    for (size_t k = 0; k < experts.size(); ++k)
      chosen.push_back(
          {experts[k]->gate.get(), experts[k]->up.get(), experts[k]->down.get(), rows[k]});
    backend.expert_products(chosen, e_in, scratch.get(kExpertRows, total, arch_.hidden_size),
                            scratch.get(kExpertGate, total, inter),
                            scratch.get(kExpertUp, total, inter), y);
  }

  Architecture arch_;
  Backend& backend_;
  ExpertSource* experts_;
  std::map<std::pair<int, int32_t>, ImportedExpert> imported_;  // (layer, expert), stable()
  // Per layer (null for dense ones) when every expert is resident; then routes_ holds the
  // current layer's routing in backend memory.
  std::vector<std::unique_ptr<ExpertBank>> banks_;
  std::unique_ptr<Buffer> routes_;
  // Streamed experts in backend slots (a GPU with a streaming expert source): per layer, made
  // on the layer's first use (null for dense layers and until then).
  bool slotted_ = false;
  std::vector<std::unique_ptr<ExpertBank>> slot_banks_;
  // Hybrid experts (slotted_ under the RAM tier): the CPU backend that computes the experts the
  // GPU's slots do not hold, and its scratch; null otherwise.
  Backend* host_ = nullptr;
  std::unique_ptr<Scratch> host_scratch_;
  Scratch scratch_;
  std::unique_ptr<QWeight> embed_;
  std::unique_ptr<Buffer> norm_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_gemma4(const ModelDir& dir, Backend& backend, ExpertSource* experts,
                                   Backend* host) {
  return std::make_unique<Gemma4>(dir, backend, experts, host);
}

}  // namespace redwing
