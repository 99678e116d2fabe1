"""Map a transformers glm5_next state dict to the release checkpoint names (oracle use only).

Release names follow docs/glm53-architecture.md section 10: per-expert
mlp.experts.N.{gate,up,down}_proj.weight, split {q,k,v}_conv1d, forget-gate tensors
directly under self_attn, hc_{attn,ffn}_{fn,base,scale}. Keys are given relative to the
text-model prefix; the caller adds the prefix (model.language_model. for the release).
"""

import re

import torch

# Tensors the release keeps in float32 (architecture doc 10.1); everything else is bf16.
FP32_PATTERNS = (r"hc_(attn|ffn)_(fn|base|scale)$", r"\.A_log$", r"\.dt_bias$",
                 r"e_score_correction_bias$", r"_conv1d\.weight$", r"index_kpool_compress_ape$")


def is_fp32_release(name):
    return any(re.search(p, name) for p in FP32_PATTERNS)


def to_release(rel_key, tensor, moe_inter):
    """Yield (release_key, tensor) for one transformers key relative to the text model."""
    m = re.match(r"^(layers\.\d+\.)(attn_hc|ffn_hc)\.(fn|base|scale)$", rel_key)
    if m:
        site = "attn" if m.group(2) == "attn_hc" else "ffn"
        yield f"{m.group(1)}hc_{site}_{m.group(3)}", tensor
        return
    m = re.match(r"^(layers\.\d+\.self_attn\.)conv1d\.weight$", rel_key)
    if m:
        c = tensor.shape[0] // 3
        assert tensor.shape[0] == 3 * c
        for j, nm in enumerate(("q", "k", "v")):
            yield f"{m.group(1)}{nm}_conv1d.weight", tensor[j * c:(j + 1) * c].contiguous()
        return
    m = re.match(r"^(layers\.\d+\.self_attn\.)forget_gate\.(.+)$", rel_key)
    if m:
        yield f"{m.group(1)}{m.group(2)}", tensor
        return
    m = re.match(r"^(layers\.\d+\.mlp\.experts\.)gate_up_proj$", rel_key)
    if m:
        assert tensor.dim() == 3 and tensor.shape[1] == 2 * moe_inter, tensor.shape
        for e in range(tensor.shape[0]):
            yield f"{m.group(1)}{e}.gate_proj.weight", tensor[e, :moe_inter].contiguous()
            yield f"{m.group(1)}{e}.up_proj.weight", tensor[e, moe_inter:].contiguous()
        return
    m = re.match(r"^(layers\.\d+\.mlp\.experts\.)down_proj$", rel_key)
    if m:
        assert tensor.dim() == 3
        for e in range(tensor.shape[0]):
            yield f"{m.group(1)}{e}.down_proj.weight", tensor[e].contiguous()
        return
    yield rel_key, tensor


def release_state_dict(text_sd, lm_head, moe_inter, prefix="model.language_model.", bf16=True):
    """text_sd: {key relative to the text model: tensor}. Returns {release key: tensor}."""
    out = {}
    for k in sorted(text_sd):
        for rk, t in to_release(k, text_sd[k].detach().cpu(), moe_inter):
            full = prefix + rk
            assert full not in out, full
            out[full] = t
    out["lm_head.weight"] = lm_head.detach().cpu()
    for k in list(out):
        t = out[k].float()
        if bf16 and not is_fp32_release(k):
            t = t.to(torch.bfloat16)
        out[k] = t.contiguous()
    return out
