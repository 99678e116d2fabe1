"""Causal-selection patch for the transformers glm5_next DSA indexer (oracle use only).

What it changes (and nothing else): inside the indexer's forward, every top-k over
candidate pools is replaced by a *stable* descending sort truncated to k, so that exact
ties are broken by the lower column index (= the earlier pool). torch.topk leaves the
order of equal values unspecified; on CUDA the tie winner depends on the row length, and
in a prefill the row also holds every future pool (filled with the dtype minimum), so a
query could pick a different tied pool in a long prefill than in a short one or in
decode. With ties broken by (score desc, pool index asc) the choice depends only on the
pools visible to the query, i.e. it is causal. See docs/oracle.md for the evidence.

The module also offers a logging mode that records every top-k input seen inside the
indexer (used by the trap probe to show the ties).
"""

import collections

import torch

_STATE = {"active": 0, "mode": "raw", "log": None, "calls": 0}
_ORIG_METHOD = torch.Tensor.topk
_ORIG_FUNC = torch.topk
_TopK = collections.namedtuple("_TopK", ["values", "indices"])
_INSTALLED = []


def _result(values, indices):
    try:
        return torch.return_types.topk((values, indices))
    except Exception:  # pragma: no cover - older structseq constructors
        return _TopK(values, indices)


def _dispatch(orig, x, k, dim, largest, sorted_):
    if not _STATE["active"]:
        return orig(x, k, dim=dim, largest=largest, sorted=sorted_)
    _STATE["calls"] += 1
    if _STATE["mode"] == "causal" and largest:
        vals, idx = torch.sort(x, dim=dim, descending=True, stable=True)
        res = _result(vals.narrow(dim, 0, k), idx.narrow(dim, 0, k))
    else:
        res = orig(x, k, dim=dim, largest=largest, sorted=sorted_)
    if _STATE["log"] is not None:
        _STATE["log"].append({"x": x.detach().double().cpu(), "k": int(k), "dim": int(dim),
                              "idx": res[1].detach().cpu()})
    return res


def _method(self, k, dim=-1, largest=True, sorted=True):
    return _dispatch(_ORIG_METHOD, self, k, dim, largest, sorted)


def _func(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    assert out is None, "out= not supported by the oracle patch"
    return _dispatch(_ORIG_FUNC, input, k, dim, largest, sorted)


def install(indexer_cls):
    """Wrap indexer_cls.forward so top-k calls inside it are routed through _dispatch."""
    if indexer_cls in _INSTALLED:
        return
    orig = indexer_cls.forward

    def forward(self, *args, **kwargs):
        _STATE["active"] += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            _STATE["active"] -= 1

    indexer_cls.forward = forward
    torch.Tensor.topk = _method
    torch.topk = _func
    _INSTALLED.append(indexer_cls)


def set_mode(mode):
    assert mode in ("raw", "causal")
    _STATE["mode"] = mode


def set_log(log):
    _STATE["log"] = log


def calls():
    return _STATE["calls"]
