"""What connects the producers and the learners of an asynchronous run (``asynchronous.py``): the :class:`Layout`
(which rank does what), the wire format of an experience, and the :class:`Bridge`: the process groups made on the
launcher's store next to the learners' own (experiences point to point over gloo; weights by broadcast, NCCL on
GPUs, gloo on CPU), the start-up reports and the abort flag."""

from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ...errors import ConfigError, RunError
from ...rollout import Rollout
from ..lifecycle.stop import error_code, one_line
from .experience import Experience

GO, STOP, DONE = 0, 1, 2
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
BUCKET_BYTES = 256 << 20  # weights travel in buckets of at most this size (one flat buffer each)


# ────────────────────────────────────────────────── layout ───────────────────────────────────────────────────


@dataclass(frozen=True)
class Layout:
    """Who does what: ``learners`` + ``producers`` ranks; a learner's share of a step comes in ``pieces`` parts."""

    rank: int
    learners: int
    producers: int

    @property
    def is_learner(self) -> bool:
        return self.rank < self.learners

    @property
    def pieces(self) -> int:
        """Parts of one learner's share (more producers than learners: each makes part of a share)."""
        return max(1, self.producers // self.learners)

    def producer_rank(self, share: int, piece: int) -> int:
        return self.learners + (share * self.pieces + piece) % self.producers

    def made_by(self, rank: int) -> list[tuple[int, int]]:
        """The (share, piece) pairs producer ``rank`` makes each step, in the order it sends them."""
        return [(u // self.pieces, u % self.pieces) for u in range(self.learners * self.pieces)
                if self.learners + u % self.producers == rank]


def layout_of(cfg, env=os.environ) -> Layout:
    """The layout of this process, or one line saying why the asynchronous mode cannot run here."""
    world, rank = int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0"))
    producers = cfg.algo.async_.producers
    if world < 2:
        raise ConfigError("algo.async.max_staleness > 0 runs producers and learners on separate processes, and this "
                          "is one process", where="algo.async.max_staleness",
                          fix="launch with `torchrun --nproc_per_node 2 -m rlhfkit.cli ...` (2 devices or processes), "
                              "or set algo.async.max_staleness=0 (synchronous, the default on one device)")
    learners = world - producers
    if learners < 1:
        raise ConfigError(f"algo.async.producers={producers} leaves no learner among {world} processes",
                          where="algo.async.producers", fix=f"set algo.async.producers to at most {world - 1}")
    if learners % producers and producers % learners:
        fits = [p for p in range(1, world) if (world - p) % p == 0 or p % (world - p) == 0]
        raise ConfigError(f"{producers} producers and {learners} learners do not divide one another",
                          where="algo.async.producers", fix=f"use one of {fits} producers for {world} processes")
    pieces = max(1, producers // learners)
    if cfg.algo.rollout_batch_size % pieces:
        raise ConfigError(f"algo.rollout_batch_size={cfg.algo.rollout_batch_size} prompts do not split into {pieces} "
                          "pieces (one per producer of a learner's share)", where="algo.rollout_batch_size",
                          fix=f"use a multiple of {pieces}")
    return Layout(rank=rank, learners=learners, producers=producers)


# ───────────────────────────────────────────── the wire format ──────────────────────────────────────────────


def experience_state(exp: Experience) -> dict:
    """A scored Experience as tensors, lists, numbers and strings (``torch.load(weights_only=True)`` reads it)."""
    r = exp.rollout.to("cpu")
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    return {"rollout": {name: getattr(r, name) for name in ("prompt_ids", "prompt_mask", "response_ids",
                                                             "response_mask", "ended", "lengths", "logprobs",
                                                             "action_mask")},
            "rows": exp.rows, "texts": exp.texts, "raw_scores": cpu(exp.raw_scores), "valid": cpu(exp.valid),
            "reward_metrics": exp.reward_metrics, "turn_rewards": cpu(exp.turn_rewards),
            "ref_logprobs": cpu(exp.ref_logprobs)}  # a producer's, with algo.async.reference (online/reference.py)


def experience_of(state: dict, device) -> Experience:
    """The inverse of :func:`experience_state`, on ``device``."""
    exp = Experience.of(Rollout(**state["rollout"]).to(device), state["rows"])
    exp.texts, exp.reward_metrics = state["texts"], state["reward_metrics"]
    exp.raw_scores, exp.valid = state["raw_scores"].to(device), state["valid"].to(device)
    for name in ("turn_rewards", "ref_logprobs"):  # (a queue saved before reference log-probs travelled: none)
        value = state.get(name)
        setattr(exp, name, None if value is None else value.to(device))
    return exp


def _dumps(obj) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _loads(data: torch.Tensor):
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=True)


# ─────────────────────────────────────────────────── bridge ─────────────────────────────────────────────────


class Bridge:
    """The process groups between producers and learners, made on the launcher's store: ``queue`` (every rank,
    gloo: experiences, point to point) and ``weights`` (learner 0 and the producers: broadcasts), plus the store's
    keys (the start-up reports, the abort flag)."""

    def __init__(self, layout: Layout, timeout_s: float, env=os.environ):
        world = layout.learners + layout.producers
        timeout = timedelta(seconds=timeout_s)
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's store, which every rank joins
        self.store = dist.TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500")), world,
                                   is_master=layout.rank == 0 and not agent, timeout=timeout)
        self.layout, self.timeout = layout, timeout
        self.queue = dist.ProcessGroupGloo(dist.PrefixStore("rlhfkit/queue", self.store), layout.rank, world, timeout)
        members = [0, *range(layout.learners, world)]
        self.weights = None
        if layout.rank in members:
            prefix = dist.PrefixStore("rlhfkit/weights", self.store)
            index = members.index(layout.rank)
            if torch.cuda.is_available():  # NCCL for the weights on GPUs (not run yet: no GPU in CI)
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.weights = dist.ProcessGroupNCCL(prefix, index, len(members), opts)
            else:
                self.weights = dist.ProcessGroupGloo(prefix, index, len(members), timeout)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.phase = "setup"  # -> started (report) -> running (the first header) -> ended (stop / done)

    # ── set-up reports and the abort flag ──
    def report(self, error: BaseException | None, done: bool = False) -> str:
        """Every rank says how its set-up went (``done``: learner 0 found the run finished), then reads everyone's:
        the first failure is raised on every rank (its own error on the rank that failed, one line naming that rank
        elsewhere), before any weights load. Returns "done" when the run is finished, else ""."""
        world = self.layout.learners + self.layout.producers
        said = "done" if done else "" if error is None else f"{error_code(error)}|{one_line(error)}"
        self.store.set(f"rlhfkit/ready/{self.layout.rank}", said)
        self.phase = "started"
        if error is not None:
            self.phase = "ended"
            raise error
        out = ""
        for rank in range(world):
            said = self.store.get(f"rlhfkit/ready/{rank}").decode()
            if said == "done":
                out = "done"
            elif said:
                self.phase = "ended"
                code, line = said.split("|", 1)
                if code == "2":
                    raise RunError(f"rank {rank} could not start: {line}", where="rlhfkit", fix="see its line above")
                raise RuntimeError(f"rank {rank} could not start: {line}")
        return out

    def close(self) -> None:
        """Shut the groups down while the interpreter is whole (gloo's threads left to interpreter shutdown can abort
        the process, as the CLI's own group can: pytorch/pytorch#179291)."""
        for pg in (self.queue, self.weights):
            try:
                if pg is not None:
                    pg.shutdown()
            except Exception:  # noqa: BLE001 - after a failure the group may not shut down cleanly; exiting anyway
                pass
        self.queue = self.weights = None

    def abort(self) -> None:
        self.store.set("rlhfkit/abort", "1")

    def aborted(self) -> bool:
        return self.store.check(["rlhfkit/abort"])

    # ── experiences ──
    def send(self, message: dict, dst: int) -> None:
        data = _dumps(message)
        self.queue.send([torch.tensor([data.numel()], dtype=torch.int64)], dst, 0).wait()
        self.queue.send([data], dst, 1).wait()

    def recv(self, src: int) -> dict:
        size = torch.zeros(1, dtype=torch.int64)
        self.queue.recv([size], src, 0).wait()
        data = torch.empty(int(size), dtype=torch.uint8)
        self.queue.recv([data], src, 1).wait()
        return _loads(data)

    # ── weights ──
    def header(self, values: list[int] | None = None) -> list[int]:
        """Learner 0 broadcasts ``values`` (version, GO / STOP / DONE, exit code, queued steps) to the producers."""
        t = torch.tensor(values or [0, 0, 0, 0], dtype=torch.int64, device=self.device)
        self.weights.broadcast([t], dist.BroadcastOptions()).wait()
        return t.tolist()

    def tensors(self, params: list[torch.Tensor], dtypes: list[torch.dtype], send: bool) -> None:
        """Every tensor of ``params`` from learner 0 to the producers, in buckets of one dtype (``dtypes``: the
        sender's); a receiver copies into its own tensors (whatever their dtype: a cast)."""
        for bucket in _buckets(params, dtypes):
            dtype = dtypes[bucket[0]]
            if send:
                flat = torch.cat([params[i].detach().reshape(-1).to(self.device, dtype) for i in bucket])
            else:
                flat = torch.empty(sum(params[i].numel() for i in bucket), dtype=dtype, device=self.device)
            self.weights.broadcast([flat], dist.BroadcastOptions()).wait()
            if not send:
                with torch.no_grad():
                    offset = 0
                    for i in bucket:
                        n = params[i].numel()
                        params[i].copy_(flat[offset: offset + n].view_as(params[i]))
                        offset += n


def _buckets(params: list[torch.Tensor], dtypes: list[torch.dtype]) -> list[list[int]]:
    out: list[list[int]] = []
    size = 0
    for i, p in enumerate(params):
        nbytes = p.numel() * dtypes[i].itemsize
        if out and dtypes[out[-1][0]] == dtypes[i] and size + nbytes <= BUCKET_BYTES:
            out[-1].append(i)
            size += nbytes
        else:
            out.append([i])
            size = nbytes
    return out


def trainable(model) -> tuple[list[str], list[torch.Tensor]]:
    """The names and tensors the learners train (all weights, or a LoRA adapter), in the model's order."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, _ in named], [p for _, p in named]


def names_crc(names: list[str]) -> int:
    return zlib.crc32("\n".join(names).encode()) & 0x7FFFFFFF
