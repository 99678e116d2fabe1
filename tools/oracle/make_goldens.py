#!/usr/bin/env python3
"""Build small random glm5_next models with transformers and write logits goldens.

Runs on the GPU box (torch + transformers installed). One invocation does everything:
dump the installed reference sources, run the causality trap probe (trap_probe.py),
build the models, save checkpoints, compute raw and causal-patched logits, self-check,
and write tests/data/oracle-style output. See docs/oracle.md.

usage: python3 tools/oracle/make_goldens.py --out /tmp/oracle [--bundle $OUT]
"""

import argparse
import copy
import inspect
import json
import os
import random
import re
import shutil
import sys
import tarfile
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import hf_patch  # noqa: E402
import release_layout  # noqa: E402

import transformers  # noqa: E402
from transformers.models.glm5_next import configuration_glm5_next as cfgmod  # noqa: E402
from transformers.models.glm5_next import modeling_glm5_next as mod  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CAUSAL_TOL = 1e-4      # max |diff| allowed between prefill / decode / prefix under the patch
SAME_TOL = 1e-6        # raw vs patched where nothing is sparse

# --------------------------------------------------------------------------- setup


def setup_determinism():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True, warn_only=True)


def log(*a):
    print(*a, flush=True)


def text_cfg_fields():
    base = cfgmod.Glm5NextTextConfig()
    return set(base.to_dict().keys()) | set(getattr(cfgmod.Glm5NextTextConfig, "__dataclass_fields__", {}).keys())


def model_class():
    for n in ("Glm5NextTextForCausalLM", "Glm5NextForCausalLM"):
        if hasattr(mod, n):
            return n, getattr(mod, n)
    return "Glm5NextForConditionalGeneration", mod.Glm5NextForConditionalGeneration


def indexer_class():
    if hasattr(mod, "Glm5NextTextIndexer"):
        return mod.Glm5NextTextIndexer
    cands = [getattr(mod, n) for n in dir(mod) if n.endswith("Indexer") and "Kmeans" not in n]
    assert cands, "no indexer class in the installed modeling file"
    return cands[0]


def make_config(text_kw):
    fields = text_cfg_fields()
    unknown = [k for k in text_kw if k not in fields]
    if unknown:
        log("WARNING: config keys not in Glm5NextTextConfig fields (dropped):", unknown)
    tcfg = cfgmod.Glm5NextTextConfig(**{k: v for k, v in text_kw.items() if k not in unknown})
    cls_name, cls = model_class()
    if cls_name != "Glm5NextForConditionalGeneration":
        return tcfg, cls_name, cls, False
    vis = None
    for vkw in (dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32,
                     out_hidden_size=text_kw["hidden_size"], projection_intermediate_size=32),
                dict(depth=1, hidden_size=32, num_heads=2, out_hidden_size=text_kw["hidden_size"]),
                dict(depth=1)):
        try:
            vis = cfgmod.Glm5NextVisionConfig(**vkw)
            break
        except Exception as e:  # noqa: BLE001
            log("vision config attempt failed:", repr(e)[:200])
    strip = vis is None
    cfg = cfgmod.Glm5NextConfig(text_config=tcfg, vision_config=vis) if vis is not None else \
        cfgmod.Glm5NextConfig(text_config=tcfg)
    return cfg, cls_name, cls, strip


def build_model(text_kw):
    cfg, cls_name, cls, strip = make_config(text_kw)
    model = None
    for extra in (dict(attn_implementation="eager", experts_implementation="eager", dtype=torch.float32),
                  dict(attn_implementation="eager", dtype=torch.float32), dict(attn_implementation="eager")):
        try:
            model = cls._from_config(cfg, **extra)
            break
        except Exception as e:  # noqa: BLE001
            log(f"_from_config({list(extra)}) failed:", repr(e)[:200])
    if model is None:
        cfg._attn_implementation = "eager"
        model = cls(cfg)
    force_eager(model)
    model = model.float().eval()
    return model, cls_name, cls, strip


def force_eager(model):
    """Eager attention and the reference per-expert loop (no grouped GEMM in reduced precision)."""
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:  # noqa: BLE001
            log("set_experts_implementation failed:", repr(e)[:200])
    for sub in model.modules():
        c = getattr(sub, "config", None)
        if c is not None and getattr(c, "_experts_implementation", "eager") != "eager":
            try:
                c._experts_implementation = "eager"
            except Exception:  # noqa: BLE001
                pass


def impl_report(model):
    c = text_model(model).config
    return {"attn": getattr(c, "_attn_implementation", None), "experts": getattr(c, "_experts_implementation", None)}


def text_model(model):
    for m in model.modules():
        if isinstance(m, mod.Glm5NextTextModel):
            return m
    raise RuntimeError("no Glm5NextTextModel inside")


def text_prefix(model):
    tm = text_model(model)
    for n, m in model.named_modules():
        if m is tm:
            return n + "." if n else ""
    raise RuntimeError


# --------------------------------------------------------------------------- weights


def randomize(model, seed):
    """Overwrite every float parameter and buffer with non-zero random values."""
    g = torch.Generator().manual_seed(seed)
    items = dict(model.named_parameters())
    for n, b in model.named_buffers():
        if b.is_floating_point():
            items[n] = b
    hidden = text_model(model).config.hidden_size
    with torch.no_grad():
        for name in sorted(items):
            t = items[name]
            shape = t.shape

            def nrm(std, mean=0.0):
                return torch.randn(shape, generator=g, dtype=torch.float64) * std + mean
            leaf = name.split(".")[-1]
            hc = ".attn_hc." in name or ".ffn_hc." in name or leaf.startswith("hc_")
            if ".visual." in name or name.startswith("visual.") or "model.visual" in name:
                v = nrm(0.02)
            elif hc and leaf.endswith("fn"):
                v = nrm(0.05)
            elif hc and leaf.endswith("base"):
                v = nrm(0.5)
            elif hc and leaf.endswith("scale"):
                v = nrm(0.2, 1.0)
            elif leaf == "A_log":
                v = torch.rand(shape, generator=g, dtype=torch.float64) * 2.0 - 1.0
            elif leaf == "dt_bias":
                v = nrm(0.5)
            elif "conv1d" in name:
                v = nrm(0.5)
            elif leaf == "e_score_correction_bias":
                v = nrm(0.1)
            elif leaf == "index_kpool_compress_ape":
                v = nrm(0.5)
            elif "embed_tokens" in name:
                v = nrm(1.0)
            elif leaf == "bias":
                v = nrm(0.1)
            elif t.dim() == 1:
                v = nrm(0.1, 1.0)
            elif name.endswith("mlp.gate.weight"):
                v = nrm(2.0 / hidden ** 0.5)   # router: wide logits so routing varies per token
            else:
                v = nrm(1.0 / shape[-1] ** 0.5)
            t.copy_(v.to(t.dtype))
            assert bool((t != 0).any()), name


# --------------------------------------------------------------------------- forward


@torch.no_grad()
def forward_logits(model, toks, cache=None, use_cache=False):
    tm = text_model(model)
    ids = torch.tensor([toks], dtype=torch.long, device=model.lm_head.weight.device)
    out = tm(input_ids=ids, past_key_values=cache, use_cache=use_cache)
    logits = model.lm_head(out.last_hidden_state)[0].float()
    return logits, out.past_key_values


def full_logits(model, toks, use_cache=False):
    return forward_logits(model, toks, None, use_cache)[0]


def decode_logits(model, toks, n_prefill):
    l0, cache = forward_logits(model, toks[:n_prefill], None, True)
    rows = [l0]
    for t in toks[n_prefill:]:
        lt, cache = forward_logits(model, [t], cache, True)
        rows.append(lt)
    return torch.cat(rows, 0)


def maxdiff(a, b):
    return float((a.double() - b.double()).abs().max().item())


# --------------------------------------------------------------------------- specs

COMMON = dict(num_key_value_heads=None, qk_rope_head_dim=0, rms_norm_eps=1e-5, hc_eps=1e-6,
              hc_sinkhorn_iters=20, routed_scaling_factor=2.5, norm_topk_prob=True,
              linear_lower_bound=-5.0, linear_conv_kernel_dim=4, n_shared_experts=1,
              pad_token_id=0, tie_word_embeddings=False, hidden_act="silu")

K, D = "linear_attention", "deepseek_sparse_attention"

SPECS = [
    dict(name="m1_k4_appendix", seed=101, release_copy=False, keep_visual=True,
         kw=dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, layer_types=[K, D, K, D],
                 mlp_layer_types=["dense", "sparse", "sparse", "sparse"], indexer_types=["full"] * 4,
                 num_attention_heads=2, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=16, q_lora_rank=32,
                 linear_num_heads=2, linear_head_dim=8, index_n_heads=2, index_head_dim=8,
                 index_topk=8, index_kpool=4, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
                 moe_intermediate_size=16, intermediate_size=48, swiglu_limit=10.0, hc_mult=4),
         lengths=[1, 2, 3, 5, 7, 8, 9, 19, 37]),
    dict(name="m2_kpool1_shared", seed=202, release_copy=False,
         kw=dict(vocab_size=384, hidden_size=48, num_hidden_layers=6, layer_types=[K, D, D, K, K, D],
                 mlp_layer_types=["dense", "dense", "sparse", "sparse", "sparse", "sparse"],
                 indexer_types=["full", "full", "shared", "full", "full", "full"],
                 num_attention_heads=3, qk_nope_head_dim=24, v_head_dim=16, kv_lora_rank=24, q_lora_rank=16,
                 linear_num_heads=3, linear_head_dim=16, index_n_heads=3, index_head_dim=16,
                 index_topk=6, index_kpool=1, n_routed_experts=12, num_experts_per_tok=3, n_group=3, topk_group=2,
                 moe_intermediate_size=24, intermediate_size=64, swiglu_limit=1.0, hc_mult=4),
         lengths=[1, 2, 3, 5, 6, 7, 15, 29]),
    dict(name="m3_kpool2_groups", seed=303, release_copy=False,
         kw=dict(vocab_size=512, hidden_size=96, num_hidden_layers=5, layer_types=[K, K, D, K, D],
                 mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"], indexer_types=["full"] * 5,
                 num_attention_heads=4, qk_nope_head_dim=32, v_head_dim=32, kv_lora_rank=32, q_lora_rank=48,
                 linear_num_heads=4, linear_head_dim=16, index_n_heads=4, index_head_dim=16,
                 index_topk=12, index_kpool=2, n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=2,
                 moe_intermediate_size=24, intermediate_size=96, swiglu_limit=10.0, hc_mult=4),
         lengths=[1, 3, 7, 11, 12, 13, 27, 53]),
    dict(name="m4_hc2_limit05", seed=404, release_copy=False,
         kw=dict(vocab_size=256, hidden_size=32, num_hidden_layers=8, layer_types=[K, K, K, D, K, D, D, K],
                 mlp_layer_types=["dense"] * 3 + ["sparse"] * 5,
                 indexer_types=["full"] * 6 + ["shared", "full"],
                 num_attention_heads=2, qk_nope_head_dim=16, v_head_dim=24, kv_lora_rank=16, q_lora_rank=24,
                 linear_num_heads=2, linear_head_dim=16, index_n_heads=2, index_head_dim=8,
                 index_topk=4, index_kpool=2, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                 moe_intermediate_size=16, intermediate_size=48, swiglu_limit=0.5, hc_mult=2),
         lengths=[1, 2, 3, 4, 5, 7, 11, 21]),
    dict(name="m5_kpool4_release", seed=505, release_copy=True,
         kw=dict(vocab_size=320, hidden_size=64, num_hidden_layers=8, layer_types=[K, K, K, D, K, K, K, D],
                 mlp_layer_types=["dense"] + ["sparse"] * 7, indexer_types=["full"] * 8,
                 num_attention_heads=4, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=32, q_lora_rank=32,
                 linear_num_heads=4, linear_head_dim=8, index_n_heads=4, index_head_dim=8,
                 index_topk=16, index_kpool=4, n_routed_experts=16, num_experts_per_tok=4, n_group=1, topk_group=1,
                 moe_intermediate_size=16, intermediate_size=64, swiglu_limit=10.0, hc_mult=4),
         lengths=[1, 2, 5, 15, 16, 17, 35, 69]),
    dict(name="m6_shared_chain", seed=606, release_copy=False,
         kw=dict(vocab_size=256, hidden_size=48, num_hidden_layers=6, layer_types=[K, D, D, K, D, D],
                 mlp_layer_types=["dense", "dense", "sparse", "sparse", "sparse", "sparse"],
                 indexer_types=["full", "full", "shared", "full", "full", "shared"],
                 num_attention_heads=2, qk_nope_head_dim=32, v_head_dim=16, kv_lora_rank=24, q_lora_rank=40,
                 linear_num_heads=2, linear_head_dim=12, index_n_heads=3, index_head_dim=12,
                 index_topk=8, index_kpool=2, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                 moe_intermediate_size=20, intermediate_size=56, swiglu_limit=2.0, hc_mult=4),
         lengths=[1, 3, 7, 8, 9, 13, 19, 37]),
]


def full_kw(spec):
    kw = dict(COMMON)
    kw.update(spec["kw"])
    kw["num_key_value_heads"] = kw["num_attention_heads"]
    return kw


def is_sparse(kw, n):
    """True iff some query row of an n-token prompt selects fewer than all its visible tokens."""
    return n > kw["index_topk"] + kw["index_kpool"] - 1


# --------------------------------------------------------------------------- checkpoint io


def st_keys(path):
    from safetensors import safe_open
    out = []
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            s = f.get_slice(k)
            out.append([k, list(s.get_shape()), s.get_dtype()])
    return out


def save_model(model, d, strip_visual):
    os.makedirs(d, exist_ok=True)
    try:
        model.save_pretrained(d, safe_serialization=True)
    except TypeError:
        model.save_pretrained(d)
    files = sorted(os.listdir(d))
    log("  saved files:", files)
    assert "model.safetensors" in files, f"expected one model.safetensors, got {files}"
    if strip_visual:
        from safetensors.torch import load_file, save_file
        sd = load_file(os.path.join(d, "model.safetensors"))
        sd = {k: v for k, v in sd.items() if ".visual." not in k and not k.startswith("visual.")}
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    for f in files:
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, f))


def load_model(cls, d):
    m = info = None
    for extra in (dict(experts_implementation="eager"), {}):
        try:
            m, info = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                          output_loading_info=True, **extra)
            break
        except Exception as e:  # noqa: BLE001
            err = e
            log(f"from_pretrained({list(extra)}) failed:", repr(e)[:300])
    if m is None:
        raise err
    force_eager(m)
    return m.float().eval().to(DEV), {k: sorted(map(str, v))[:50] for k, v in info.items() if v}


def write_f32(path, t):
    t = t.detach().float().cpu().contiguous()
    with open(path, "wb") as f:
        f.write(t.numpy().astype("<f4").tobytes())


# --------------------------------------------------------------------------- per model


def toks_for(seed, n, vocab):
    r = random.Random(seed * 1000 + n)
    return [r.randrange(vocab) for _ in range(n)]


def run_spec(spec, out_dir, summary):
    kw = full_kw(spec)
    name = spec["name"]
    log(f"\n=== model {name} ===")
    model, cls_name, cls, strip = build_model(kw)
    strip = strip or not spec.get("keep_visual", False)   # tiny vision tower kept in m1 only
    randomize(model, spec["seed"])
    model.to(DEV)
    mdir = os.path.join(out_dir, name)
    save_model(model, mdir, strip)
    keys = st_keys(os.path.join(mdir, "model.safetensors"))
    log(f"  class {cls_name}; impl {impl_report(model)}; {len(keys)} tensors; first keys:", [k[0] for k in keys[:6]])

    # reload check: the checkpoint alone must reproduce the in-memory model
    probe = toks_for(spec["seed"], 9, kw["vocab_size"])
    m2, info = load_model(cls, mdir)
    if info:
        log("  reload loading info:", info)
    reload_diff = maxdiff(full_logits(model, probe), full_logits(m2, probe))
    log(f"  reload max|diff| = {reload_diff:.3e}")
    assert reload_diff <= 1e-6, "checkpoint does not reproduce the model"
    del m2

    cases, checks = [], {}
    vocab = kw["vocab_size"]
    for n in spec["lengths"]:
        toks = toks_for(spec["seed"], n, vocab)
        sparse = is_sparse(kw, n)
        hf_patch.set_mode("causal")
        c_full = full_logits(model, toks)
        c_full_cache = full_logits(model, toks, use_cache=True)
        hf_patch.set_mode("raw")
        r_full = full_logits(model, toks)
        chk = {"causal_vs_raw": maxdiff(c_full, r_full), "cache_vs_nocache": maxdiff(c_full, c_full_cache)}
        base = dict(tokens=toks, rows=n, vocab=vocab, sparse=sparse)
        if not sparse:
            assert chk["causal_vs_raw"] <= SAME_TOL, (name, n, chk)
            fn = f"L{n}_prefill.f32"
            write_f32(os.path.join(mdir, fn), c_full)
            cases.append(dict(name=f"L{n}_prefill", decode_from=None, reference="hf", logits=fn, **base))
        else:
            fn = f"L{n}_prefill.f32"
            write_f32(os.path.join(mdir, fn), c_full)
            cases.append(dict(name=f"L{n}_prefill", decode_from=None, reference="hf_causal", logits=fn, **base))
            fn = f"L{n}_prefill_raw.f32"
            write_f32(os.path.join(mdir, fn), r_full)
            cases.append(dict(name=f"L{n}_prefill_raw", decode_from=None, reference="hf_raw", logits=fn, **base))
            # prefix consistency: a shorter sparse prefix prefilled alone vs the same rows here
            m = max(kw["index_topk"] + kw["index_kpool"], n - 5)
            if m < n:
                hf_patch.set_mode("causal")
                chk["prefix_causal"] = maxdiff(full_logits(model, toks[:m]), c_full[:m])
                hf_patch.set_mode("raw")
                chk["prefix_raw"] = maxdiff(full_logits(model, toks[:m]), r_full[:m])
                chk["prefix_len"] = m
        if sparse:
            # the same model on the CPU: is the causal reference device independent, is raw?
            cpu_model = copy.deepcopy(model).cpu()
            hf_patch.set_mode("causal")
            c_cpu = full_logits(cpu_model, toks)
            hf_patch.set_mode("raw")
            r_cpu = full_logits(cpu_model, toks)
            chk["cpu_vs_gpu_causal"] = maxdiff(c_cpu, c_full.cpu())
            chk["cpu_vs_gpu_raw"] = maxdiff(r_cpu, r_full.cpu())
            chk["cpu_raw_vs_cpu_causal"] = maxdiff(r_cpu, c_cpu)
            del cpu_model
        if n >= 3:
            nd = max(1, kw["index_topk"] - 1) if sparse else max(1, n // 2)
            nd = min(nd, n - 1)
            hf_patch.set_mode("causal")
            dec = decode_logits(model, toks, nd)
            chk["decode_causal"] = maxdiff(dec, c_full)
            if sparse:
                hf_patch.set_mode("raw")
                chk["decode_raw"] = maxdiff(decode_logits(model, toks, nd), r_full)
            fn = f"L{n}_decode{nd}.f32"
            write_f32(os.path.join(mdir, fn), dec)
            cases.append(dict(name=f"L{n}_decode{nd}", decode_from=nd,
                              reference="hf_causal" if sparse else "hf", logits=fn, **base))
        checks[f"L{n}"] = chk
        log(f"  L={n:3d} sparse={int(sparse)} " + " ".join(
            f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in chk.items()))
    ok = all(v <= CAUSAL_TOL for c in checks.values() for k, v in c.items()
             if k in ("prefix_causal", "decode_causal", "cache_vs_nocache", "cpu_vs_gpu_causal"))
    log(f"  causal self-check: {'PASS' if ok else 'FAIL'}")
    with open(os.path.join(mdir, "goldens.json"), "w") as f:
        json.dump({"model": name, "causal_selfcheck_pass": ok, "cases": cases}, f, indent=1)

    summary[name] = dict(seed=spec["seed"], class_name=cls_name, text_prefix=text_prefix(model), impl=impl_report(model),
                         config=kw, keys=keys, checks=checks, causal_selfcheck_pass=ok,
                         reload_max_diff=reload_diff)
    if spec.get("release_copy"):
        summary[name]["release_copy"] = write_release_copy(model, cls, kw, spec, out_dir)
    return ok


def write_release_copy(model, cls, kw, spec, out_dir):
    """Release-style names, bf16 except the fp32 set; verified by loading it back with transformers."""
    from safetensors.torch import save_file
    name = spec["name"] + "_release_bf16"
    rdir = os.path.join(out_dir, name)
    os.makedirs(rdir, exist_ok=True)
    tm = text_model(model)
    tsd = {k: v for k, v in tm.state_dict().items()}
    rsd = release_layout.release_state_dict(tsd, model.lm_head.weight, kw["moe_intermediate_size"])
    save_file(rsd, os.path.join(rdir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(out_dir, spec["name"], "config.json"), os.path.join(rdir, "config.json"))
    res = {"dir": name, "keys": st_keys(os.path.join(rdir, "model.safetensors"))}
    # Reference: the same model with the bf16-stored tensors rounded to bf16.
    rounded_sd = {}
    inv = {}
    for k, v in tsd.items():
        for rk, _ in release_layout.to_release(k, v, kw["moe_intermediate_size"]):
            inv.setdefault(k, []).append(rk)
    for k, v in tsd.items():
        fp32 = all(release_layout.is_fp32_release(rk) for rk in inv[k])
        rounded_sd[k] = v if fp32 else v.to(torch.bfloat16).float()
    ref_model, _, _, _ = build_model(kw)
    ref_model.to(DEV)
    text_model(ref_model).load_state_dict(rounded_sd)
    ref_model.lm_head.weight.data.copy_(model.lm_head.weight.data.to(torch.bfloat16).float())
    ref_model.eval()
    try:
        loaded, info = load_model(cls, rdir)
        res["hf_loading_info"] = info
        probe = toks_for(spec["seed"], 23, kw["vocab_size"])
        hf_patch.set_mode("causal")
        res["hf_load_vs_rounded_max_diff"] = maxdiff(full_logits(loaded, probe), full_logits(ref_model, probe))
        log(f"  release copy: transformers load vs rounded model max|diff| = {res['hf_load_vs_rounded_max_diff']:.3e}"
            f" info={info}")
    except Exception as e:  # noqa: BLE001
        res["hf_load_error"] = repr(e)[:2000]
        log("  release copy: transformers could NOT load it:", repr(e)[:500])
    cases = []
    for n in (5, 17, 35):
        toks = toks_for(spec["seed"] + 1, n, kw["vocab_size"])
        sparse = is_sparse(kw, n)
        hf_patch.set_mode("causal")
        lg = full_logits(ref_model, toks)
        fn = f"L{n}_prefill.f32"
        write_f32(os.path.join(rdir, fn), lg)
        cases.append(dict(name=f"L{n}_prefill", tokens=toks, decode_from=None,
                          reference="hf_causal" if sparse else "hf", logits=fn, rows=n,
                          vocab=kw["vocab_size"], sparse=sparse))
    nd = kw["index_topk"] - 1
    toks = toks_for(spec["seed"] + 1, 35, kw["vocab_size"])
    dec = decode_logits(ref_model, toks, nd)
    fn = f"L35_decode{nd}.f32"
    write_f32(os.path.join(rdir, fn), dec)
    cases.append(dict(name=f"L35_decode{nd}", tokens=toks, decode_from=nd, reference="hf_causal", logits=fn,
                      rows=35, vocab=kw["vocab_size"], sparse=True))
    res["decode_vs_prefill_max_diff"] = maxdiff(dec, full_logits(ref_model, toks))
    with open(os.path.join(rdir, "goldens.json"), "w") as f:
        json.dump({"model": name, "note": "weights = parent model rounded to bf16 except the fp32 set",
                   "cases": cases}, f, indent=1)
    return res


# --------------------------------------------------------------------------- main


def dump_sources(bundle):
    pkg = os.path.dirname(transformers.__file__)
    src = inspect.getsourcefile(mod)
    log("modeling source:", src)
    log("configuration source:", inspect.getsourcefile(cfgmod))
    if not bundle:
        return src
    shutil.copy(src, os.path.join(bundle, "modeling_glm5_next_installed.py"))
    with tarfile.open(os.path.join(bundle, "ref_sources.tgz"), "w:gz") as tf:
        for rel in ("models/glm5_next", "models/glm_moe_dsa", "conversion_mapping.py", "masking_utils.py",
                    "integrations/moe.py", "cache_utils.py", "core_model_loading.py"):
            p = os.path.join(pkg, rel)
            if os.path.exists(p):
                tf.add(p, arcname=rel, filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return src


def conversion_snippet():
    p = os.path.join(os.path.dirname(transformers.__file__), "conversion_mapping.py")
    if not os.path.exists(p):
        return "conversion_mapping.py not found"
    s = open(p).read()
    hits = [m.start() for m in re.finditer("glm5_next", s)]
    parts = []
    for h in hits[:6]:
        parts.append(s[max(0, h - 300):h + 1500])
    return "\n-----\n".join(parts) if parts else "no glm5_next entry"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--bundle", default=None, help="folder for the tarball and source copies ($OUT)")
    ap.add_argument("--only", default=None, help="comma list of model names")
    ap.add_argument("--skip-probe", action="store_true")
    ap.add_argument("--cuda-small-probe", action="store_true",
                    help="also run the 17/30-token probe on CUDA (it never reproduced the trap there)")
    args = ap.parse_args()
    setup_determinism()
    t0 = time.time()
    log("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
        "device", torch.cuda.get_device_name(0) if DEV.type == "cuda" else "cpu")
    src = dump_sources(args.bundle)
    hf_patch.install(indexer_class())
    log("indexer class:", indexer_class().__name__, "| model class:", model_class()[0])
    log("text config fields:", sorted(text_cfg_fields()))
    conv = conversion_snippet()
    log("conversion mapping (glm5_next):\n" + conv[:4000])
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)

    manifest = dict(python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__,
                    device=torch.cuda.get_device_name(0) if DEV.type == "cuda" else "cpu",
                    modeling_source=src, tf32=False, deterministic=True, dtype="float32",
                    attn_implementation="eager", conversion_mapping_snippet=conv[:6000],
                    causal_tol=CAUSAL_TOL, models={})
    if not args.skip_probe:
        try:
            import trap_probe
            manifest["trap_probe"] = trap_probe.run(sys.modules[__name__], cuda_small=args.cuda_small_probe)
        except Exception:  # noqa: BLE001
            tb = traceback.format_exc()
            log("TRAP PROBE FAILED:\n" + tb)
            manifest["trap_probe"] = {"error": tb}
    all_ok = True
    for spec in SPECS:
        if args.only and spec["name"] not in args.only.split(","):
            continue
        try:
            all_ok &= run_spec(spec, args.out, manifest["models"])
        except Exception:  # noqa: BLE001
            tb = traceback.format_exc()
            log(f"MODEL {spec['name']} FAILED:\n{tb}")
            manifest["models"][spec["name"]] = {"error": tb}
            all_ok = False
    manifest["all_causal_selfchecks_pass"] = all_ok
    manifest["indexer_topk_calls_seen_by_patch"] = hf_patch.calls()
    log("indexer top-k calls routed through the patch:", hf_patch.calls())
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(args.out) for f in fs)
    log(f"\noutput {args.out}: {total / 1e6:.2f} MB; all causal self-checks {'PASS' if all_ok else 'FAIL'};"
        f" {time.time() - t0:.1f}s")
    if args.bundle:
        with tarfile.open(os.path.join(args.bundle, "oracle.tgz"), "w:gz") as tf:
            tf.add(args.out, arcname="oracle")


if __name__ == "__main__":
    main()
