import type { PlanEvent } from "../core/engine/index.ts";

const MIB = 1024 ** 2;

/**
 * The engine's `plan` event for a small MoE model that fits (no memory budget set): 30 MiB of
 * weights, 10 MiB of KV cache, 4 MiB of expert cache, 70 MiB of working memory. Tests override
 * the fields they are about.
 */
export function planEvent(over: Partial<PlanEvent> = {}): PlanEvent {
  return {
    type: "plan",
    id: 1,
    model: "/models/demo",
    backend: "cpu",
    context: 4096,
    chunk: 512,
    prefix_slack: 0,
    kv_dtype: "f16",
    slots: 1,
    moe_layers: 2,
    expert_bytes_each: MIB,
    core_bytes: 30 * MIB,
    kv_bytes: 10 * MIB,
    expert_bytes: 4 * MIB,
    work_bytes: 70 * MIB,
    total_bytes: 114 * MIB,
    all_experts_bytes: 64 * MIB,
    memory_budget: 0,
    over_budget: null,
    device_bytes: 0,
    ...over,
  };
}
