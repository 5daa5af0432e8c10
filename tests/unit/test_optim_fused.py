"""build_optimizer's fused AdamW: the same updates as PyTorch's per-tensor loop to float32 rounding, weight decay
only on matrices, and an optimizer state written by the per-tensor loop (a checkpoint of an earlier version) loads
and goes on the same."""

import torch

from rlhfkit.config.schema import OptimConfig
from rlhfkit.train.lifecycle.optim import build_optimizer


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(40, 30, generator=g)), torch.nn.Parameter(torch.randn(30, generator=g))]


def _loop_adamw(params, cfg):  # the reference: the per-tensor loop, the same groups by hand
    return torch.optim.AdamW([{"params": [params[0]], "weight_decay": cfg.weight_decay},
                              {"params": [params[1]], "weight_decay": 0.0}], lr=cfg.lr, betas=tuple(cfg.betas),
                             eps=cfg.eps, foreach=False)


def _steps(opt, params, n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def test_fused_adamw_matches_the_per_tensor_loop():
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    ours, ref = _params(), _params()
    opt = build_optimizer(ours, cfg)
    assert opt.defaults["fused"] is True
    _steps(opt, ours, 6)
    _steps(_loop_adamw(ref, cfg), ref, 6)
    for a, b, start in zip(ours, ref, _params()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
        assert (a - start).abs().max() > 1e-2  # they moved: the comparison means something


def test_a_state_from_the_per_tensor_loop_resumes_in_the_fused_one():
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1)
    old, ref = _params(), _params()
    loop = _loop_adamw(old, cfg)
    _steps(loop, old, 3)
    fused = build_optimizer(old, cfg)
    fused.load_state_dict(loop.state_dict())
    _steps(fused, old, 3, seed=2)
    loop_ref = _loop_adamw(ref, cfg)
    _steps(loop_ref, ref, 3)
    _steps(loop_ref, ref, 3, seed=2)
    for a, b in zip(old, ref):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


def test_parameters_the_fused_kernel_cannot_take_get_the_default():
    p = torch.nn.Parameter(torch.zeros(4, 4, device="meta"))
    assert build_optimizer([p], OptimConfig()).defaults["fused"] is None
