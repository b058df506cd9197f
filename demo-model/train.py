#!/usr/bin/env python3
"""Train Redwing's demo model: a tiny Gemma 4 MoE chat model on public-domain text.

Input: the directory written by prepare_data.py (train.jsonl or train.jsonl.gz, heldout.jsonl,
heldout.txt, data.json). Output (--out):

  tokenizer/            tokenizer.json, tokenizer_config.json (byte-level BPE, Gemma 4 specials
                        at their Gemma 4 ids)
  mlx/                  the trained weights as an MLX affine 4-bit checkpoint (group 64, routers
                        8-bit), written exactly like fixtures/make_fixtures.py writes its fixtures,
                        plus config.json, generation_config.json, the tokenizer and chat template
  reference.json        what transformers computes on the *dequantized 4-bit* weights (what the
                        engine runs), float32, eager, CPU: held-out perplexity over heldout.txt
                        (the token ids are stored too) and greedy replies to chat prompts
  training.json         data, hyperparameters, loss curve, held-out loss, timings, versions

Everything is seeded (torch, numpy, data order); the tokenizer trainer is deterministic. Needs
torch, transformers 5.17 (Gemma 4 classes), tokenizers, numpy and a CUDA GPU for training (the
reference runs on the CPU). `--tokenizer-only` needs only `tokenizers` (no torch).

    python3 demo-model/prepare_data.py --out /tmp/demo-data
    python3 demo-model/train.py --data /tmp/demo-data --out /tmp/demo-out --steps 3000
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import random
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))

S, F = "sliding_attention", "full_attention"

# The model: Gemma 4's layer pattern (five sliding-window layers, then one full-attention layer
# with k_eq_v and proportional RoPE), the dense MLP beside 32 routed experts (top 4), softcap 30.
TEXT = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_global_key_value_heads": 1,
    "head_dim": 64,
    "global_head_dim": 128,
    "attention_k_eq_v": True,
    "sliding_window": 128,
    "layer_types": [S, S, S, S, S, F],
    "enable_moe_block": True,
    "num_experts": 32,
    "top_k_experts": 4,
    "moe_intermediate_size": 128,
    "final_logit_softcapping": 30.0,
}
SPEC = {"name": "redwing-demo", "family": "gemma4", "hf_layout": "nested", "mlx_shards": 1, "fake_multimodal": False, "text": TEXT}

# Gemma 4's special tokens at their Gemma 4 ids; the ids between them are placeholders, so the
# learned pieces start at 107.
GEMMA4_SPECIALS = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>",
    49: "<tool_call|>", 50: "<|tool_response>", 51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>",
    100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>",
}
N_SPECIAL = 107
STOP_IDS = [1, 106, 50]
BOS_ID, PAD_ID = 2, 0


def special_tokens() -> list[str]:
    return [GEMMA4_SPECIALS.get(i, f"<unused{i}>") for i in range(N_SPECIAL)]


def read_jsonl(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def load_data(d: str):
    train_path = os.path.join(d, "train.jsonl.gz")
    if not os.path.exists(train_path):
        train_path = os.path.join(d, "train.jsonl")
    train = read_jsonl(train_path)
    held = read_jsonl(os.path.join(d, "heldout.jsonl"))
    with open(os.path.join(d, "heldout.txt"), encoding="utf-8") as f:
        held_text = f.read()
    with open(os.path.join(d, "data.json")) as f:
        info = json.load(f)
    return train, held, held_text, info


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE with Gemma 4's special tokens at ids 0..106 (deterministic trainer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = special_tokens()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )

    def plain():
        for t in texts:  # control tokens are not text: keep them out of the merges
            for s in specials[:N_SPECIAL]:
                if s in t:
                    t = t.replace(s, "\n")
            yield t

    tok.train_from_iterator(plain(), trainer=trainer, length=len(texts))
    for i, s in enumerate(specials):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def save_tokenizer(tok, d: str) -> None:
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    config = {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def perplexity_windows(n: int, context: int, stride: int):
    """(begin, end, first target) windows, as the engine's score_tokens scores them (stride <
    context): every token but the first is predicted once, from the tokens before it in the
    first window that holds both."""
    assert 1 <= stride < context
    out, prev_end, begin = [], 0, 0
    while True:
        end = min(begin + context, n)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n:
            return out
        begin += stride


def pack_rows(docs: list[list[int]], seq: int, rng: random.Random) -> list[list[int]]:
    """Whole documents packed into rows of seq + 1 tokens (pad after the last one that fits);
    longer documents are cut into row-sized pieces."""
    pieces = []
    for d in docs:
        for i in range(0, len(d), seq + 1):
            pieces.append(d[i : i + seq + 1])
    rng.shuffle(pieces)
    rows, cur = [], []
    for p in pieces:
        if len(cur) + len(p) > seq + 1:
            rows.append(cur + [PAD_ID] * (seq + 1 - len(cur)))
            cur = []
        cur = cur + p
    if cur:
        rows.append(cur + [PAD_ID] * (seq + 1 - len(cur)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64, help="rows per step")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--aux-loss", type=float, default=0.01, help="router load-balancing loss weight")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--context", type=int, default=512, help="perplexity window of the reference")
    ap.add_argument("--stride", type=int, default=256, help="perplexity stride of the reference")
    ap.add_argument("--tokenizer-only", action="store_true", help="train and save the tokenizer, then stop")
    ap.add_argument("--threads", type=int, default=8, help="CPU threads for the reference")
    args = ap.parse_args()
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    log_lines = []

    def log(msg: str) -> None:
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        log_lines.append(line)

    train_docs, held_docs, held_text, data_info = load_data(args.data)
    log(f"data: {len(train_docs)} train documents, {len(held_docs)} held out")
    tok = train_tokenizer([d["text"] for d in train_docs], TEXT["vocab_size"])
    save_tokenizer(tok, os.path.join(args.out, "tokenizer"))
    log(f"tokenizer: {tok.get_vocab_size()} entries")
    if args.tokenizer_only:
        return

    import numpy as np
    import torch
    import transformers
    import make_fixtures as mf

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    enc = tok.encode_batch([d["text"] for d in train_docs], add_special_tokens=False)
    train_ids = [e.ids for e in enc]
    held_ids = [e.ids for e in tok.encode_batch([d["text"] for d in held_docs], add_special_tokens=False)]
    n_train_tokens = sum(map(len, train_ids))
    log(f"train tokens {n_train_tokens}, held-out tokens {sum(map(len, held_ids))}")
    rows = torch.tensor(pack_rows(train_ids, args.seq, rng), dtype=torch.long)
    held_rows = torch.tensor(pack_rows(held_ids, args.seq, random.Random(0)), dtype=torch.long)
    log(f"packed: {rows.shape[0]} train rows, {held_rows.shape[0]} held-out rows of {args.seq + 1}")

    text_cfg = mf.gemma4_text_config(TEXT, dtype="float32")
    cfg = transformers.Gemma4TextConfig(**{k: v for k, v in text_cfg.items() if k != "model_type"})
    cfg._attn_implementation = "sdpa"
    model = transformers.Gemma4ForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters; experts impl {getattr(cfg, '_experts_implementation', None)}")

    router_stats = []

    def router_hook(mod, inp, out):
        router_stats.append((out[0], out[2]))

    routers = [m for n, m in model.named_modules() if type(m).__name__.endswith("TextRouter")]
    assert len(routers) == TEXT["num_hidden_layers"], len(routers)
    for r in routers:
        r.register_forward_hook(router_hook)

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in n else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def batch_loss(x: torch.Tensor):
        inp, tgt = x[:, :-1], x[:, 1:].clone()
        tgt[tgt == PAD_ID] = -100
        router_stats.clear()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=inp).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
        aux = torch.zeros((), device=dev)
        E, K = TEXT["num_experts"], TEXT["top_k_experts"]
        for probs, idx in router_stats:
            frac = torch.bincount(idx.reshape(-1), minlength=E).float() / idx.numel()
            aux = aux + E * (frac * probs.float().reshape(-1, E).mean(0)).sum()
        return loss, aux / max(1, len(router_stats))

    @torch.no_grad()
    def held_loss() -> float:
        model.eval()
        tot, cnt = 0.0, 0
        for i in range(0, held_rows.shape[0], args.batch):
            x = held_rows[i : i + args.batch].to(dev)
            router_stats.clear()
            inp, tgt = x[:, :-1], x[:, 1:].clone()
            tgt[tgt == PAD_ID] = -100
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=inp).logits
            tot += float(torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100, reduction="sum"))
            cnt += int((tgt != -100).sum())
        model.train()
        return tot / cnt

    curve, evals = [], []
    model.train()
    perm = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(args.seed))
    pos = 0
    t_train = time.time()
    for step in range(args.steps):
        if pos + args.batch > len(perm):
            perm = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(args.seed + step))
            pos = 0
        x = rows[perm[pos : pos + args.batch]].to(dev, non_blocking=True)
        pos += args.batch
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, aux = batch_loss(x)
        (loss + args.aux_loss * aux).backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == args.steps - 1:
            curve.append({"step": step, "loss": round(float(loss), 4), "aux": round(float(aux), 4), "lr": lr_at(step), "grad_norm": round(float(gn), 3)})
            if step % 100 == 0 or step == args.steps - 1:
                log(f"step {step} loss {float(loss):.4f} aux {float(aux):.3f} gn {float(gn):.2f} lr {lr_at(step):.2e} ({(time.time() - t_train) / (step + 1):.3f} s/step)")
        if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
            hl = held_loss()
            evals.append({"step": step + 1, "heldout_loss": round(hl, 4), "heldout_perplexity": round(math.exp(hl), 3)})
            log(f"  held-out loss {hl:.4f} ppl {math.exp(hl):.2f}")
    train_seconds = time.time() - t_train
    log(f"trained {args.steps} steps in {train_seconds:.0f} s")

    # ---- export: bf16 -> MLX 4-bit, exactly as make_fixtures.py writes checkpoints ----
    model = model.float().cpu().eval()
    sd = model.state_dict()
    weights = {}
    for name, shape, _ in mf.tensor_specs("gemma4", TEXT):
        t = sd["model." + name].detach().float().numpy()
        assert tuple(t.shape) == tuple(shape), (name, t.shape, shape)
        weights[name] = mf.f32_to_bf16_bits(t)
    known = {"model." + n for n, _, _ in mf.tensor_specs("gemma4", TEXT)} | {"lm_head.weight"}
    extra = [k for k in sd if k not in known and not k.endswith("embed_scale") and "rotary" not in k]
    assert not extra, f"state dict entries not exported: {extra}"
    qstats = {}
    tensors, overrides = mf.mlx_checkpoint(SPEC, weights, args.seed, qstats)
    tfv = transformers.__version__
    mlx_dir = os.path.join(args.out, "mlx")
    mf.write_mlx_dir(mlx_dir, tensors, 1)
    mf.write_json(os.path.join(mlx_dir, "config.json"), mf.mlx_config(SPEC, tfv, overrides))
    mf.write_json(os.path.join(mlx_dir, "generation_config.json"), mf.generation_config("gemma4", tfv))
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.out, "tokenizer", fn), os.path.join(mlx_dir, fn))
    template_path = os.path.join(args.data, "chat_template.jinja")
    if os.path.exists(template_path):
        shutil.copy(template_path, os.path.join(mlx_dir, "chat_template.jinja"))
    cfg_dir = os.path.join(args.out, "hf-config")
    os.makedirs(cfg_dir, exist_ok=True)
    mf.write_json(os.path.join(cfg_dir, "config.json"), mf.hf_config(SPEC, tfv))
    log(f"exported MLX 4-bit checkpoint: {os.path.getsize(os.path.join(mlx_dir, 'model.safetensors'))} bytes; quantization {qstats}")

    # ---- reference: transformers on the dequantized 4-bit weights, float32, eager, CPU ----
    torch.set_num_threads(args.threads)
    W = mf.weights_from_mlx(SPEC, mf.read_checkpoint_dir(mlx_dir))
    ref_model, info = mf.hf_text_model(SPEC, cfg_dir, W, log)
    ids = [BOS_ID] + encode(tok, held_text)
    nll_sum, count = 0.0, 0
    windows = perplexity_windows(len(ids), args.context, args.stride)
    with torch.no_grad():
        for begin, end, first in windows:
            logits = ref_model(input_ids=torch.tensor([ids[begin:end]]), use_cache=False).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            for t in range(first, end):
                nll_sum -= float(logp[t - begin - 1, ids[t]])
                count += 1
    ppl = math.exp(nll_sum / count)
    log(f"reference held-out: {count} tokens, nll {nll_sum / count:.5f}, perplexity {ppl:.4f}")

    prompts = [
        "Quote Genesis 1:3", "Tell me a fortune about cats", "Continue: And God said",
        "Quote John 3:16", "Quote Psalms 23:1", "Tell me a fortune about computers",
        "Continue: In the beginning", "Tell me a fortune",
    ]
    greedy = []
    with torch.no_grad():
        for p in prompts:
            rendered = f"<bos><|turn>user\n{p}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
            pids = encode(tok, rendered)
            out = ref_model(input_ids=torch.tensor([pids]), use_cache=True)
            pkv, last = out.past_key_values, out.logits[0, -1].double()
            gen, min_gap = [], float("inf")
            for _ in range(48):
                top2 = torch.topk(last, 2)
                min_gap = min(min_gap, float(top2.values[0] - top2.values[1]))
                nxt = int(top2.indices[0])
                gen.append(nxt)
                if nxt in STOP_IDS:
                    break
                out = ref_model(input_ids=torch.tensor([[nxt]]), past_key_values=pkv, use_cache=True)
                pkv, last = out.past_key_values, out.logits[0, -1].double()
            text = tok.decode(gen, skip_special_tokens=True)
            greedy.append({"prompt": p, "rendered": rendered, "prompt_ids": pids, "greedy": gen, "text": text, "min_logit_gap": round(min_gap, 5)})
            log(f"  {p!r} -> {text!r} (min gap {min_gap:.4f})")

    held_bf16 = evals[-1]["heldout_loss"] if evals else None
    reference = {
        "model": "redwing-demo (Gemma 4 MoE, trained by demo-model/train.py)",
        "weights": "dequantized MLX affine 4-bit (w = s*q + b in float32), exactly what the engine runs",
        "computed_with": {"class": info["class"], "dtype": "float32", "device": "cpu", "attn_implementation": info["attn_implementation"], "experts_implementation": info["experts_implementation"]},
        "perplexity": {
            "file": "heldout.txt", "bos": True, "context": args.context, "stride": args.stride,
            "tokens": count, "nll_per_token": nll_sum / count, "perplexity": ppl, "ids": ids,
        },
        "greedy": greedy,
        "stop_ids": STOP_IDS,
        "transformers_version": tfv, "torch_version": torch.__version__, "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "command": " ".join(["python3", "demo-model/train.py"] + sys.argv[1:]),
    }
    mf.write_json(os.path.join(args.out, "reference.json"), reference)
    import tokenizers

    training = {
        "data": data_info, "train_documents": len(train_docs), "train_tokens": n_train_tokens,
        "train_rows": int(rows.shape[0]), "heldout_rows": int(held_rows.shape[0]),
        "text_config": TEXT, "parameters": n_params,
        "hyperparameters": {k: getattr(args, k) for k in ("seed", "steps", "batch", "seq", "lr", "warmup", "aux_loss")} | {"optimizer": "AdamW(0.9, 0.95), weight decay 0.1 on matrices, grad clip 1.0, cosine to 10%", "precision": "bf16 autocast, float32 weights"},
        "tokens_seen": args.steps * args.batch * args.seq,
        "train_seconds": round(train_seconds, 1), "gpu": torch.cuda.get_device_name(0),
        "loss_curve": curve, "heldout_evals": evals, "heldout_loss_bf16": held_bf16,
        "quantization_stats": qstats, "reference_perplexity_4bit": ppl,
        "versions": {"transformers": tfv, "torch": torch.__version__, "tokenizers": tokenizers.__version__, "numpy": np.__version__},
        "command": reference["command"], "total_seconds": round(time.time() - t_start, 1),
    }
    mf.write_json(os.path.join(args.out, "training.json"), training)
    with open(os.path.join(args.out, "log.txt"), "w") as f:
        f.write("\n".join(log_lines) + "\n")
    log("done")


if __name__ == "__main__":
    main()
