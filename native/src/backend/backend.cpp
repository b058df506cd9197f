// The host-side defaults of Backend's mixture-of-experts ops (backend.h), written over the other
// ops: what the CPU backend runs, and the reference a GPU backend's own versions are tested
// against.
#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace redwing {
namespace {

// The default bank: each expert's matrices as ordinary imported weights.
class HostExpertBank final : public ExpertBank {
 public:
  struct Expert {
    std::unique_ptr<QWeight> gate, up, down;
  };
  std::vector<Expert> experts;
};

// A [rows, cols] view of `buf`, grown (and zeroed) when too small.
Mat scratch(Backend& b, std::unique_ptr<Buffer>& buf, int64_t rows, int64_t cols) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(rows * cols, 1)) * sizeof(float);
  if (!buf || buf->size_bytes() < bytes) buf = b.alloc(bytes);
  return Mat{buf.get(), 0, rows, cols, cols};
}

}  // namespace

std::unique_ptr<ExpertBank> Backend::import_experts(std::span<const HostQuantMatrix> gate,
                                                    std::span<const HostQuantMatrix> up,
                                                    std::span<const HostQuantMatrix> down) {
  auto bank = std::make_unique<HostExpertBank>();
  check_expert_shapes(gate, up, down, *bank);
  for (size_t e = 0; e < gate.size(); ++e) {
    bank->experts.push_back(
        {import_qweight(gate[e]), import_qweight(up[e]), import_qweight(down[e])});
    auto& ex = bank->experts.back();
    ex.gate->kind = ex.up->kind = ex.down->kind = ProductKind::experts;
  }
  return bank;
}

void Backend::route_to(Mat logits, int top_k, const Buffer& per_expert_scale, Buffer& routes) {
  const size_t count = static_cast<size_t>(logits.rows) * static_cast<size_t>(top_k);
  if (routes.size_bytes() < route_buffer_bytes(count))
    throw std::logic_error("route_to: routes buffer too small");
  std::vector<int32_t> idx(count);
  std::vector<float> weights(count);
  route(logits, top_k, per_expert_scale, idx.data(), weights.data());
  upload(routes, 0, idx.data(), count * sizeof(int32_t));
  upload(routes, route_weights_offset(count), weights.data(), count * sizeof(float));
}

Mat Backend::rows_of(Mat src, std::span<const int32_t> rows, Mat dst) {
  bool all_in_order = static_cast<int64_t>(rows.size()) == src.rows;
  for (size_t i = 0; all_in_order && i < rows.size(); ++i)
    all_in_order = rows[i] == static_cast<int32_t>(i);
  if (all_in_order) return src;
  gather_rows(src, rows, dst);
  return dst;
}

void Backend::expert_products(std::span<const ExpertRows> experts, Mat x, Mat in, Mat g, Mat u,
                              Mat y) {
  std::vector<QProduct> gate_up, down;
  int64_t r0 = 0;
  for (const ExpertRows& e : experts) {
    const auto n = static_cast<int64_t>(e.rows.size());
    const Mat rows_in = rows_of(x, e.rows, in.row_range(r0, n));
    gate_up.push_back({e.gate, rows_in, g.row_range(r0, n)});
    gate_up.push_back({e.up, rows_in, u.row_range(r0, n)});
    down.push_back({e.down, g.row_range(r0, n), y.row_range(r0, n)});
    r0 += n;
  }
  qmatmul_batch(gate_up);
  gelu_tanh_mul(g, u, g);
  qmatmul_batch(down);
}

void Backend::routed_experts(const ExpertBank& bank_base, Mat x, const Buffer& routes, int top_k,
                             Mat out) {
  const auto* bank = dynamic_cast<const HostExpertBank*>(&bank_base);
  if (bank == nullptr) throw std::logic_error("routed_experts: a bank of another backend");
  if (x.cols != bank->hidden || out.cols != bank->hidden || out.rows != x.rows)
    throw std::logic_error("routed_experts: shape mismatch");
  const size_t count = static_cast<size_t>(x.rows) * static_cast<size_t>(top_k);
  const ExpertRowGroups groups =
      group_routes_by_expert(*this, routes, x.rows, top_k, bank->num_experts);

  // Every chosen expert at once, in ascending expert id.
  const int64_t rows = static_cast<int64_t>(count);
  std::vector<ExpertRows> chosen;
  for (const auto& [e, group] : groups) {
    const auto& ex = bank->experts[static_cast<size_t>(e)];
    chosen.push_back({ex.gate.get(), ex.up.get(), ex.down.get(), group.first});
  }
  Mat y = scratch(*this, moe_out_, rows, bank->hidden);
  expert_products(chosen, x, scratch(*this, moe_in_, rows, bank->hidden),
                  scratch(*this, moe_gate_, rows, bank->intermediate),
                  scratch(*this, moe_up_, rows, bank->intermediate), y);
  scatter_expert_rows(*this, groups, y, out);
}

void Backend::penalize_logits(Mat row, std::span<const int32_t> ids, float penalty) {
  if (row.rows != 1) throw std::logic_error("penalize_logits: one row");
  std::vector<float> host(static_cast<size_t>(row.cols));
  const size_t at = static_cast<size_t>(row.offset) * sizeof(float);
  download(*row.buf, at, host.data(), host.size() * sizeof(float));
  for (int32_t id : ids) {
    if (id < 0 || id >= row.cols) throw std::logic_error("penalize_logits: id outside the row");
    float& l = host[static_cast<size_t>(id)];
    l = l < 0.0f ? l * penalty : l / penalty;
  }
  upload(*row.buf, at, host.data(), host.size() * sizeof(float));
}

Backend::TopLogits Backend::top_logits(Mat row, int k) {
  if (row.rows != 1 || k <= 0) throw std::logic_error("top_logits: one row, k > 0");
  std::vector<float> host(static_cast<size_t>(row.cols));
  download(*row.buf, static_cast<size_t>(row.offset) * sizeof(float), host.data(),
           host.size() * sizeof(float));
  TopLogits out;
  for (float l : host) out.finite = out.finite && std::isfinite(l);
  if (!out.finite) return out;
  out.max = *std::max_element(host.begin(), host.end());
  for (float l : host) out.exp_sum += std::exp(static_cast<double>(l) - out.max);
  std::vector<int32_t> order(host.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  const size_t kept = std::min(order.size(), static_cast<size_t>(k));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept), order.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = host[static_cast<size_t>(a)];
                      const float lb = host[static_cast<size_t>(b)];
                      return la > lb || (la == lb && a < b);
                    });
  for (size_t i = 0; i < kept; ++i) {
    out.ids.push_back(order[i]);
    out.logits.push_back(host[static_cast<size_t>(order[i])]);
  }
  return out;
}

void scatter_expert_rows(Backend& backend, const ExpertRowGroups& groups, Mat y, Mat out) {
  backend.fill_zero(out);
  int64_t r0 = 0;
  for (const auto& [e, group] : groups) {
    const int64_t n = static_cast<int64_t>(group.first.size());
    backend.scatter_add_rows(y.row_range(r0, n), group.first, group.second, out);
    r0 += n;
  }
}

void check_expert_shapes(std::span<const HostQuantMatrix> gate, std::span<const HostQuantMatrix> up,
                         std::span<const HostQuantMatrix> down, ExpertBank& bank) {
  if (gate.empty() || gate.size() != up.size() || gate.size() != down.size())
    throw std::logic_error("import_experts: one gate, up and down per expert");
  bank.num_experts = static_cast<int>(gate.size());
  bank.hidden = gate[0].cols;
  bank.intermediate = gate[0].rows;
  for (size_t e = 0; e < gate.size(); ++e)
    if (gate[e].rows != bank.intermediate || up[e].rows != bank.intermediate ||
        gate[e].cols != bank.hidden || up[e].cols != bank.hidden || down[e].rows != bank.hidden ||
        down[e].cols != bank.intermediate)
      throw std::logic_error("import_experts: expert " + std::to_string(e) + " has other shapes");
}

void check_embed_args(int64_t vocab, int64_t width, std::span<const int32_t> ids, Mat out) {
  if (out.rows != static_cast<int64_t>(ids.size()) || out.cols != width)
    throw std::logic_error("embed: shape mismatch");
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary (" +
                              std::to_string(vocab) + " entries)");
}

void check_kv_store_args(const KvLayerView& kv, Mat k, Mat v, int64_t pos0) {
  const int64_t width = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  if (k.cols != width || v.cols != width || k.rows != v.rows)
    throw std::logic_error("kv_store: shape mismatch");
  if (!kv.ring && pos0 + k.rows > kv.capacity) throw std::logic_error("kv_store: past the cache");
  if (kv.ring && k.rows > kv.capacity)
    throw std::logic_error("kv_store: chunk larger than the ring");
}

void check_attention_args(Mat q, const KvLayerView& kv, int n_heads, Mat out) {
  if (q.cols != static_cast<int64_t>(n_heads) * kv.head_dim || out.cols != q.cols ||
      out.rows != q.rows)
    throw std::logic_error("attention: shape mismatch");
  if (kv.num_kv_heads <= 0 || n_heads % kv.num_kv_heads != 0)
    throw std::logic_error("attention: bad GQA grouping");
}

ExpertRowGroups group_routes_by_expert(Backend& backend, const Buffer& routes, int64_t rows,
                                       int top_k, int num_experts) {
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(top_k);
  if (routes.size_bytes() < route_buffer_bytes(count))
    throw std::logic_error("routed_experts: routes buffer too small");
  std::vector<int32_t> idx(count);
  std::vector<float> weights(count);
  backend.download(routes, 0, idx.data(), count * sizeof(int32_t));
  backend.download(routes, route_weights_offset(count), weights.data(), count * sizeof(float));
  return group_expert_rows(idx, weights, rows, top_k, num_experts);
}

ExpertRowGroups group_expert_rows(std::span<const int32_t> idx, std::span<const float> weights,
                                  int64_t rows, int top_k, int num_experts) {
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(top_k);
  if (idx.size() != count || weights.size() != count)
    throw std::logic_error("routed_experts: routes of another size");
  ExpertRowGroups groups;
  for (const auto& [e, entries] : group_entries_by_expert(idx, num_experts)) {
    auto& g = groups.emplace_hint(groups.end(), e, ExpertRowGroups::mapped_type{})->second;
    g.first.reserve(entries.size());
    g.second.reserve(entries.size());
    for (const int64_t j : entries) {
      g.first.push_back(static_cast<int32_t>(j / top_k));
      g.second.push_back(weights[static_cast<size_t>(j)]);
    }
  }
  return groups;
}

ExpertEntryGroups group_entries_by_expert(std::span<const int32_t> ids, int num_experts) {
  std::vector<int32_t> counts(static_cast<size_t>(std::max(num_experts, 0)), 0);
  for (const int32_t e : ids) {
    if (e < 0 || e >= num_experts) throw std::logic_error("routed_experts: expert id out of range");
    ++counts[static_cast<size_t>(e)];
  }
  ExpertEntryGroups groups;
  std::vector<std::vector<int64_t>*> group_of(counts.size(), nullptr);
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    auto& g =
        groups.emplace_hint(groups.end(), static_cast<int32_t>(e), std::vector<int64_t>{})->second;
    g.reserve(static_cast<size_t>(counts[e]));
    group_of[e] = &g;
  }
  for (size_t j = 0; j < ids.size(); ++j)
    group_of[static_cast<size_t>(ids[j])]->push_back(static_cast<int64_t>(j));
  return groups;
}

}  // namespace redwing
