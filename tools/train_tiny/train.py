#!/usr/bin/env python3
"""Train the tiny GLM-5.3-Flash-architecture model (models/tiny) on the GPU machine.

One invocation does everything (see docs/tiny-model.md):
  1. train a byte-level BPE tokenizer (GLM split regex + ByteLevel, GLM added-token names);
  2. build a small Glm5Next model with transformers' own classes and train it (AdamW, fp32 + TF32);
  3. save BF16 safetensors (the release's fp32 set kept fp32) + config.json + tokenizer files;
  4. reload the saved checkpoint as fp32 (eager attention, eager experts, no TF32) and write the
     held-out perplexity, golden logits (tests/data/tiny) and generated samples.

Inputs: .carry/corpus/train.jsonl (tools/train_tiny/make_corpus.py), tests/data/tiny/heldout.txt,
models/tiny/{tokenizer_config.json,chat_template.jinja} (static copies of the GLM-5.3 files).

usage: python3 tools/train_tiny/train.py --work /tmp/tiny --bundle $OUT [--budget-s 200] [--steps N]
       python3 tools/train_tiny/train.py --work /tmp/tiny --bundle $OUT --resume DIR   # eval only
"""

import argparse
import json
import math
import os
import shutil
import sys
import tarfile
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools", "oracle"))

import hf_patch  # noqa: E402  (causal tie-break for the indexer top-k, docs/oracle.md)
import transformers  # noqa: E402
from transformers.models.glm5_next import configuration_glm5_next as cfgmod  # noqa: E402
from transformers.models.glm5_next import modeling_glm5_next as mod  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SEED_INIT, SEED_DATA, SEED_SAMPLE = 1234, 5678, 42

# GLM-5.x pre-tokenizer split regex (docs: glm53-architecture.md section 11).
SPLIT_RE = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The 36 GLM-5.3 added tokens, in GLM order; the first 18 are special (tokenizer_config extra_special_tokens).
ADDED = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
         "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
         "<|end_of_video|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>",
         "<|end_of_transcription|>",
         "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>",
         "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>",
         "</arg_value>", "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>"]
N_SPECIAL = 18
VOCAB = 4096          # embedding rows (like GLM: base BPE + added tokens + unnamed reserved rows)
BASE_BPE = 4032       # BPE vocabulary incl. the 256 byte symbols; added tokens follow at 4032..4067

K, D = "linear_attention", "deepseek_sparse_attention"
TEXT_KW = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=8,
    layer_types=[K, K, D, D, K, K, D, K],
    # transformers hands a full layer's top-k only to the layer right after it: shared layer 3 follows full layer 2.
    indexer_types=["full", "full", "full", "shared", "full", "full", "full", "full"],
    mlp_layer_types=["dense", "dense"] + ["sparse"] * 6,
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=128, kv_lora_rank=128,
    qk_nope_head_dim=64, qk_rope_head_dim=0, v_head_dim=64,
    index_n_heads=4, index_head_dim=32, index_topk=64, index_kpool=4, index_kpool_always_select_tail=True,
    linear_num_heads=4, linear_head_dim=64, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
    n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, n_group=1, topk_group=1,
    norm_topk_prob=True, routed_scaling_factor=2.5, moe_intermediate_size=96, intermediate_size=640,
    swiglu_limit=10.0, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
    max_position_embeddings=1048576, bos_token_id=None,
)
TRAIN = dict(seq_len=512, batch=64, peak_lr=1.5e-3, min_lr_frac=0.1, warmup=30, wd=0.1, betas=(0.9, 0.95),
             clip=1.0, bias_update=1e-3)
# Tensors the BF16 release keeps in fp32 (glm53-architecture.md 10.1).
FP32_KEYS = ("hc_attn_", "hc_ffn_", "attn_hc.", "ffn_hc.", "A_log", "dt_bias", "conv1d", "e_score_correction_bias",
             "index_kpool_compress_ape")

_LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    _LOG.append(s)
    if ARGS is not None and ARGS.bundle:
        with open(os.path.join(ARGS.bundle, "log.txt"), "a") as f:
            f.write(s + "\n")


ARGS = None
REPORT = {}

# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(docs, path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BASE_BPE, min_frequency=2, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([d["text"] for d in docs], trainer=trainer)
    nb = tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in ADDED[:N_SPECIAL]])
    tok.add_tokens([AddedToken(c, special=False, normalized=False) for c in ADDED[N_SPECIAL:]])
    ids = [tok.token_to_id(c) for c in ADDED]
    assert ids == list(range(nb, nb + len(ADDED))), ids
    assert nb + len(ADDED) <= VOCAB
    tok.save(path)
    log(f"tokenizer: {nb} BPE tokens + {len(ADDED)} added (ids {nb}..{nb + len(ADDED) - 1}); embedding rows {VOCAB}")
    return tok


def load_tokenizer(path):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path)


# --------------------------------------------------------------------------- model


def text_model(model):
    for m in model.modules():
        if isinstance(m, mod.Glm5NextTextModel):
            return m
    raise RuntimeError("no Glm5NextTextModel inside")


def make_config(kw):
    tcfg = cfgmod.Glm5NextTextConfig(**kw)
    vis = cfgmod.Glm5NextVisionConfig(depth=1, hidden_size=32, num_heads=2, intermediate_size=32,
                                      out_hidden_size=kw["hidden_size"], projection_intermediate_size=32)
    ids = {n: VOCAB_IDS[c] for n, c in (("image_token_id", "<|image|>"), ("video_token_id", "<|video|>"),
                                         ("image_start_token_id", "<|begin_of_image|>"),
                                         ("image_end_token_id", "<|end_of_image|>"),
                                         ("video_start_token_id", "<|begin_of_video|>"),
                                         ("video_end_token_id", "<|end_of_video|>"))}
    try:
        return cfgmod.Glm5NextConfig(text_config=tcfg, vision_config=vis, **ids)
    except Exception as e:  # noqa: BLE001
        log("Glm5NextConfig with media ids failed, using defaults:", repr(e)[:200])
        return cfgmod.Glm5NextConfig(text_config=tcfg, vision_config=vis)


def build_model(kw, attn):
    cfg = make_config(kw)
    torch.manual_seed(SEED_INIT)
    cls = mod.Glm5NextForConditionalGeneration
    model = None
    for extra in (dict(attn_implementation=attn, experts_implementation="eager", dtype=torch.float32),
                  dict(attn_implementation=attn, dtype=torch.float32), dict(attn_implementation=attn)):
        try:
            model = cls._from_config(cfg, **extra)
            break
        except Exception as e:  # noqa: BLE001
            log(f"_from_config({list(extra)}) failed:", repr(e)[:200])
    if model is None:
        cfg._attn_implementation = attn
        model = cls(cfg)
    return model.float()


def is_visual(name):
    return ".visual." in name or name.startswith("visual.") or name.startswith("model.visual")


def count_params(model):
    tot = emb = experts = 0
    for n, p in model.named_parameters():
        if is_visual(n):
            continue
        tot += p.numel()
        if "embed_tokens" in n or n.startswith("lm_head"):
            emb += p.numel()
        if ".mlp.experts." in n:
            experts += p.numel()
    c = TEXT_KW
    n_moe = sum(1 for t in c["mlp_layer_types"] if t == "sparse")
    inactive = experts * (1 - c["num_experts_per_tok"] / c["n_routed_experts"]) if n_moe else 0
    return dict(total=tot, embeddings_and_lm_head=emb, routed_experts=experts, active_per_token=int(tot - inactive))


# --------------------------------------------------------------------------- data


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def token_stream(tok, docs, eot):
    encs = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
    out = []
    for e in encs:
        out.extend(e.ids)
        out.append(eot)
    return torch.tensor(out, dtype=torch.long)


# --------------------------------------------------------------------------- training


def lr_at(step, total):
    t = TRAIN
    if step < t["warmup"]:
        return t["peak_lr"] * (step + 1) / t["warmup"]
    frac = min(1.0, (step - t["warmup"]) / max(1, total - t["warmup"]))
    return t["peak_lr"] * (t["min_lr_frac"] + (1 - t["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * frac)))


def lm_loss(model, tm, x, y):
    h = tm(input_ids=x, use_cache=False).last_hidden_state
    logits = model.lm_head(h).float()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def window_nll(model, tm, ids, T, max_windows=None, batch=8):
    """Mean NLL over non-overlapping windows of T tokens (each window predicts its tokens 1..T-1)."""
    wins = [ids[i:i + T] for i in range(0, len(ids) - 1, T)]
    wins = [w for w in wins if len(w) >= 2]
    if max_windows:
        wins = wins[:max_windows]
    tot, n = 0.0, 0
    full = [w for w in wins if len(w) == T]
    rest = [w for w in wins if len(w) != T]
    groups = [full[i:i + batch] for i in range(0, len(full), batch)] + [[w] for w in rest]
    for g in groups:
        x = torch.tensor(g, dtype=torch.long, device=DEV)
        h = tm(input_ids=x[:, :-1], use_cache=False).last_hidden_state
        logits = model.lm_head(h).float()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        tot += float(nll)
        n += x[:, 1:].numel()
    return tot / max(n, 1), n


def train(model, stream, held_ids):
    t = TRAIN
    tm = text_model(model)
    model.to(DEV).train()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    for n, p in model.named_parameters():
        if is_visual(n):
            p.requires_grad_(False)
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "_hc." not in n and ".indexer." not in n else no_decay).append(p)
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=t["wd"]), dict(params=no_decay, weight_decay=0.0)],
                            lr=t["peak_lr"], betas=t["betas"], eps=1e-8)
    # Auxiliary-loss-free load balancing (DeepSeek-V3 style): nudge each router's selection bias.
    routers = [m for m in tm.modules() if isinstance(m, mod.Glm5NextTextTopkRouter)]
    rec = {}

    def hook(m, _inp, out):
        if m.training:
            rec[id(m)] = out[2].detach()
    for r in routers:
        r.register_forward_hook(hook)

    stream = stream.to(DEV)
    g = torch.Generator().manual_seed(SEED_DATA)
    T, B = t["seq_len"], t["batch"]
    ar = torch.arange(T + 1, device=DEV)
    total = ARGS.steps or 10 ** 9
    curve, t0, step, acc, nacc = [], time.time(), 0, 0.0, 0
    t_probe = None
    while step < total:
        starts = torch.randint(0, len(stream) - T - 1, (B,), generator=g).to(DEV)
        w = stream[starts[:, None] + ar]
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, total if total < 10 ** 9 else 2000)
        loss = lm_loss(model, tm, w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_([p for grp in opt.param_groups for p in grp["params"]], t["clip"])
        lv = float(loss)
        if not math.isfinite(lv):
            log(f"step {step}: non-finite loss {lv}; stopping")
            break
        opt.step()
        with torch.no_grad():
            for r in routers:
                idx = rec.get(id(r))
                if idx is not None:
                    load = torch.bincount(idx.reshape(-1), minlength=r.num_experts).float()
                    r.e_score_correction_bias += t["bias_update"] * torch.sign(load.mean() - load)
        rec.clear()
        step += 1
        acc += lv
        nacc += 1
        if step == 3:
            torch.cuda.synchronize()
            t_probe = time.time()
        if step == 8 and not ARGS.steps:
            torch.cuda.synchronize()
            per = (time.time() - t_probe) / 5
            left = ARGS.budget_s - (time.time() - t0)
            total = 8 + max(1, int(left / per * 0.95))
            log(f"step time {per * 1e3:.0f} ms ({B * T / per / 1e3:.0f}k tok/s): training {total} steps in "
                f"{ARGS.budget_s:.0f} s")
        if step % 25 == 0 or step == total:
            row = dict(step=step, loss=acc / nacc, lr=opt.param_groups[0]["lr"], grad_norm=float(gn),
                       elapsed_s=round(time.time() - t0, 1))
            if step % 100 == 0 or step == total:
                model.eval()
                row["heldout_loss"] = window_nll(model, tm, held_ids, T, max_windows=8)[0]
                model.train()
            curve.append(row)
            log("  " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
            acc, nacc = 0.0, 0
    loads = {}
    model.eval()
    with torch.no_grad():
        x = stream[:T].view(1, T)
        caps = {}

        def cap(m, _i, out):
            caps[id(m)] = out[2]
        hs = [r.register_forward_hook(cap) for r in routers]
        tm(input_ids=x, use_cache=False)
        for h in hs:
            h.remove()
        for i, r in enumerate(routers):
            ld = torch.bincount(caps[id(r)].reshape(-1), minlength=r.num_experts).float()
            loads[f"moe{i}"] = dict(min_frac=float(ld.min() / ld.sum()), max_frac=float(ld.max() / ld.sum()),
                                    bias_absmax=float(r.e_score_correction_bias.abs().max()))
    REPORT["train"] = dict(steps=step, seconds=round(time.time() - t0, 1), tokens=step * B * T,
                           corpus_tokens=len(stream), epochs=round(step * B * T / len(stream), 2),
                           curve=curve, expert_load_first_window=loads, config=TRAIN)
    log(f"trained {step} steps, {step * B * T / 1e6:.1f}M tokens, {time.time() - t0:.0f} s; expert loads {loads}")


# --------------------------------------------------------------------------- save


def save_checkpoint(model, outdir, tmpdir):
    from safetensors.torch import load_file, save_file
    if os.path.exists(tmpdir):
        shutil.rmtree(tmpdir)
    model.save_pretrained(tmpdir)
    files = sorted(os.listdir(tmpdir))
    log("save_pretrained files:", files)
    sd = load_file(os.path.join(tmpdir, "model.safetensors"))
    out = {}
    for k, v in sd.items():
        if is_visual(k):
            continue
        keep32 = any(s in k for s in FP32_KEYS)
        out[k] = v.float().contiguous() if keep32 else v.to(torch.bfloat16).contiguous()
    os.makedirs(outdir, exist_ok=True)
    save_file(out, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmpdir, "config.json")) as f:
        cfg = json.load(f)
    cfg["dtype"] = "bfloat16"
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"]["dtype"] = "bfloat16"
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    eos = [VOCAB_IDS["<|endoftext|>"], VOCAB_IDS["<|user|>"], VOCAB_IDS["<|observation|>"]]
    gen = {"_from_model_config": True, "eos_token_id": eos, "pad_token_id": eos[0], "temperature": 1.0,
           "top_p": 0.95, "transformers_version": transformers.__version__}
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2, sort_keys=True)
        f.write("\n")
    n32 = sum(1 for v in out.values() if v.dtype == torch.float32)
    log(f"saved {len(out)} tensors ({n32} fp32, rest bf16), "
        f"{os.path.getsize(os.path.join(outdir, 'model.safetensors')) / 1e6:.2f} MB -> {outdir}")


def bundle_model(outdir):
    """$OUT files are capped at 16 MiB: ship the safetensors in 15 MiB parts."""
    if not ARGS.bundle:
        return
    data = open(os.path.join(outdir, "model.safetensors"), "rb").read()
    part = 15 << 20
    for i in range(0, len(data), part):
        with open(os.path.join(ARGS.bundle, f"model.safetensors.part{i // part}"), "wb") as f:
            f.write(data[i:i + part])


def bundle_small(work):
    if not ARGS.bundle:
        return
    with open(os.path.join(work, "report.json"), "w") as f:
        json.dump(REPORT, f, indent=1)
    with tarfile.open(os.path.join(ARGS.bundle, "tiny_small.tgz"), "w:gz") as tf:
        for rel in ("models/tiny", "tests/data/tiny", "report.json"):
            p = os.path.join(work, rel)
            if os.path.exists(p):
                tf.add(p, arcname=rel, filter=lambda ti: None if ti.name.endswith("model.safetensors") else ti)


# --------------------------------------------------------------------------- eval + goldens


def load_saved(d):
    cls = mod.Glm5NextForConditionalGeneration
    err = None
    for extra in (dict(experts_implementation="eager"), {}):
        try:
            m, info = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                          output_loading_info=True, **extra)
            info = {k: [x for x in sorted(map(str, v)) if "visual" not in x][:40] for k, v in info.items() if v}
            return m.float().eval().to(DEV), info
        except Exception as e:  # noqa: BLE001
            err = e
            log(f"from_pretrained({list(extra)}) failed:", repr(e)[:300])
    raise err


@torch.no_grad()
def logits_of(model, toks, cache=None, use_cache=False):
    tm = text_model(model)
    ids = torch.tensor([toks], dtype=torch.long, device=DEV)
    out = tm(input_ids=ids, past_key_values=cache, use_cache=use_cache)
    return model.lm_head(out.last_hidden_state)[0].float(), out.past_key_values


def decode_logits(model, toks, n0):
    l0, cache = logits_of(model, toks[:n0], None, True)
    rows = [l0]
    for t in toks[n0:]:
        lt, cache = logits_of(model, [t], cache, True)
        rows.append(lt)
    return torch.cat(rows, 0)


def maxdiff(a, b):
    return float((a.double() - b.double()).abs().max())


def write_f32(path, t):
    with open(path, "wb") as f:
        f.write(t.detach().float().cpu().contiguous().numpy().astype("<f4").tobytes())


@torch.no_grad()
def generate(model, tok, prompt, n_new, temperature=0.0, top_p=1.0, seed=0):
    ids = tok.encode(prompt, add_special_tokens=False).ids
    g = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(n_new):
        lg = logits_of(model, ids)[0][-1].double().cpu()
        lg[BASE_N:] = -math.inf  # never emit added/reserved ids (never trained except <|endoftext|>)
        if temperature <= 0:
            nxt = int(lg.argmax())
        else:
            p = torch.softmax(lg / temperature, -1)
            sp, si = torch.sort(p, descending=True)
            keep = (sp.cumsum(0) - sp) < top_p
            sp = sp * keep
            nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=g)])
        ids.append(nxt)
    return tok.decode(ids, skip_special_tokens=False)


def evaluate(model_dir, work, tok):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)
    hf_patch.install(mod.Glm5NextTextIndexer)
    hf_patch.set_mode("causal")
    model, info = load_saved(model_dir)
    log("reload (fp32 from the bf16 file) loading info (visual keys omitted):", info)
    REPORT["reload_info"] = info
    tm = text_model(model)
    held = open(os.path.join(REPO, "tests", "data", "tiny", "heldout.txt"), encoding="utf-8").read()
    ids = tok.encode(held, add_special_tokens=False).ids
    nll, n = window_nll(model, tm, ids, 512)
    uni = math.log(VOCAB)
    REPORT["heldout"] = dict(chars=len(held), tokens=len(ids), window=512, predicted_tokens=n, mean_nll=nll,
                             perplexity=math.exp(nll), uniform_nll=uni, uniform_perplexity=VOCAB,
                             bits_per_byte=nll * n / math.log(2) / len(held.encode("utf-8")))
    log("held-out:", REPORT["heldout"])

    # goldens in the tests/data/oracle format (tools/oracle/make_goldens.py)
    gdir = os.path.join(work, "tests", "data", "tiny")
    os.makedirs(gdir, exist_ok=True)
    kw = TEXT_KW
    cases, checks = [], {}
    for name, off, n_tok, dfrom in (("heldout48_decode32", 0, 48, 32), ("heldout192_decode128", 2048, 192, 128)):
        toks = ids[off:off + n_tok]
        sparse = n_tok > kw["index_topk"] + kw["index_kpool"] - 1
        hf_patch.set_mode("causal")
        full = logits_of(model, toks)[0]
        dec = decode_logits(model, toks, dfrom)
        chk = dict(decode_vs_prefill=maxdiff(dec, full))
        hf_patch.set_mode("raw")
        chk["raw_vs_causal"] = maxdiff(logits_of(model, toks)[0], full)
        hf_patch.set_mode("causal")
        if sparse:
            m = kw["index_topk"] + 2 * kw["index_kpool"] + 1
            chk["prefix%d_vs_prefill" % m] = maxdiff(logits_of(model, toks[:m])[0], full[:m])
        fn = f"{name}.f32"
        write_f32(os.path.join(gdir, fn), full)
        cases.append(dict(name=name, tokens=toks, offset=off, decode_from=dfrom,
                          reference="hf_causal" if sparse else "hf", logits=fn, rows=n_tok, vocab=VOCAB,
                          sparse=sparse))
        checks[name] = chk
        log(f"  golden {name}: rows={n_tok} sparse={sparse} {chk}")
    with open(os.path.join(gdir, "goldens.json"), "w") as f:
        json.dump({"model": "models/tiny", "reference": "transformers %s, fp32 eager, bf16 weights upcast, "
                   "indexer top-k ties broken by pool index (tools/oracle/hf_patch.py causal mode)"
                   % transformers.__version__, "checks": checks, "cases": cases,
                   "heldout_tokens": ids}, f)
    REPORT["golden_checks"] = checks

    samples = []
    for prompt in ("The Python interpreter", "A list comprehension", "We the People of the United States",
                   "The import statement"):
        for temp, tp in ((0.0, 1.0), (0.8, 0.95)):
            txt = generate(model, tok, prompt, 60, temp, tp, SEED_SAMPLE)
            samples.append(dict(prompt=prompt, temperature=temp, top_p=tp, text=txt))
            log(f"  sample T={temp}: {txt!r}")
    REPORT["samples"] = samples
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(model_dir)
        r = at.apply_chat_template([{"role": "user", "content": "What is a class?"}], tokenize=False,
                                   add_generation_prompt=True)
        REPORT["chat_render"] = dict(text=r, ids=at(r, add_special_tokens=False)["input_ids"])
        log("  AutoTokenizer chat render:", REPORT["chat_render"])
    except Exception as e:  # noqa: BLE001
        log("  AutoTokenizer check failed:", repr(e)[:300])


# --------------------------------------------------------------------------- main

VOCAB_IDS = {}
BASE_N = BASE_BPE


def main():
    global ARGS, BASE_N
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/tiny")
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--corpus", default=os.path.join(REPO, ".carry", "corpus", "train.jsonl"))
    ap.add_argument("--budget-s", type=float, default=180.0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--resume", default=None, help="a saved models/tiny dir: skip training, eval only")
    ARGS = ap.parse_args()
    t0 = time.time()
    log("torch", torch.__version__, "transformers", transformers.__version__, "device",
        torch.cuda.get_device_name(0) if DEV.type == "cuda" else "cpu")
    mdir = os.path.join(ARGS.work, "models", "tiny")
    os.makedirs(mdir, exist_ok=True)
    for f in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(REPO, "models", "tiny", f), os.path.join(mdir, f))
    REPORT["text_config"] = TEXT_KW
    held = open(os.path.join(REPO, "tests", "data", "tiny", "heldout.txt"), encoding="utf-8").read()
    if ARGS.resume:
        for f in os.listdir(ARGS.resume):
            if f not in ("tokenizer_config.json", "chat_template.jinja"):
                shutil.copy(os.path.join(ARGS.resume, f), os.path.join(mdir, f))
        tok = load_tokenizer(os.path.join(mdir, "tokenizer.json"))
    else:
        docs = load_docs(ARGS.corpus)
        log(f"corpus: {len(docs)} documents, {sum(len(d['text']) for d in docs) / 1e6:.2f}M chars")
        tok = train_tokenizer(docs, os.path.join(mdir, "tokenizer.json"))
    for c in ADDED:
        VOCAB_IDS[c] = tok.token_to_id(c)
    BASE_N = VOCAB_IDS[ADDED[0]]
    TEXT_KW["pad_token_id"] = VOCAB_IDS["<|endoftext|>"]
    TEXT_KW["eos_token_id"] = [VOCAB_IDS["<|endoftext|>"], VOCAB_IDS["<|user|>"], VOCAB_IDS["<|observation|>"]]
    log(f"setup {time.time() - t0:.1f} s")
    if not ARGS.resume:
        stream = token_stream(tok, docs, VOCAB_IDS["<|endoftext|>"])
        held_ids = tok.encode(held, add_special_tokens=False).ids
        log(f"corpus tokens {len(stream)} ({sum(len(d['text']) for d in docs) / len(stream):.2f} chars/token); "
            f"held-out tokens {len(held_ids)}; tokenized at {time.time() - t0:.1f} s")
        model = build_model(TEXT_KW, "sdpa")
        assert model.lm_head.weight.data_ptr() != text_model(model).embed_tokens.weight.data_ptr()
        REPORT["params"] = count_params(model)
        log("params:", REPORT["params"])
        train(model, stream, held_ids)
        save_checkpoint(model, mdir, os.path.join(ARGS.work, "hf_fp32"))
        bundle_model(mdir)
        bundle_small(ARGS.work)
        del model
        torch.cuda.empty_cache()
        log(f"saved at {time.time() - t0:.1f} s")
    try:
        evaluate(mdir, ARGS.work, tok)
    except Exception:  # noqa: BLE001
        tb = traceback.format_exc()
        log("EVAL FAILED:\n" + tb)
        REPORT["eval_error"] = tb
    REPORT["total_s"] = round(time.time() - t0, 1)
    bundle_small(ARGS.work)
    log(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
