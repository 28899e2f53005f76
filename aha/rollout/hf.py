"""Sampling loop over any transformers causal LM, with a KV cache and no wasted rows.

Why not `model.generate`: a GRPO step samples n completions of each prompt, so the prompt is
prefilled once and its cache repeated n times; rows that hit EOS are dropped from the batch
(cache included) instead of decoding padding until the longest row ends; and where a call has more rows than
`max_batch`, the waiting prompts' rows can join the batch as rows leave it (`Cohorts`, with AHA_ADMIT_FRACTION
set), so the weights read by each decode step serve a nearly full batch, not a shrinking one per chunk.

Three caches behind one interface. `LayerCache` serves decoders with the Llama layout (Llama, Qwen2,
Qwen3, Mistral, SmolLM2): it runs the model's own modules (norms, projections, MLPs, rotary and attention
functions) wired as the decoder layer wires them, with keys and values written in place into buffers
allocated once, so a decode step copies one column, not the whole cache, and the rotary tables and
attention mask are not rebuilt by the model each step; on CPU its decode step multiplies by weights prepacked
for oneDNN and runs attention as two batched products over contiguous buffers (`packed_weights`,
`decode_attention`: decode steps 1.1-1.7x faster than with the model's own Linear and SDPA, benchmarks/decode_step.py), with keys
and values in bf16 under bf16 autocast, as autocast's attention reads them. `GraphCache` is the same
on a GPU with static shapes, each decode step replayed from a CUDA graph (a small batch's step is
otherwise bound by launching dozens of small kernels per layer). `HFCache` serves every other causal LM
through `model(...)` and transformers' growing DynamicCache.
"""

from __future__ import annotations

import math
import os
import sys
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..models.load import attention_kernels, cache_arg, context_length, cpu_flags
from .base import GroupCallback, Rollout, SamplingParams, TurnCallback

CACHE_CHUNK = 128
"""Key/value columns LayerCache starts with past the prompt and adds at least when full (it grows by an eighth):
its memory, copies and attention reads follow the filled length, not max_new_tokens."""
COMPACT_FRACTION = 0.125
"""Drop finished rows from the batch once they are this fraction of it (each drop copies the cache)."""


def _fraction(name: str, default: str) -> float:
    """A number from 0 to 1 in environment variable `name`."""
    text = os.environ.get(name, default)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise ValueError(f"{name}={text!r}: expected a number from 0 to 1")
    return value


ADMIT_FRACTION = _fraction("AHA_ADMIT_FRACTION", "1")
"""Start waiting rows once the batch has room for this fraction of max_batch (AHA_ADMIT_FRACTION in the environment;
1, the default: only once the batch is done, one batch after another). Each start adds a cohort (`Cohorts`), whose
attention costs a decode step a dozen more small operations per layer: 0.25 generated 1.2-1.6x the tokens/s of
whole batches where rows end at scattered lengths (a 4M model, 512-token budget) and 0.84-1.02x where most rows
run to the cap on a 30-layer model (SmolLM2-135M on GSM8K; BENCHMARKS.md, "Waiting rows join the batch")."""
MAX_COHORTS = 4
"""Most cohorts in a batch: past it the two youngest merge (the shorter's columns right-aligned to the other's)."""

PACK_MIN_FLOAT32, PACK_MIN_INPUTS = 2**16, 256
"""A float32 product runs from a prepacked weight only for weights of at least 2^16 elements and 256 inputs: oneDNN's
call costs about 18 us however small (benchmarks/packed_linear.py), so a tiny weight alone is faster through
PyTorch's Linear. In a decode step the 4m model (inputs 256 and 512) generated 1.04-1.29x the tokens/s with all its
products prepacked (its q/k/v then one product) than with only those of 2^18 elements and up, in 8 of 8
alternating runs, and 2^17 fell between; the demo's model (inputs 128) generated 1-11% fewer tokens/s with its
[768, 128] gate/up and [512, 128] head prepacked, in 5 of 5 (benchmarks/generation.py --size 4m / small). In
bfloat16 the prepacked product was the faster at every size measured. Every row count uses it: a weight called once
alone (packed_linear.py, in cache) multiplies one row faster through PyTorch's matrix-vector path, but a decode step
streams all of a larger model's weights from memory, and there one row's step ran 1.5x faster prepacked
(benchmarks/decode_step.py, 30m: 9-10 against 14-15 ms)."""

LAYER_CACHE_TYPES = ("llama", "qwen2", "qwen3", "mistral")
"""model_type values whose decoder is embed -> layers(h, mask, rotary) -> norm -> lm_head."""


def decode_attention(query: Tensor, key: Tensor, value: Tensor, bias: Tensor, scaling: float) -> Tensor:
    """One query token against a contiguous cache: softmax(q k^T * scaling + bias) v, autocast off. query [m,H,1,D],
    key/value [m,Hkv,S,D] (a group of H/Hkv query heads shares one key/value head), bias [m,1,1,S]; returns
    [m,1,H*D] in the query's dtype. A float32 cache: `batched_attention`. A bfloat16 cache: PyTorch's SDPA on a CPU
    with AMX (`sdpa_decodes_bf16`), else the batched products too (BENCHMARKS.md, "Decode attention in bfloat16")."""
    m, H, _, D = query.shape
    with torch.autocast(query.device.type, enabled=False):
        if key.dtype != torch.bfloat16 or not sdpa_decodes_bf16():
            return batched_attention(query.to(key.dtype), key, value, bias, scaling).to(query.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            query.to(key.dtype), key, value, attn_mask=bias.to(key.dtype), scale=scaling, enable_gqa=H != key.shape[1])
    return out.transpose(1, 2).reshape(m, 1, H * D).to(query.dtype)


def batched_attention(query: Tensor, key: Tensor, value: Tensor, bias: Tensor, scaling: float) -> Tensor:
    """`decode_attention` as two batched matrix products in the cache's dtype, the softmax in float32 (`torch.bmm` on
    3-d views, as `matmul` would call it, without matmul's own reshaping; each key/value head read once for its
    group): on CPU they read a contiguous float32 cache faster than PyTorch's SDPA kernel for one query
    (benchmarks/decode_step.py, benchmarks/decode_attention.py). Returns [m,1,H*D] in the cache's dtype."""
    m, H, _, D = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    q = query.reshape(m * Hkv, H // Hkv, D)                                              # [m*Hkv,g,D]
    scores = torch.bmm(q, key.reshape(m * Hkv, S, D).transpose(1, 2)).float()            # [m*Hkv,g,S]
    scores.mul_(scaling).view(m, Hkv, H // Hkv, S).add_(bias)
    out = torch.bmm(scores.softmax(-1).to(value.dtype), value.reshape(m * Hkv, S, D))   # [m*Hkv,g,D]
    return out.view(m, 1, H * D)


def sdpa_decodes_bf16() -> bool:
    """Does PyTorch's SDPA attend one bf16 query faster than two batched products on this CPU? On machine E (Intel,
    AMX) it did at every shape measured (1.05-3.8x; there a bf16 `bmm` copies the transposed keys); on machine F (AMD
    Zen 5: AVX512-BF16, no AMX) it was 2.5-18x slower at every shape (benchmarks/decode_attention.py). So: where the
    CPU has AMX."""
    return "amx_bf16" in cpu_flags()


def onednn_bf16() -> bool:
    """Does oneDNN multiply bfloat16 on this CPU? It needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT: on an AVX2-only
    CPU (or with ONEDNN_MAX_CPU_ISA=AVX2) it refuses to prepack bf16 weights, and bf16 products stay PyTorch's."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def packed_weights(lm) -> dict:
    """{(Linear, ...): their weights side by side in oneDNN's blocked layout} for the products of a decode step
    (each layer's q/k/v projections as one product, o, gate/up as one, down; the head), on CPU (else {}). A
    decode step multiplies a few rows by each whole weight; oneDNN's Linear on a weight packed once runs those
    products up to 2x faster at 16 rows and up to 3x at 4 than PyTorch's Linear (MKL), whose path for a few rows
    is the slow one here (benchmarks/packed_linear.py), and fusing them makes 4 calls of a layer's 7. In bfloat16
    under CPU autocast, as autocast's Linear computes, where the CPU has oneDNN's bf16 products (an AVX2-only CPU
    has not: there the bf16 products stay PyTorch's). A copy of those weights for each generate call (one more copy
    of the model while it decodes), so it always matches the policy. A group with a module that is not a
    plain Linear (a LoRA wrapper) is left out: its modules run themselves."""
    if next(lm.parameters()).device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return {}
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    groups = [(lm.lm_head,)]
    for layer in lm.get_decoder().layers:
        attn, mlp = layer.self_attn, layer.mlp
        groups += [(attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,), (mlp.gate_proj, mlp.up_proj),
                   (mlp.down_proj,)]
    bf16 = onednn_bf16()
    out = {}
    for group in groups:
        if any(type(m) is not torch.nn.Linear for m in group):
            continue
        kind, size = dtype or group[0].weight.dtype, sum(m.weight.numel() for m in group)
        large = size >= PACK_MIN_FLOAT32 and group[0].in_features >= PACK_MIN_INPUTS
        if not (kind == torch.bfloat16 and bf16 or kind == torch.float32 and large):
            continue  # decided before copying: a group left out costs nothing
        w = torch.cat([m.weight.detach() for m in group]).to(kind)
        b = None if group[0].bias is None else torch.cat([m.bias.detach() for m in group]).to(w.dtype)
        out[group] = (torch.ops.mkldnn._reorder_linear_weight(w, 16), b, w.dtype, [m.out_features for m in group])
    return out


def on_device(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on `device` (sampling needs one on the logits' device), seeded from `generator` where it is
    elsewhere."""
    if generator is None or generator.device.type == device.type:
        return generator
    return torch.Generator(device).manual_seed(int(torch.randint(2**63 - 1, (1,), generator=generator)))


def tempered(logits: Tensor, temperature: float) -> Tensor:
    """logits / temperature, as the trainer scales them (temperature 0, greedy, and 1 leave them as they are)."""
    return logits if temperature in (0, 1) else logits / temperature


def sample_tokens(logits: Tensor, params: SamplingParams,
                  generator: torch.Generator | None = None) -> Tensor:
    """Next token [m] from logits [m,V]: greedy at temperature 0, else tempered top-k/top-p sampling."""
    if params.temperature == 0:
        return logits.argmax(-1)
    logits = tempered(logits, params.temperature)
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]           # [m,1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)      # [m,V]
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= params.top_p  # keep the smallest prefix reaching top_p (as HF's)
        drop[:, 0] = False                               # and always the top token
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class HFCache:
    """Any causal LM: `model(...)` with transformers' cache, the attention mask grown each step."""

    fixed_rows = False
    admits_rows = False
    """True where new rows can join a running batch (`Cohorts`); else they start the next batch."""

    def __init__(self, model, mask: Tensor, max_new_tokens: int):
        self.model, self.mask, self.cache = model, mask, None                   # mask [m,L]
        self.arg = cache_arg(model)

    def forward(self, ids: Tensor, pos: Tensor) -> Tensor:
        """Logits [m,V] of the last position; ids and pos [m,q] (the prompt, then one token)."""
        if self.cache is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(ids), 1)], dim=-1)
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                         use_cache=True, logits_to_keep=1, **{self.arg: self.cache})
        self.cache = getattr(out, self.arg)
        return out.logits[:, -1].float()

    def repeat(self, n: int) -> None:
        self.cache.batch_repeat_interleave(n)
        self.mask = self.mask.repeat_interleave(n, 0)

    def select(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]


class LayerCache:
    """Llama-layout decoders: the model's modules, keys and values written into preallocated buffers.

    Each layer is `h + attention(norm(h))`, then `h + mlp(norm(h))`, as the model's decoder layer computes it
    (the same modules and functions in the same order, so with the model's own Linear and attention the same
    numbers: tests/test_rollout.py compares them exactly), without the layer's per-call keyword plumbing: on CPU
    1.12-1.15x the tokens/s for a 4M model, nothing measurable for a 30M one (0.99-1.01x;
    benchmarks/layer_wiring.py). `update(k, v, layer)` writes the new columns in place. The mask is additive,
    [m,1,q,S]; columns not yet written are zeros and masked, so a decode step can attend over whole buffers.
    """

    fixed_rows = False
    """True where finished rows must stay in the batch (their outputs are ignored)."""
    admits_rows = True
    zero_tail = False
    """True where every decode step reads the unwritten columns (GraphCache's static step): they are kept zeros."""

    def __init__(self, model, mask: Tensor, max_new_tokens: int, chunk: int = CACHE_CHUNK,
                 packed: dict | None = None):
        """packed: `packed_weights` of this model from an earlier prompt chunk of the same generate call
        (None: pack now)."""
        self.lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.decoder = self.lm.get_decoder()
        cfg, (P, L) = self.lm.config, mask.shape
        param = next(self.lm.parameters())
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cap = L + min(max_new_tokens, chunk)  # grown on demand: memory follows the filled length
        shape = (P, cfg.num_key_value_heads, cap, head_dim)
        self.cpu_kernels = param.device.type == "cpu"
        """Decode with prepacked weights (`packed_weights`) and `decode_attention`, the faster kernels on CPU."""
        autocast = self.cpu_kernels and torch.is_autocast_enabled("cpu")  # keys and values as autocast's attention reads them
        kv = torch.get_autocast_dtype("cpu") if autocast and param.is_floating_point() else param.dtype
        self.k = [param.new_empty(shape, dtype=kv) for _ in self.decoder.layers]
        self.v = [param.new_empty(shape, dtype=kv) for _ in self.decoder.layers]
        self.whole = self.cpu_kernels and kv == torch.bfloat16 and not sdpa_decodes_bf16()
        """A decode step attends over the whole buffers, their unwritten columns zeros and masked: a bf16 `bmm`
        copies a slice of them first (AMD Zen 5, 16 rows x 313 of 441 columns: 774 us against 134 over the whole
        buffer), a float32 one does not."""
        self.end = 0                                                             # filled columns
        self.blocked = torch.finfo(param.dtype).min
        self.bias = torch.empty((P, cap), dtype=param.dtype, device=mask.device)  # [m,cap] additive key mask
        self._clear_tail(0)
        self.bias[:, :L].masked_fill_(mask.bool(), 0)                           # 0 = visible
        code = sys.modules[type(self.decoder.layers[0].self_attn).__module__]  # the model's modeling_*.py
        self.rotate_half = code.rotate_half  # as the model's apply_rotary_pos_emb uses it (`_rotary`)
        own = cfg._attn_implementation
        self.attend = code.eager_attention_forward if own == "eager" else ALL_ATTENTION_FUNCTIONS[own]
        self.packed = {} if not self.cpu_kernels else packed_weights(self.lm) if packed is None else packed

    @staticmethod
    def supports(model, total_len: int) -> bool:
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = lm.config
        window = getattr(cfg, "sliding_window", None)
        windowed = window is not None and window < total_len and (
            getattr(cfg, "use_sliding_window", True)
            or "sliding_attention" in (getattr(cfg, "layer_types", None) or ()))
        return (cfg.model_type in LAYER_CACHE_TYPES and not windowed
                and getattr(cfg, "_attn_implementation", "eager") in ("sdpa", "eager")
                and hasattr(lm.get_decoder(), "rotary_emb"))

    def update(self, k: Tensor, v: Tensor, layer: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Writes the new columns; attention reads the filled columns in place (a view of the buffers)."""
        end = self.end + k.shape[2]  # forward() made room for these columns
        self.k[layer][:, :, self.end:end] = k
        self.v[layer][:, :, self.end:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def forward(self, ids: Tensor, pos: Tensor) -> Tensor:
        q, end = ids.shape[1], self.end + ids.shape[1]
        self._room(end)
        if q == 1:  # decode: the new column is visible to every row
            bias = self._open()                                                  # [m,1,1,end]
        else:  # prefill (after kept columns, if any): causal too; a padding query sees itself, so no row is all -inf
            bias = self.bias[:, None, None, :end]                                # [m,1,1,S]
            causal = torch.ones(q, end, dtype=torch.bool, device=ids.device).tril(end - q)
            itself = torch.eye(q, end, dtype=torch.bool, device=ids.device).roll(end - q, 1)  # query j: column end-q+j
            seen = causal & ((bias[:, :, 0] == 0) | itself)
            bias = torch.zeros_like(seen, dtype=bias.dtype).masked_fill(~seen, self.blocked)[:, None]
        logits = self._logits(ids, pos, bias)
        self.end = end
        return logits

    def _room(self, end: int) -> None:
        """Buffers with at least `end` columns: grown by an eighth (at least CACHE_CHUNK) when full."""
        if end > self.bias.shape[1]:
            cap = self.bias.shape[1]
            self._resize(len(self.bias), max(end, cap + max(CACHE_CHUNK, cap // 8)))  # O(8 x filled) copies in all

    def _open(self) -> Tensor:
        """A decode step's mask [m,1,1,end+1]: column `end` (room made for it) visible to every row."""
        self.bias[:, self.end] = 0
        return self.bias[:, None, None, :self.end + 1]

    def _logits(self, ids: Tensor, pos: Tensor, bias: Tensor) -> Tensor:
        """The model's layers over ids [m,q] at positions pos [m,q] with additive mask bias: last logits [m,V]."""
        h = self.decoder.embed_tokens(ids)                                       # [m,q,d]
        cos, sin = (x[:, None] for x in self.decoder.rotary_emb(h, pos))           # [m,1,q,D], every head's
        for i, layer in enumerate(self.decoder.layers):
            h = h + self._attention(layer.self_attn, layer.input_layernorm(h), cos, sin, bias, i)
            h = h + self._mlp(layer.mlp, layer.post_attention_layernorm(h))
        return self._products(self.decoder.norm(h[:, -1]), self.lm.lm_head)[0].float()

    def _products(self, x: Tensor, *mods) -> list[Tensor]:
        """[mod(x) for mod in mods], as one product where they are prepacked together."""
        if mods not in self.packed:
            return [m(x) for m in mods]
        out = self._packed(x, mods)
        return out.split(self.packed[mods][3], -1) if len(mods) > 1 else [out]

    def _packed(self, x: Tensor, mods: tuple) -> Tensor:
        """The prepacked product of `mods` (a key of self.packed): their outputs side by side."""
        w, b, dtype, _ = self.packed[mods]
        return torch.ops.mkldnn._linear_pointwise(x.to(dtype), w, b, "none", [], "")

    def _rotary(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """The model's rotary embedding of x [m,heads,q,D] (cos, sin [m,1,q,D]), the same operations as its
        apply_rotary_pos_emb on one tensor."""
        return (x * cos) + (self.rotate_half(x) * sin)

    def _mlp(self, mlp, x: Tensor) -> Tensor:
        """The Llama-layout MLP, down(act(gate(x)) * up(x)), through `_products`."""
        gate, up = self._products(x, mlp.gate_proj, mlp.up_proj)
        return self._products(mlp.act_fn(gate) * up, mlp.down_proj)[0]

    def _attention(self, attn, x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor, layer: int) -> Tensor:
        """The attention block of one layer on normed input x [m,q,d], as the model's attention module runs it
        (Qwen3's per-head q/k norms included), keys and values through this cache."""
        heads, mods = (*x.shape[:-1], -1, attn.head_dim), (attn.q_proj, attn.k_proj, attn.v_proj)  # [m,q,H,D]
        if mods in self.packed and not hasattr(attn, "q_norm"):  # q, k, v side by side: q and k rotate as one
            kv = attn.k_proj.out_features // attn.head_dim                       # Hkv
            y = self._packed(x, mods).view(heads).transpose(1, 2)                # [m,H+2Hkv,q,D]
            qk = self._rotary(y[:, :-kv], cos, sin)
            q, k, v = qk[:, :-kv], qk[:, -kv:], y[:, -kv:]
        else:
            q, k, v = (y.view(heads) for y in self._products(x, *mods))
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = (self._rotary(q.transpose(1, 2), cos, sin), self._rotary(k.transpose(1, 2), cos, sin),
                       v.transpose(1, 2))
        return self._products(self._attend(attn, q, k, v, bias, layer), attn.o_proj)[0]

    def _attend(self, attn, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, layer: int) -> Tensor:
        """Attention of q [m,H,q,D] over this cache, the new keys and values k, v [m,Hkv,q,D] written in: [m,q,H*D]."""
        k, v = self.update(k, v, layer)
        if self.cpu_kernels and q.shape[2] == 1:
            if self.whole:
                k, v, bias = self.k[layer], self.v[layer], self.bias[:, None, None]
            return decode_attention(q, k, v, bias, attn.scaling)
        out, _ = self.attend(attn, q, k, v, bias, dropout=0.0, scaling=attn.scaling)
        return out.reshape(*out.shape[:2], -1)

    def load(self, kept: list, start: int) -> None:
        """Row i's kept columns (`kept[i]`, a `Kept` or None) written right-aligned to column `start`, where its
        mask already shows them; the prefill that follows writes from `start` on. The columns left of a shorter
        kept cache are masked, and zeros, not whatever the buffer held (0 x NaN is NaN)."""
        for x in self.k + self.v:
            x[:, :, :start].zero_()
        for i, hit in enumerate(kept):
            if hit is not None:
                for mine, theirs in zip(self.k + self.v, hit.k + hit.v):
                    mine[i, :, start - hit.length:start] = theirs
        self.end = start

    def columns(self, row: int, count: int) -> tuple[list[Tensor], list[Tensor]]:
        """Keys and values [Hkv,count,D] of each layer at batch row `row`'s first `count` visible columns: its
        context's tokens, then those it generated and fed back (a finished row's later columns are ignored)."""
        at = (self.bias[row, :self.end] == 0).nonzero().squeeze(-1)[:count]
        return [k[row][:, at] for k in self.k], [v[row][:, at] for v in self.v]

    def repeat(self, n: int | Tensor) -> None:
        """Row i becomes n (or n[i]) rows sharing its cache (one each: nothing to copy)."""
        if bool((torch.as_tensor(n) == 1).all()):
            return
        m = len(self.bias) * n if isinstance(n, int) else int(n.sum())
        self._resize(m, self.bias.shape[1], lambda x: x.repeat_interleave(n, 0))

    def select(self, rows: Tensor) -> None:
        self._resize(len(rows), self.bias.shape[1], lambda x: x.index_select(0, rows))

    def merge(self, other: "LayerCache") -> None:
        """Appends `other`'s rows: both caches' filled columns right-aligned to the longer one's (the shorter's rows
        attend over the extra columns, masked)."""
        end, cap = max(self.end, other.end), max(self.bias.shape[1], other.bias.shape[1])

        def kv(x: Tensor, y: Tensor) -> Tensor:                                  # [m,H,cap,D]
            out = x.new_zeros((len(x) + len(y), x.shape[1], cap, x.shape[3]))
            out[:len(x), :, end - self.end:end] = x[:, :, :self.end]
            out[len(x):, :, end - other.end:end] = y[:, :, :other.end]
            return out

        bias = self.bias.new_full((len(self.bias) + len(other.bias), cap), self.blocked)
        bias[:len(self.bias), end - self.end:end] = self.bias[:, :self.end]
        bias[len(self.bias):, end - other.end:end] = other.bias[:, :other.end]
        self.k, self.v = [kv(x, y) for x, y in zip(self.k, other.k)], [kv(x, y) for x, y in zip(self.v, other.v)]
        self.bias, self.end = bias, end

    def _resize(self, m: int, cap: int, rows=lambda x: x) -> None:
        """Buffers of m rows and cap columns holding `rows(...)` of the filled columns: the copy costs the
        filled length, never max_new_tokens."""
        end = self.end

        def kv(x: Tensor) -> Tensor:                                             # [m,H,cap,D]
            out = x.new_empty((m, x.shape[1], cap, x.shape[3]))
            out[:, :, :end] = rows(x[:, :, :end])
            return out

        bias = self.bias.new_empty((m, cap))                                     # [m,cap]
        bias[:, :end] = rows(self.bias[:, :end])
        self.k, self.v, self.bias = [kv(x) for x in self.k], [kv(x) for x in self.v], bias
        self._clear_tail(end)

    def _clear_tail(self, start: int) -> None:
        """Columns from `start` on are unwritten: masked (attention reads only the filled ones), and zeros where a
        decode step reads them (`whole`, `zero_tail`; 0 x NaN is NaN)."""
        self.bias[:, start:] = self.blocked
        if self.whole or self.zero_tail:
            for x in self.k + self.v:
                x[:, :, start:].zero_()


class Cohorts(LayerCache):
    """Rows that started at different decode steps, decoded as one batch: one LayerCache per cohort (the rows
    admitted together). A step's products run once over every row, and each cohort attends over its own
    columns, so a row that joins late reads none of the columns of the rows that started before it. Each cohort
    costs a step its own attention calls, so past MAX_COHORTS the youngest merge. A prompt whose rows start in
    two cohorts is prefilled in each."""

    def __init__(self, first: LayerCache):
        for name in ("lm", "decoder", "cpu_kernels", "rotate_half", "attend", "packed"):  # what _logits uses
            setattr(self, name, getattr(first, name))
        self.parts = [first]

    def admit(self, ids: Tensor, mask: Tensor, pos: Tensor, counts: Tensor, kept: list) -> Tensor:
        """A new cohort: prompts prefilled (`Prefill`: ids [p,q] at positions pos after their kept columns, mask
        [p,L]), counts[i] rows of prompt i appended to the batch. The prompts' logits [p,V]."""
        new = LayerCache(self.lm, mask, CACHE_CHUNK, packed=self.packed)  # room to decode: no copy at its first step
        new.load(kept, mask.shape[1] - ids.shape[1])
        logits = new.forward(ids, pos)                                           # [p,V]
        new.repeat(counts)
        self.parts.append(new)
        self._bound()
        return logits

    def forward(self, ids: Tensor, pos: Tensor) -> Tensor:
        """A decode step (ids, pos [m,1]) of every cohort's rows, in order."""
        for part in self.parts:
            part._room(part.end + 1)
        logits = self._logits(ids, pos, [part._open() for part in self.parts])
        for part in self.parts:
            part.end += 1
        return logits

    def _attend(self, attn, q: Tensor, k: Tensor, v: Tensor, bias: list[Tensor], layer: int) -> Tensor:
        out, start = [], 0
        for part, b in zip(self.parts, bias):
            rows = slice(start, start + len(part.bias))
            out.append(part._attend(attn, q[rows], k[rows], v[rows], b, layer))
            start = rows.stop
        return torch.cat(out)

    def columns(self, row: int, count: int) -> tuple[list[Tensor], list[Tensor]]:
        for part in self.parts:
            if row < len(part.bias):
                return part.columns(row, count)
            row -= len(part.bias)
        raise IndexError("no such row in the batch")

    def select(self, rows: Tensor) -> None:
        parts, start = [], 0
        for part in self.parts:
            m = len(part.bias)
            mine = rows[(rows >= start) & (rows < start + m)] - start
            if 0 < len(mine) < m:
                part.select(mine)
            if len(mine):
                parts.append(part)
            start += m
        self.parts = parts
        self._bound()

    def _bound(self) -> None:
        """At most MAX_COHORTS cohorts: the youngest merge into one (their columns right-aligned)."""
        while len(self.parts) > MAX_COHORTS:
            younger = self.parts.pop()
            self.parts[-1].merge(younger)


class GraphCache(LayerCache):
    """LayerCache with static shapes, for CUDA graphs: room for every token from the start, rows kept to the
    end (a finished row's tokens are ignored), and each decode step written at a column held in a device
    tensor, attending over the first `bucket` columns (the next power of two >= 128 past the filled length,
    unwritten columns masked). One graph per bucket is captured when decoding first reaches it, then replayed
    each step: no Python or kernel launches per layer. `capture=False` runs the same static step eagerly (the
    CPU tests compare it with LayerCache)."""

    fixed_rows = True
    admits_rows = False  # static shapes
    zero_tail = True     # the static step attends over unwritten columns too: masked, and zeros, not NaN
    MIN_BUCKET = 128

    def __init__(self, model, mask: Tensor, max_new_tokens: int, capture: bool = True, packed: dict | None = None):
        super().__init__(model, mask, max_new_tokens, chunk=max_new_tokens, packed=packed)
        self.capture = capture
        self.graphs: dict[int, tuple] = {}  # bucket -> (graph, logits it writes)
        self.pool = None                     # one memory pool shared by the graphs
        self.column = None                   # [1] long: the column a decode step writes
        self.bucket = 0                      # columns the step being run attends over

    def update(self, k: Tensor, v: Tensor, layer: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if self.column is None:  # prefill: as LayerCache
            return super().update(k, v, layer)
        self.k[layer].index_copy_(2, self.column, k.to(self.k[layer].dtype))  # bf16 under autocast
        self.v[layer].index_copy_(2, self.column, v.to(self.v[layer].dtype))
        return self.k[layer][:, :, :self.bucket], self.v[layer][:, :, :self.bucket]

    def forward(self, ids: Tensor, pos: Tensor) -> Tensor:
        if ids.shape[1] > 1 or self.end == 0:
            return super().forward(ids, pos)
        cap = self.bias.shape[1]
        if self.end >= cap:
            raise ValueError(f"GraphCache is full: {cap} columns")
        bucket = min(cap, max(self.MIN_BUCKET, 1 << self.end.bit_length()))  # > end
        if self.column is None:  # first decode step: the static inputs
            self.column = torch.zeros(1, dtype=torch.long, device=ids.device)
            self.tok, self.pos = torch.zeros_like(ids), torch.zeros_like(pos)
        self.column.fill_(self.end)
        self.tok.copy_(ids)
        self.pos.copy_(pos)
        if not self.capture:
            logits = self._step(bucket)
        else:
            if bucket not in self.graphs:
                self.graphs[bucket] = self._capture(bucket)
            graph, logits = self.graphs[bucket]
            graph.replay()
            logits = logits.clone()
        self.end += 1
        return logits

    def _step(self, bucket: int) -> Tensor:
        """One decode step on the static inputs: logits [m,V] of token `tok` at column `column`."""
        self.bucket = bucket
        self.bias.index_fill_(1, self.column, 0)  # the new column is visible to every row
        return self._logits(self.tok, self.pos, self.bias[:, None, None, :bucket])  # mask [m,1,1,bucket]

    def _capture(self, bucket: int) -> tuple:
        """A CUDA graph of `_step(bucket)`, warmed up once on a side stream (that run writes the same column
        the replay then writes again)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._step(bucket)
        self.pool = graph.pool()
        return graph, logits


class Kept:
    """A row's keys and values [Hkv,length,D] of each layer: those of the first `length` tokens of its context."""

    def __init__(self, length: int, k: list[Tensor], v: list[Tensor]):
        self.length, self.k, self.v = length, k, v


class KeptCaches:
    """The caches of rows that ended, by the tokens they hold (`HFEngine.keep_caches`): at most `limit` rows. Looked up
    by length and last TAIL tokens (a few operations per kept length, not a pass over each prefix), then checked
    token for token."""

    TAIL = 8

    def __init__(self, limit: int):
        self.limit, self.count, self.by_tail = limit, 0, {}                      # (length, tail) -> [(tokens, Kept)]
        self.lengths: list[int] | None = None                                   # kept lengths, longest first

    def __len__(self) -> int:
        return self.count

    def full(self) -> bool:
        return self.count >= self.limit

    def put(self, tokens: list[int], k: list[Tensor], v: list[Tensor]) -> None:
        n = len(tokens)
        same = self.by_tail.setdefault((n, tuple(tokens[max(0, n - self.TAIL):])), [])
        if all(tokens != other for other, _ in same):  # greedy samples of one prompt may hold the same tokens
            same.append((tokens, Kept(n, k, v)))
            self.count, self.lengths = self.count + 1, None

    def find(self, context: list[int]) -> Kept | None:
        """The longest kept cache of a prefix of `context` that leaves at least one token to prefill."""
        if self.lengths is None:
            self.lengths = sorted({n for n, _ in self.by_tail}, reverse=True)
        for n in self.lengths:
            if n < len(context):
                for tokens, hit in self.by_tail.get((n, tuple(context[max(0, n - self.TAIL):n])), ()):
                    if tokens == context[:n]:
                        return hit
        return None


def prefill_plan(contexts: list[list[int]], hits: list[Kept | None], pad: int) -> tuple:
    """What prefilling `contexts` computes, past the kept cache of each (`hits`: a `Kept` of a prefix of it, or None):
    ids [P,q] of the tokens after it (left-padded), the mask [P,C+q] of its kept columns (right-aligned to column C,
    the longest kept) then those tokens, and their positions [P,q]."""
    done = [0 if h is None else h.length for h in hits]
    P, C, q = len(contexts), max(done), max(len(p) - c for p, c in zip(contexts, done))
    ids = torch.full((P, q), pad, dtype=torch.long)                              # [P,q]
    mask = torch.zeros((P, C + q), dtype=torch.long)                             # [P,C+q]
    for i, (p, c) in enumerate(zip(contexts, done)):
        ids[i, q - len(p) + c:] = torch.tensor(p[c:], dtype=torch.long)
        mask[i, C - c:C] = 1
        mask[i, C + q - len(p) + c:] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)[:, C:]


class HFEngine:
    """Generates with the policy module itself, so weight updates need no copy (an Engine)."""

    def __init__(self, model, eos_token_ids: list[int], pad_token_id: int, max_batch: int = 512,
                 layer_cache: bool = True, cuda_graphs: bool | None = None):
        self.model = model
        self.version = 0
        self.layer_cache = layer_cache
        """False forces `HFCache` even where `LayerCache` would serve (for comparisons)."""
        self.cuda_graphs = os.environ.get("AHA_CUDA_GRAPHS", "1") != "0" if cuda_graphs is None else cuda_graphs
        """On a CUDA device, decode Llama-layout models with `GraphCache` (False, or AHA_CUDA_GRAPHS=0 in the
        environment: `LayerCache`, eager)."""
        self.eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long)
        self.pad = pad_token_id
        self.max_batch = max_batch
        """Most sequences decoded at once; prompts are chunked to stay under it."""
        self.kept: KeptCaches | None = None
        """Within `keep_caches`: the caches the last generate call kept (None: caches are not kept)."""

    @classmethod
    def for_model(cls, model, tokenizer, max_batch: int = 512, eos_token_ids: list[int] | None = None,
                  **options) -> "HFEngine":
        """An engine that stops on every EOS the tokenizer and the generation config name, or on `eos_token_ids`
        where given ([]: never, every row runs to max_new_tokens); `options` are __init__'s (layer_cache,
        cuda_graphs), and one it does not take is a TypeError naming it."""
        from ..models import eos_ids
        eos = eos_ids(model, tokenizer) if eos_token_ids is None else eos_token_ids
        return cls(model, eos, tokenizer.pad_token_id, max_batch, **options)

    def update_weights(self, model, version: int) -> None:
        """The engine shares the policy's parameters: nothing is copied; the module is rebound (it may be
        a new object) and the version recorded, so each Rollout says which weights sampled it."""
        self.model, self.version = model, version
        if self.kept is not None:  # computed by the old weights
            self.kept = KeptCaches(self.max_batch)

    @contextmanager
    def keep_caches(self):
        """Within it, each generate call keeps the key/value cache of every row as the row ends (its context and
        every token it generated but the last, which was sampled, never fed), and the next call prefills, of a
        context that extends a kept cache, only the tokens after it: an episode's next turn prefills only what
        its tools and the template's turn markers added. A kept cache lives one call: the next call reads it or
        never will, and frees it once all its rows have started; all are freed on leaving. At most max_batch rows'
        caches are kept (what one full decode batch holds): rows past it prefill their whole context. Llama-layout
        models (LayerCache, GraphCache); other models prefill whole contexts. Decode and prefill kernels round differently, so a
        kept cache gives log-probs equal to a re-prefill's only to rounding (tests/test_kv_turns.py)."""
        self.kept = KeptCaches(self.max_batch)
        try:
            yield self
        finally:
            self.kept = None

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, params: SamplingParams,
                 generator: torch.Generator | None = None, on_group: GroupCallback | None = None,
                 on_turn_end: TurnCallback | None = None, limits: list[int] | None = None) -> Rollout:
        """n completions per prompt, prompt-major (see Rollout); `on_group(i, rollout)` as each prompt's n finish.
        At most max_batch rows decode at once (at least one prompt's n rows: they start together). Rows that do
        not fit wait, and start the next batch once the running one is done, or (LayerCache, with ADMIT_FRACTION
        < 1) join it as a cohort as its rows finish. `limits`: each row's most new tokens (at most max_new_tokens).
        `on_turn_end` (not with on_group): a row whose turn ends may go on with a next context, which rejoins the
        running batch at the next decode step as a cohort, prefilling only the tokens past the row's own cache
        (a cache that cannot take rows in: at the next batch); the Rollout then holds each row's last turn. A prompt
        + max_new_tokens past the model's context is an error."""
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise ValueError("generate needs at least one prompt and no empty prompt")
        longest, ctx, T = max(map(len, prompt_ids)), context_length(self.model), params.max_new_tokens
        if ctx and longest + T > ctx:
            raise ValueError(f"a prompt of {longest} tokens + max_new_tokens {T} exceeds the "
                             f"model's context of {ctx} tokens")
        if on_group is not None and on_turn_end is not None:
            raise ValueError("generate takes on_group or on_turn_end, not both")
        if limits is not None and (len(limits) != len(prompt_ids) * n or not all(1 <= x <= T for x in limits)):
            raise ValueError(f"limits: one per row ({len(prompt_ids) * n}), each from 1 to max_new_tokens {T}")
        was_training = self.model.training
        self.model.eval()
        try:
            return self._decode(prompt_ids, n, params, generator, on_group, on_turn_end, limits)
        finally:
            self.model.train(was_training)

    def _decode(self, prompts: list[list[int]], n: int, params: SamplingParams, generator: torch.Generator | None,
                on_group: GroupCallback | None, on_turn_end: TurnCallback | None, limits: list[int] | None) -> Rollout:
        """The decode loop of one generate call. Buffers are indexed by output row (prompt i's samples are rows
        i*n..i*n+n-1, then the spent row: `_buffers`); `rows` lists the batch's rows in the cache's order."""
        device, own, kept = next(self.model.parameters()).device, self.kept is not None, self._turn_over()
        P, T, M = len(prompts), params.max_new_tokens, len(prompts) * n
        total = max(map(len, prompts)) + T                                      # the longest row a cache holds
        generator, eos = on_device(generator, device), self.eos.to(device)
        out, length, done, limit, logp = self._buffers(M, T, limits, params.logprobs, device)
        reported = torch.zeros(P, dtype=torch.bool, device=device)              # [P] groups given to on_group
        rows = torch.zeros(0, dtype=torch.long, device=device)                  # [m] output row of each batch row
        contexts, going_on = [prompts[r // n] for r in range(M)], []  # each row's context; next turns (`_go_on`)
        cache, packed, started = None, None, 0                                   # rows started: 0..started-1
        while True:
            admits = cache is None or cache.admits_rows
            joining, going_on = (going_on, []) if admits else ([], going_on)
            room = self.max_batch - len(rows) if len(rows) else max(1, self.max_batch // n) * n  # whole prompts
            least = max(1, int(ADMIT_FRACTION * self.max_batch)) if len(rows) else 1
            fresh = started < M and room >= least and admits and not joining
            if joining or fresh:  # start rows (a new batch if none): the next turns that wait, or the next prompts
                new_rows = (torch.tensor([r for r, _ in joining], dtype=torch.long, device=device) if joining else
                            torch.arange(started, min(M, started + room), device=device))
                cache, new_logits, new_pos = self._admit(cache, self._starts(joining, new_rows, prompts, n, contexts,
                                                                             kept), T, total, packed)
                packed, started = getattr(cache, "packed", None), started + (0 if joining else len(new_rows))
                kept = kept if started < M else None  # every row started: the last call's caches are free to go
                logits, next_pos = ((new_logits, new_pos) if not len(rows) else
                                    (torch.cat([logits, new_logits]), torch.cat([next_pos, new_pos])))
                rows = torch.cat([rows, new_rows])
            tok = sample_tokens(logits, params, generator)                      # [m]
            live = ~done[rows] & (length[rows] < limit[rows])                    # [m]
            at, new_tok = rows[live], tok[live]                                  # [k] rows that take a token
            col = length[at]
            out[at, col] = new_tok
            if logp is not None:  # as the trainer computes it: log_softmax(logits / temperature)
                scaled = tempered(logits, params.temperature)
                logp[at, col] = scaled.log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)[live]
            length[at] = col + 1
            done[at[torch.isin(new_tok, eos)]] = True
            if on_group is not None:
                self._report(on_group, reported, out[:M], length[:M], done[:M], limit[:M], logp, n)
            if on_turn_end is not None:  # within keep_caches (`own`) a next turn prefills past the row's own cache
                going_on += self._go_on(on_turn_end, at, cache if own else None, rows, contexts, out, length, done,
                                        limit, logp, total)
            finished = done[rows] | (length[rows] == limit[rows])                # [m]
            if bool(finished.all()):
                self._keep(cache, torch.arange(len(rows)), rows, contexts, out, length)
                if started == M and not going_on:
                    break
                cache, rows = None, rows[:0]  # the next rows start a new batch
                continue
            if not cache.fixed_rows and (finished.sum() >= max(1, COMPACT_FRACTION * len(rows))
                                         or len(rows) + len(going_on) > self.max_batch):
                self._keep(cache, finished.nonzero().squeeze(-1), rows, contexts, out, length)
                keep = (~finished).nonzero().squeeze(-1)
                cache.select(keep)
                rows, tok, next_pos = rows[keep], tok[keep], next_pos[keep]
            logits = cache.forward(tok[:, None], next_pos[:, None])
            next_pos = next_pos + 1
        return self._rows(out, length, done, logp, slice(0, M))

    def _buffers(self, M: int, T: int, limits: list[int] | None, logprobs: bool, device) -> tuple:
        """The decode loop's buffers for M output rows and one more, the spent row, which a batch row points at once
        its output row has gone on to a next turn (`_go_on`) and which never decodes: tokens [M+1,T], their count
        [M+1], ended with EOS [M+1], most tokens [M+1] (`limits`, else T) and log-probs [M+1,T] (or None)."""
        out = torch.full((M + 1, T), self.pad, dtype=torch.long, device=device)
        length = torch.zeros(M + 1, dtype=torch.long, device=device)
        done = torch.zeros(M + 1, dtype=torch.bool, device=device)
        done[M] = True
        limit = torch.tensor((limits or [T] * M) + [T], dtype=torch.long, device=device)
        return out, length, done, limit, torch.zeros((M + 1, T), device=device) if logprobs else None

    @staticmethod
    def _starts(joining: list, rows: Tensor, prompts: list[list[int]], n: int, contexts: list[list[int]],
                kept: KeptCaches | None) -> list[tuple]:
        """What `_admit` starts for output rows `rows`: the next turns that wait (`joining`: (row, its own Kept or
        None)), one row each, or else prompts' rows, each prompt once with its rows and its longest kept cache."""
        if joining:
            return [(contexts[r], 1, hit) for r, hit in joining]
        index, counts = torch.unique_consecutive(rows // n, return_counts=True)
        return [(prompts[i], c, kept.find(prompts[i]) if kept is not None else None)
                for i, c in zip(index.tolist(), counts.tolist())]

    def _go_on(self, on_turn_end: TurnCallback, at: Tensor, cache, rows: Tensor, contexts: list[list[int]],
               out: Tensor, length: Tensor, done: Tensor, limit: Tensor, logp: Tensor | None, total: int) -> list:
        """Hand the turns of output rows `at` that ended at this step to on_turn_end; each row that goes on is reset
        for its next turn (its context and limit set, its batch row pointed at the spent row, so it decodes no more
        there) and returned with its own cache (a `Kept`) where its next context extends the tokens that `cache`
        holds for it (None: nothing is read from it)."""
        ended = at[done[at] | (length[at] == limit[at])]                         # [e]
        if not len(ended):
            return []
        nexts = on_turn_end(ended.tolist(), self._rows(out, length, done, logp, ended))
        spent, T, going = len(out) - 1, out.shape[1], []
        for r, follow in zip(ended.tolist(), nexts):
            if follow is None:
                continue
            context, most = follow
            if not 1 <= most <= T or len(context) + most > total:
                raise ValueError(f"a next turn of {len(context)} tokens + {most} new ones: at most {T} new ones and "
                                 f"{total} in all (the longest prompt + max_new_tokens)")
            i = int((rows == r).nonzero()[0])
            held = contexts[r] + out[r, :int(length[r]) - 1].tolist()  # the last token was sampled, never fed
            hit = None
            if isinstance(cache, LayerCache) and len(context) > len(held) and context[:len(held)] == held:
                hit = Kept(len(held), *cache.columns(i, len(held)))
            rows[i], contexts[r], length[r], done[r], limit[r] = spent, context, 0, False, most
            going.append((r, hit))
        return going

    def _report(self, on_group: GroupCallback, reported: Tensor, out: Tensor, length: Tensor, done: Tensor,
                limit: Tensor, logp: Tensor | None, n: int) -> None:
        """on_group(i, its rollout) for each prompt whose n rows have all finished since the last report."""
        for g in ((done | (length == limit)).view(-1, n).all(1) & ~reported).nonzero().squeeze(-1).tolist():
            reported[g] = True
            on_group(g, self._rows(out, length, done, logp, slice(g * n, (g + 1) * n)))

    def _turn_over(self) -> KeptCaches | None:
        """Within keep_caches: the caches the last call kept (this call reads them), and an empty store for this
        call's; else None."""
        if self.kept is None:
            return None
        kept, self.kept = self.kept, KeptCaches(self.max_batch)
        return kept

    def _keep(self, cache, leaving: Tensor, rows: Tensor, contexts: list[list[int]], out: Tensor,
              length: Tensor) -> None:
        """Within keep_caches: the caches of batch rows `leaving` kept, each by the tokens it holds (its context and
        every token it generated but the last); batch rows of the spent row hold a turn that went on, not kept."""
        if self.kept is None or not isinstance(cache, LayerCache):
            return
        for i in leaving.tolist():
            if self.kept.full():
                return
            r = int(rows[i])
            if r < len(contexts):
                tokens = contexts[r] + out[r, :int(length[r]) - 1].tolist()
                self.kept.put(tokens, *cache.columns(i, len(tokens)))

    def _admit(self, cache, starts: list[tuple], T: int, total: int, packed: dict | None) -> tuple:
        """Start rows: `starts` lists (context, rows of it, its kept cache or None), each context prefilled once
        past its kept cache (`prefill_plan`): in a new cache (cache None; its weights prepacked as `packed`) or as
        a new cohort of `cache`'s batch. The cache, the rows' logits [k,V] and their next positions [k]."""
        device = next(self.model.parameters()).device
        contexts, counts, hits = (list(x) for x in zip(*starts))
        if cache is None and not self._fast(total):
            hits = [None] * len(hits)                                            # HFCache keeps nothing
        ids, mask, pos = (x.to(device) for x in prefill_plan(contexts, hits, self.pad))  # [P,q], [P,C+q], [P,q]
        counts = torch.tensor(counts, device=device)
        with attention_kernels(device):  # the prefill's width changes with the prompts; decode steps' shapes repeat
            if cache is not None:
                cache = cache if isinstance(cache, Cohorts) else Cohorts(cache)
                logits = cache.admit(ids, mask, pos, counts, hits)               # [P,V]
            else:
                cache = self._cache(mask, T, total, packed)
                if any(h is not None for h in hits):
                    cache.load(hits, mask.shape[1] - ids.shape[1])
                logits = cache.forward(ids, pos)                                 # [P,V]
                if int(counts[0]) > 1:  # prefill once per prompt, then share the cache among its n samples
                    cache.repeat(int(counts[0]))
        return cache, logits.repeat_interleave(counts, 0), mask.sum(-1).repeat_interleave(counts, 0)

    def _fast(self, total: int) -> bool:
        """Whether this model decodes through LayerCache, for rows of `total` tokens at most."""
        return self.layer_cache and LayerCache.supports(self.model, total)

    def _cache(self, mask: Tensor, T: int, total: int, packed: dict | None):
        """A cache for prompts `mask` [P,L] and T new tokens: LayerCache for the Llama layout (GraphCache on a GPU
        with CUDA graphs on), HFCache for every other model, and for a sliding-window model where some row of the
        call (`total`: its longest prompt + T; rows may join this cache later) passes the window."""
        fast = self._fast(total)
        if fast and self.cuda_graphs and mask.device.type == "cuda":
            return GraphCache(self.model, mask, T, packed=packed)
        return LayerCache(self.model, mask, T, packed=packed) if fast else HFCache(self.model, mask, T)

    def _rows(self, out: Tensor, length: Tensor, done: Tensor, logp: Tensor | None, part: slice | Tensor) -> Rollout:
        """The Rollout of output rows `part`, from the decode loop's buffers."""
        out, length, done = out[part].cpu(), length[part].tolist(), done[part].cpu()
        logp = None if logp is None else logp[part].cpu()
        return Rollout(completion_ids=[o[:k].tolist() for o, k in zip(out, length)], truncated=(~done).tolist(),
                       version=self.version,
                       logprobs=None if logp is None else [x[:k].tolist() for x, k in zip(logp, length)])
