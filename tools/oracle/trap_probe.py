"""Probe of the transformers glm5_next causality trap (see docs/oracle.md).

Prefills the first 17 tokens of a 30-token prompt and the whole prompt, records every
submodule output with forward hooks, and reports the first op (in execution order) whose
rows 0..16 differ, the indexer selections per row, and ties at the top-k boundary of the
indexer scores. Done for raw transformers and for the causal patch (hf_patch.py), with
transformers' default init and with full random init, and with all-dense MLPs.
"""

import copy

import torch

import hf_patch

S_SHORT, S_LONG = 17, 30
FLOAT_TOL = 1e-5


class Recorder:
    def __init__(self, root):
        self.order, self.data, self.handles = [], {}, []
        for name, m in root.named_modules():
            if name:
                self.handles.append(m.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def f(_m, _i, out):
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for j, t in enumerate(outs):
                if torch.is_tensor(t):
                    key = f"{name}#{j}"
                    if key not in self.data:
                        self.order.append(key)
                        self.data[key] = t.detach().clone()
        return f

    def remove(self):
        for h in self.handles:
            h.remove()


def rows_view(a, b, s):
    """Bring the token axis of a (length s) and b (longer) to the front; None if not comparable."""
    if a.dim() >= 2 and a.shape[0] == 1 and a.shape[1] == s and b.dim() == a.dim() and b.shape[1] > s:
        ax = 1
    elif a.dim() >= 1 and a.shape[0] == s and b.dim() == a.dim() and b.shape[0] > s:
        ax = 0
    else:
        return None
    bb = b.narrow(ax, 0, s)
    if bb.shape != a.shape:
        return None
    if not a.is_floating_point() and a.dim() > ax + 1:
        a, bb = a.sort(-1).values, bb.sort(-1).values
    return a.movedim(ax, 0).reshape(s, -1), bb.movedim(ax, 0).reshape(s, -1)


def compare(ra, rb, s):
    diffs = []
    for key in ra.order:
        if key not in rb.data:
            continue
        v = rows_view(ra.data[key], rb.data[key], s)
        if v is None:
            continue
        a, b = v
        if a.is_floating_point():
            per_row = (a.double() - b.double()).abs().max(-1).values
            bad = (per_row > FLOAT_TOL).nonzero().flatten().tolist()
            md = float(per_row.max())
        else:
            bad = (a != b).any(-1).nonzero().flatten().tolist()
            md = float(len(bad))
        if bad:
            diffs.append({"op": key, "max_diff": md, "first_row": bad[0], "bad_rows": bad[:20]})
    return diffs


def tie_stats(entries):
    out = []
    for e in entries:
        x, k = e["x"], e["k"]
        x = x.reshape(-1, x.shape[-1])
        p = x.shape[-1]
        vals = x.sort(-1, descending=True).values
        rows, tv = [], []
        if k < p:
            for r in range(x.shape[0]):
                if vals[r, k - 1] == vals[r, k] and vals[r, k] > -1e30:
                    rows.append(r)
                    tv.append(float(vals[r, k]))
        zero_rows = int(((x == 0).sum(-1) >= 2).sum())
        out.append({"rows": int(x.shape[0]), "cands": int(p), "k": int(k), "boundary_tie_rows": rows[:20],
                    "tie_values": tv[:10], "rows_with_2plus_exact_zero_scores": zero_rows})
    return out


def selection_detail(ra, rb, la, lb, s):
    """Per indexer: rows whose selected token sets differ, with the scores of the first such row."""
    res = []
    keys = [k for k in ra.order if k.endswith("indexer#0")]
    for li, key in enumerate(keys):
        a = ra.data[key].reshape(s, -1).sort(-1).values
        b = rb.data[key][0, :s].reshape(s, -1).sort(-1).values
        bad = (a != b).any(-1).nonzero().flatten().tolist()
        item = {"indexer": key, "rows_differing": bad}
        if bad and li < len(la) and li < len(lb):
            r = bad[0]
            item["row"] = r
            item["sel_short"] = [int(v) for v in a[r] if v >= 0]
            item["sel_long"] = [int(v) for v in b[r] if v >= 0]
            item["scores_short"] = [round(float(v), 6) for v in la[li]["x"].reshape(s, -1)[r]]
            item["scores_long"] = [float(v) if v > -1e30 else "min" for v in
                                   lb[li]["x"].reshape(-1, lb[li]["x"].shape[-1])[r]]
            item["k"] = la[li]["k"]
        res.append(item)
    return res


def one(M, model, toks, mode):
    hf_patch.set_mode(mode)
    tm = M.text_model(model)
    la, lb = [], []
    ra = Recorder(tm)
    hf_patch.set_log(la)
    ya = M.full_logits(model, toks[:S_SHORT])
    ra.remove()
    rb = Recorder(tm)
    hf_patch.set_log(lb)
    yb = M.full_logits(model, toks)
    rb.remove()
    hf_patch.set_log(None)
    res = {"mode": mode, "prefix_logits_max_diff": M.maxdiff(ya, yb[:S_SHORT])}
    res["decode_vs_prefill_max_diff"] = M.maxdiff(M.decode_logits(model, toks, 7), yb)
    res["first_differing_ops"] = compare(ra, rb, S_SHORT)[:12]
    res["ties_short"] = tie_stats(la)
    res["ties_long"] = tie_stats(lb)
    res["selection"] = selection_detail(ra, rb, la, lb, S_SHORT)
    return res


def _build(M, kw, rnd, seed, dev, dtype):
    torch.manual_seed(1234)
    model, _, _, _ = M.build_model(kw)
    if rnd:
        M.randomize(model, seed)
    model = model.to(dev)
    return model.double() if dtype == torch.float64 else model


def _variant(M, report, label, kw, rnd, dev, dtype, toks):
    model = _build(M, kw, rnd, 777, dev, dtype)
    for mode in ("raw", "causal"):
        r = one(M, model, toks, mode)
        r.update(variant=label, device=str(dev), dtype=str(dtype))
        report["runs"].append(r)
        M.log(f"[probe] {label:24s} {str(dev):5s} {str(dtype)[6:]:7s} {mode:6s} "
              f"prefix17 max|diff|={r['prefix_logits_max_diff']:.3e} "
              f"decode(7)+ vs prefill30 max|diff|={r['decode_vs_prefill_max_diff']:.3e}")
        for d in r["first_differing_ops"][:5]:
            M.log(f"          first ops: {d['op']} max={d['max_diff']:.3e} first_row={d['first_row']}"
                  f" rows={d['bad_rows'][:8]}")
        for s in r["selection"]:
            if s["rows_differing"]:
                M.log(f"          selection differs: {s}")
        nt = sum(len(t["boundary_tie_rows"]) for t in r["ties_short"] + r["ties_long"])
        M.log(f"          rows with an exact tie at the top-k boundary (short+long runs): {nt}")
    del model


def long_probe(M, report):
    """Many candidates per row on CUDA: kpool 1, one indexer head (half the scores exactly 0)."""
    kw = M.full_kw(M.SPECS[0])
    kw.update(index_kpool=1, index_topk=8, index_n_heads=1)
    model = _build(M, kw, True, 4242, M.DEV, torch.float32)
    toks = M.toks_for(4242, 1600, kw["vocab_size"])
    res = {"config": {k: kw[k] for k in ("index_kpool", "index_topk", "index_n_heads")}, "short": 1500,
           "long": 1600}
    out = {}
    for mode in ("raw", "causal"):
        hf_patch.set_mode(mode)
        out[mode] = (M.full_logits(model, toks[:1500]), M.full_logits(model, toks))
        res[f"prefix_{mode}"] = M.maxdiff(out[mode][0], out[mode][1][:1500])
    res["raw_vs_causal_full"] = M.maxdiff(out["raw"][1], out["causal"][1])
    M.log(f"[probe] long CUDA kpool1 1500 vs 1600: {res}")
    report["long_cuda"] = res
    del model


def run(M, cuda_small=False):
    spec = copy.deepcopy(M.SPECS[0])          # m1: K, D, K, D; topk 8, kpool 4; MoE in layers 1-3
    kw = M.full_kw(spec)
    toks = M.toks_for(777, S_LONG, kw["vocab_size"])
    report = {"prompt": toks, "short": S_SHORT, "long": S_LONG, "config": kw, "runs": []}
    dense_kw = dict(kw)
    dense_kw["mlp_layer_types"] = ["dense"] * kw["num_hidden_layers"]
    cpu = torch.device("cpu")
    variants = [("hf_default_init", kw, False, cpu, torch.float32),
                ("hf_default_init", kw, False, cpu, torch.float64),
                ("random_init", kw, True, cpu, torch.float32),
                ("random_init", kw, True, cpu, torch.float64),
                ("hf_default_init_all_dense", dense_kw, False, cpu, torch.float32),
                ("random_init_all_dense", dense_kw, True, cpu, torch.float32)]
    if cuda_small:
        variants += [("hf_default_init", kw, False, M.DEV, torch.float32),
                     ("random_init", kw, True, M.DEV, torch.float32)]
    for label, k, rnd, dev, dt in variants:
        try:
            _variant(M, report, label, k, rnd, dev, dt, toks)
        except Exception as e:  # noqa: BLE001
            M.log(f"[probe] {label} {dev} {dt} failed: {e!r}"[:800])
            report["runs"].append({"variant": label, "device": str(dev), "dtype": str(dt), "error": repr(e)[:800]})
    try:
        long_probe(M, report)
    except Exception as e:  # noqa: BLE001
        M.log(f"[probe] long probe failed: {e!r}"[:800])
        report["long_cuda"] = {"error": repr(e)[:800]}
    # "shared" DSA layer whose previous DSA layer is separated by a KDA layer, or a chain of shared
    kd, dd = "linear_attention", "deepseek_sparse_attention"
    for label, lt, it in (("shared_after_kda", [dd, kd, dd], ["full", "full", "shared"]),
                          ("shared_chain", [dd, dd, dd], ["full", "shared", "shared"]),
                          ("shared_direct", [kd, dd, dd], ["full", "full", "shared"])):
        k2 = dict(kw)
        k2.update(num_hidden_layers=3, layer_types=lt, indexer_types=it,
                  mlp_layer_types=["dense", "sparse", "sparse"])
        try:
            model = _build(M, k2, True, 99, M.DEV, torch.float32)
            hf_patch.set_mode("causal")
            y = M.full_logits(model, toks)
            report[label] = {"ok": True, "finite": bool(torch.isfinite(y).all()),
                             "has_indexer_per_layer": [getattr(l.self_attn, "indexer", None) is not None
                                                       for l in M.text_model(model).layers]}
        except Exception as e:  # noqa: BLE001
            report[label] = {"ok": False, "error": repr(e)[:600]}
        M.log(f"[probe] {label}: {report[label]}")
    return report
