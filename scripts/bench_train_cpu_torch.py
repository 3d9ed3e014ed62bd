#!/usr/bin/python3
"""bench_train_cpu_torch.py: PyTorch's time for the job of `finetune --bench-train`
(examples/finetune/main.cpp) on the CPU, for issue 13's "training step beside PyTorch on the same
threads". taper is not imported. Run it with Debian's interpreter and Debian's python3-torch
(1.13.1): `/usr/bin/python3 scripts/bench_train_cpu_torch.py` (a pyenv `python3` on PATH has no
torch). Nothing from PyPI: Debian has no `transformers`, so the model is written here.

Model: a plain-PyTorch BERT with all-MiniLM-L6-v2's architecture (6 post-LN layers, hidden 384,
12 heads, intermediate 1536, GELU (erf), word + position + token-type embeddings and LayerNorm,
eps 1e-12), parameter names as HF's BertModel without the pooler, eager attention (q k^T / sqrt(d)
+ the additive mask, softmax, times v; HF's mask value finfo.min). Its weights come from
--model-dir's model.safetensors, read here (an 8-byte little-endian header length, the JSON
header, raw little-endian data): torch 1.13 has no safetensors reader. Hidden and attention
dropout are 0, as bench-train's default, so the dropout layers are left out (identities).
  train  zero_grad(set_to_none=True), forward, cross entropy, backward, AdamW.step(),
         loss.item(). logits = Linear(384, 6)(sqrt(384) * normalize(mean over the mask of the
         last hidden state)), all f32. AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay
         0.01 on rank >= 2 tensors, 0 on biases and LayerNorm weights (taper's param_groups).
         AdamW's implementation: --adamw foreach (default; the multi-tensor path) or single.
Inputs from --seed: ids uniform in [1000, 30000), mask all ones, token types 0, labels i % 6 (as
bench-train's). Default batch 16 x seq 64, the main job's; threads --threads (default
TAPER_NUM_THREADS, else 2) through torch.set_num_threads. --warmup steps (3), then --steps (20)
timed steps (wall clock per step): median, min, tokens/s = batch * seq / median, and the process
CPU time per step. --profile: torch.autograd.profiler over two more steps, the 16 ops with the
most self CPU time. --check: the pooled embeddings of tests/data/embedding_reference.txt's token
ids (sentence-transformers' reference, one padded batch and one by one) against the reference;
exits 1 above --tol (default 1e-5, max abs). --json PATH writes the results.
Usage: /usr/bin/python3 scripts/bench_train_cpu_torch.py [--check] [--steps 20] [--batch 16]
       [--seq-len 64] [--threads 2] [--profile] [--json /tmp/x.json]
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CLASSES, LR, WEIGHT_DECAY = 6, 3e-4, 0.01
ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


def read_safetensors(path):
    """{name: tensor} of a safetensors file (little-endian data; this host must be too)."""
    assert sys.byteorder == "little", "the safetensors data are little-endian"
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=ST_DTYPES[e["dtype"]]) if b > a else \
            torch.empty(0, dtype=ST_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


class SelfAttention(nn.Module):
    def __init__(self, e, heads):
        super().__init__()
        self.heads, self.d = heads, e // heads
        self.query, self.key, self.value = nn.Linear(e, e), nn.Linear(e, e), nn.Linear(e, e)

    def forward(self, x, mask):  # x (B, T, E), mask (B, 1, 1, T) additive
        b, t, e = x.shape

        def split(y):
            return y.view(b, t, self.heads, self.d).transpose(1, 2)  # (B, H, T, d)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + mask
        o = torch.matmul(torch.softmax(s, dim=-1), v)
        return o.transpose(1, 2).reshape(b, t, e)


class AttentionOutput(nn.Module):
    def __init__(self, e, eps):
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(e, e), nn.LayerNorm(e, eps=eps)

    def forward(self, h, x):
        return self.LayerNorm(self.dense(h) + x)


class Attention(nn.Module):
    def __init__(self, e, heads, eps):
        super().__init__()
        setattr(self, "self", SelfAttention(e, heads))  # HF's name: attention.self.query...
        self.output = AttentionOutput(e, eps)

    def forward(self, x, mask):
        return self.output(getattr(self, "self")(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, e, i):
        super().__init__()
        self.dense = nn.Linear(e, i)

    def forward(self, x):
        return F.gelu(self.dense(x))  # the erf form


class Output(nn.Module):
    def __init__(self, i, e, eps):
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(i, e), nn.LayerNorm(e, eps=eps)

    def forward(self, h, x):
        return self.LayerNorm(self.dense(h) + x)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        e, eps = c["hidden_size"], c["layer_norm_eps"]
        self.attention = Attention(e, c["num_attention_heads"], eps)
        self.intermediate = Intermediate(e, c["intermediate_size"])
        self.output = Output(c["intermediate_size"], e, eps)

    def forward(self, x, mask):
        a = self.attention(x, mask)
        return self.output(self.intermediate(a), a)


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        e = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], e, padding_idx=c.get("pad_token_id"))
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], e)
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], e)
        self.LayerNorm = nn.LayerNorm(e, eps=c["layer_norm_eps"])

    def forward(self, ids, types):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.word_embeddings(ids) + self.token_type_embeddings(types) + \
            self.position_embeddings(pos)
        return self.LayerNorm(x)


class Bert(nn.Module):
    """HF's BertModel (add_pooling_layer=False, eager attention, no dropout)."""

    def __init__(self, c):
        super().__init__()
        assert c.get("hidden_act", "gelu") == "gelu" and \
            c.get("position_embedding_type", "absolute") == "absolute", c
        self.embeddings = Embeddings(c)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))

    def forward(self, ids, mask, types):
        m = mask[:, None, None, :].to(torch.float32)
        add = (1.0 - m) * torch.finfo(torch.float32).min  # HF's extended attention mask
        h = self.embeddings(ids, types)
        for layer in self.encoder.layer:
            h = layer(h, add)
        return h

    @staticmethod
    def from_pretrained(model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        bert = Bert(c)
        w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
        w = {k[5:] if k.startswith("bert.") else k: v for k, v in w.items()}
        ignored = {k for k in w if k.startswith("pooler.") or k == "embeddings.position_ids"}
        state = {k: v.to(torch.float32) for k, v in w.items() if k not in ignored}
        missing, unexpected = bert.load_state_dict(state, strict=False)
        assert not missing and not unexpected, f"missing {missing}, unexpected {unexpected}"
        return bert


def embed(bert, ids, mask, types):
    """sentence-transformers' embedding: the mean over the mask, L2-normalised (eps 1e-12)."""
    h = bert(ids, mask, types)
    m = mask.unsqueeze(-1).to(h.dtype)
    return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1, eps=1e-12)


def check(bert, tol):
    """Max abs difference of the pooled embeddings against tests/data/embedding_reference.txt."""
    sents = []
    with open(os.path.join(ROOT, "tests/data/embedding_reference.txt")) as f:
        for line in f:
            key, _, rest = line.partition(" ")
            if key == "ids":
                sents.append([[int(x) for x in rest.split()], None])
            elif key == "embedding":
                sents[-1][1] = torch.tensor([float(x) for x in rest.split()], dtype=torch.float64)
    bert.eval()
    worst_one = worst_batch = 0.0
    with torch.no_grad():
        t = max(len(i) for i, _ in sents)
        ids = torch.zeros(len(sents), t, dtype=torch.long)
        mask = torch.zeros(len(sents), t, dtype=torch.long)
        for r, (i, _) in enumerate(sents):
            ids[r, :len(i)] = torch.tensor(i)
            mask[r, :len(i)] = 1
        batch = embed(bert, ids, mask, torch.zeros_like(ids)).double()
        for r, (i, ref) in enumerate(sents):
            x = torch.tensor([i])
            one = embed(bert, x, torch.ones_like(x), torch.zeros_like(x))[0].double()
            worst_one = max(worst_one, (one - ref).abs().max().item())
            worst_batch = max(worst_batch, (batch[r] - ref).abs().max().item())
    bert.train()
    ok = max(worst_one, worst_batch) <= tol
    print(f"check: {len(sents)} sentences of tests/data/embedding_reference.txt "
          f"(sentence-transformers): max abs difference {worst_one:.2e} one by one, "
          f"{worst_batch:.2e} in one padded batch of {len(sents)} x {t}; tolerance {tol:g}: "
          f"{'ok' if ok else 'FAILED'}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description="PyTorch (CPU) beside finetune --bench-train")
    ap.add_argument("--model-dir", default=os.path.join(ROOT, ".models/all-MiniLM-L6-v2"))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("TAPER_NUM_THREADS", "0") or 0) or 2)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--adamw", choices=("foreach", "single"), default="foreach")
    ap.add_argument("--check", action="store_true", help="compare with the reference embeddings")
    ap.add_argument("--check-only", action="store_true", help="--check, then exit")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--profile", action="store_true", help="per-op profile of two more steps")
    ap.add_argument("--json", default="", help="write the results to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    bert = Bert.from_pretrained(args.model_dir)
    if (args.check or args.check_only) and not check(bert, args.tol):
        sys.exit(1)
    if args.check_only:
        return
    b, t = args.batch, args.seq_len
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(1000, 30000, (b, t), generator=g)
    labels = torch.arange(b) % CLASSES
    mask = torch.ones(b, t, dtype=torch.long)
    types = torch.zeros(b, t, dtype=torch.long)
    hidden = bert.embeddings.word_embeddings.embedding_dim
    head = nn.Linear(hidden, CLASSES)
    bert.train()
    params = [p for mod in (bert, head) for p in mod.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            foreach=args.adamw == "foreach")
    last = {"loss": float("nan")}

    def step():
        opt.zero_grad(set_to_none=True)
        out = head(embed(bert, ids, mask, types) * math.sqrt(hidden))
        loss = F.cross_entropy(out, labels)
        loss.backward()
        opt.step()
        last["loss"] = loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    c0 = time.process_time()
    for _ in range(max(1, args.steps)):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    cpu = (time.process_time() - c0) / len(times)
    med = statistics.median(times)
    print(f"torch-train: MiniLM-L6 + head (f32, cpu, torch {torch.__version__}, AdamW "
          f"{args.adamw}) batch {b} x seq {t}, {torch.get_num_threads()} threads: median "
          f"{1e3 * med:.2f} ms per step over {len(times)} steps (min {1e3 * min(times):.2f}) -> "
          f"{b * t / med:.0f} tokens/s; process CPU time {1e3 * cpu:.2f} ms per step; last loss "
          f"{last['loss']:.4f}", flush=True)
    if args.profile:
        with torch.autograd.profiler.profile() as prof:
            for _ in range(2):
                step()
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in rows) / 2e3
        print(f"torch-train: per-op profile of two steps (autograd profiler): {total:.2f} ms of "
              "self CPU time per step; the largest:")
        for e in rows[:16]:
            print(f"  {e.key:<34} {e.count / 2:6.0f} calls {e.self_cpu_time_total / 2e3:8.3f} ms "
                  "per step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": b, "seq": t, "threads": torch.get_num_threads(),
                       "median_ms": 1e3 * med, "min_ms": 1e3 * min(times),
                       "tokens_per_s": b * t / med, "cpu_ms": 1e3 * cpu,
                       "times_ms": [1e3 * x for x in times], "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
