"""rlhfkit: the RLHF / post-training pipeline for causal language models, from the command line (``rlhfkit``) or
from Python: ``from rlhfkit import GRPOTrainer, GRPOConfig`` (one trainer and one config per recipe, built from
the recipe table; :mod:`rlhfkit.api`). The names are imported on first use, so ``import rlhfkit`` (done by every
reward worker process) stays light."""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("Trainer", "Args", "Callback", "Summary", "UserError") or name.endswith(("Trainer", "Config")):
        from . import api
        from .errors import UserError

        if name == "UserError":
            return UserError
        if hasattr(api, name):
            return getattr(api, name)
    raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")


def __dir__():
    from . import api

    return sorted([*globals(), *api.__all__, "UserError"])
