"""Environments are user code run under limits (rlhfkit.envs.host): each reset / step / metrics call in a worker
process under env.timeout_s, everything returned checked with one line naming the class, the method and the step,
NaN turn rewards and timed-out episodes dropped and counted, over-long observations held to data.overflow; and an
update without any gradient is not applied, and a run that applied none does not end as a success."""

from __future__ import annotations

import math
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
from test_envs import MODEL, ScriptedEngine

from rlhfkit.config import ModelConfig
from rlhfkit.envs import EnvError, load_environment
from rlhfkit.envs.episodes import episode_metrics, run_episodes, turn_reward_tensor
from rlhfkit.envs.host import EnvCalls
from rlhfkit.models.loading import load_tokenizer_for
from rlhfkit.rollout import SamplingParams

ENVS = '''
import math
import time


class Good:
    def __init__(self, reward=1.0, sleep_on=None, sleep_s=0.0, obs=""):
        self.reward, self.sleep_on, self.sleep_s, self.obs, self.turns = reward, sleep_on, sleep_s, obs, 0

    def reset(self, row):
        if self.sleep_on == "reset":
            time.sleep(self.sleep_s)
        return row["prompt"]

    def step(self, messages, completion):
        self.turns += 1
        if self.sleep_on == "step" and messages[-1]["content"].endswith("slow"):
            time.sleep(self.sleep_s)
        reward = float("nan") if self.reward == "nan" else self.reward
        if self.obs:
            return [{"role": "tool", "content": self.obs}], reward, False
        return [], reward, True

    def metrics(self):
        return {"turns": float(self.turns)}


class Bad(Good):
    def __init__(self, what):
        super().__init__()
        self.what = what

    def reset(self, row):
        if self.what == "reset_str":
            return "hello"
        if self.what == "reset_role":
            return [{"role": "robot", "content": "hi"}]
        if self.what == "reset_content":
            return [{"role": "user", "content": ["hi"]}]
        if self.what == "reset_empty":
            return []
        return row["prompt"]

    def step(self, messages, completion):
        out = {"step_pair": ([], 1.0), "step_reward": ([], "1.0", True), "step_done": ([], 1.0, "yes"),
               "step_message": ([{"role": "tool", "content": 3}], 1.0, False), "step_list": [[], 1.0, True]}
        return out.get(self.what, ([], 1.0, True))

    def metrics(self):
        return ["x"] if self.what == "metrics_list" else {"ok": "yes"} if self.what == "metrics_str" else {}
'''


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer_for(ModelConfig(name="tiny"))


@pytest.fixture(scope="module")
def envfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("envs") / "limit_envs.py"
    path.write_text(ENVS)
    return path


def play(tok, envfile, name, kwargs, rows, *, workers=0, timeout_s=None, script=("ok",), **kw):
    spec = f"{envfile}:{name}"
    with EnvCalls(spec, load_environment(spec), kwargs, workers=workers, timeout_s=timeout_s) as envs:
        limits = {"max_turns": 2, "max_total_tokens": 60, **kw}
        rollout, eps = run_episodes(ScriptedEngine(tok, list(script)), MODEL, tok, envs, rows,
                                    params=SamplingParams(max_new_tokens=8), seed=0, step=7, **limits)
        metrics = episode_metrics(eps, envs.take_counts())  # this step's counts: the next step starts from 0
        return rollout, eps, {**metrics, "timeouts_next_step": envs.take_counts()["timeouts"]}


def rows_of(*texts):
    return [{"prompt": [{"role": "user", "content": t}]} for t in texts]


@pytest.mark.parametrize("what, method, words", [
    ("reset_str", "reset", "str"), ("reset_role", "reset", "'robot'"), ("reset_content", "reset", "list"),
    ("reset_empty", "reset", "no messages"), ("step_pair", "step", "2-tuple"), ("step_reward", "step", "str"),
    ("step_done", "step", "done='yes'"), ("step_message", "step", "int"), ("step_list", "step", "list"),
    ("metrics_list", "metrics", "list"), ("metrics_str", "metrics", "'yes'")])
def test_every_violation_is_one_line_naming_class_method_and_step(tok, envfile, what, method, words):
    with pytest.raises(EnvError) as err:
        play(tok, envfile, "Bad", {"what": what}, rows_of("hi"))
    line = err.value.one_line()
    assert f"environment Bad: {method}() at rollout step 7" in line and words in line and "\n" not in line


def test_checks_hold_through_the_worker_and_exceptions_name_the_method(tok, envfile):
    with pytest.raises(EnvError, match=r"Bad: step\(\) at rollout step 7 returned a 2-tuple"):
        play(tok, envfile, "Bad", {"what": "step_pair"}, rows_of("hi"), workers=1, timeout_s=30)
    with pytest.raises(EnvError, match=r"Good: __init__\(\) at rollout step 7 raised TypeError"):
        play(tok, envfile, "Good", {"nope": 1}, rows_of("hi"), workers=1, timeout_s=30)


def test_a_hanging_step_is_cut_dropped_and_counted_and_the_rest_goes_on(tok, envfile):
    rows = rows_of("fast", "slow", "fast", "fast")  # two workers: episodes 0, 2 on one, 1 (slow), 3 on the other
    t0 = time.monotonic()
    rollout, eps, m = play(tok, envfile, "Good", {"sleep_on": "step", "sleep_s": 300}, rows, workers=2,
                           timeout_s=3)
    assert time.monotonic() - t0 < 120  # cut at the limit, not the 300 s the step sleeps
    # the slow episode timed out; episode 3 shared its worker, whose kill lost its state: both dropped
    assert [bool(e.failed) for e in eps] == [False, True, False, True]
    assert m["timeouts"] == 1 and m["dropped"] == 2 and m["turns"] == 1.0 and m["timeouts_next_step"] == 0
    assert [math.isnan(e.reward) for e in eps] == [False, True, False, True]
    assert turn_reward_tensor(eps, rollout.response_ids.shape[1])[1].abs().sum() == 0


def test_a_nan_turn_reward_drops_the_episode_and_is_counted(tok, envfile):
    rollout, eps, m = play(tok, envfile, "Good", {"reward": "nan"}, rows_of("a", "b"))
    assert all(e.failed == "reward" for e in eps) and m["dropped"] == 2
    assert torch.isfinite(turn_reward_tensor(eps, rollout.response_ids.shape[1])).all()


def test_an_over_long_prompt_from_reset_follows_data_overflow(tok, envfile):
    rows = rows_of("word " * 400)
    with pytest.raises(EnvError, match=r"Good: reset\(\) at rollout step 7 returned a prompt of \d+ "
                                       r"(tokens|characters), more than the limit of 32"):
        play(tok, envfile, "Good", {}, rows, prompt_limit=32, overflow="error")
    _, eps, m = play(tok, envfile, "Good", {}, rows, prompt_limit=32, overflow="drop")
    assert eps[0].failed == "overlong" and m["dropped"] == 1
    _, eps, _ = play(tok, envfile, "Good", {}, rows, prompt_limit=32, overflow="truncate")
    assert len(eps[0].prompt_ids) == 32 and not eps[0].failed


def test_an_over_long_observation_follows_data_overflow(tok, envfile):
    kwargs = {"obs": "x " * 5000}
    with pytest.raises(EnvError, match=r"step\(\) at rollout step 7 returned messages of \d+ (tokens|characters), "
                                       r"more than env.max_total_tokens=60"):
        play(tok, envfile, "Good", kwargs, rows_of("a"), overflow="error")
    _, eps, _ = play(tok, envfile, "Good", kwargs, rows_of("a"), overflow="drop")
    assert eps[0].failed == "overlong"
    _, eps, _ = play(tok, envfile, "Good", kwargs, rows_of("a"))  # truncate: the episode ends at the limit
    assert not eps[0].failed and not eps[0].ended and len(eps[0].ids) <= 60


def test_an_update_without_gradient_is_not_applied_and_a_run_of_them_fails():
    from accelerate import Accelerator

    from rlhfkit.errors import NoUpdateError
    from rlhfkit.train.lifecycle.checkpoint import guard_of
    from rlhfkit.train.lifecycle.optim import clip_and_step
    from rlhfkit.train.lifecycle.session import Session

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    (model(torch.ones(1, 2)) * 0.0).sum().backward()  # every sample masked out: an exactly-zero gradient
    with warnings.catch_warnings():  # the schedule advances before any optimizer.step(): intended, not torch's warning
        warnings.simplefilter("error")
        clip_and_step(acc, model, opt, sched, 1.0)
    guard = guard_of(opt)
    assert guard.empty == 1 and guard.applied == 0 and sched.last_epoch == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # weight decay did not move them

    class FakeRun:
        run_dir, said = "RUN", []

        def print(self, text):
            self.said.append(text)

    session = Session.__new__(Session)
    session.run, session._guards, session.cfg = FakeRun(), [guard], SimpleNamespace(recipe="grpo")
    session.steps_seen, session.steps_without_reward = 1, 0
    session.check_applied()  # no learning signal (tied groups): the run finishes, saying so in one line
    assert FakeRun.said and "no update changed the model" in FakeRun.said[0]
    session.steps_without_reward = 1  # every sample of every step dropped: no finite reward at all, a fault
    with pytest.raises(NoUpdateError, match="no update of the model was applied.*1 without any learning signal"):
        session.check_applied()
    guard.skipped, session.steps_without_reward = 1, 0  # a non-finite loss skipped an update: a fault too
    with pytest.raises(NoUpdateError, match="1 skipped for a non-finite loss"):
        session.check_applied()
    guard.skipped = 0
    model(torch.ones(1, 2)).sum().backward()
    clip_and_step(acc, model, opt, sched, 1.0)
    assert guard.applied == 1
    session.check_applied()  # one applied update: a run, not a failure


@pytest.mark.parametrize("workers", [0, 1])
def test_a_ten_megabyte_observation_costs_nothing_past_the_token_limit_and_is_counted(tok, envfile, workers, capsys):
    # an OpenEnv server answering 10 MB observations: judged over-long by its length in characters (more than
    # env.max_total_tokens could hold at the tokenizer's longest token), never rendered or tokenised
    kwargs = {"obs": "x" * (10 << 20)}
    t0 = time.perf_counter()
    rows = rows_of("a", "b")[: 2 - workers]  # through a worker (the wire carries it): one episode is enough
    rollout, eps, m = play(tok, envfile, "Good", kwargs, rows, workers=workers, timeout_s=60, max_total_tokens=60)
    assert time.perf_counter() - t0 < 30 and all(not e.failed and not e.ended for e in eps)  # cut there
    assert m["overlong"] == len(rows) and rollout.response_ids.shape[1] <= 60
    assert all(len(str(e.messages)) < 10_000 for e in eps)  # the observation was not kept either
    assert capsys.readouterr().out.count("counted in env/overlong (said once)") == 1
    if workers:
        return
    _, eps, m = play(tok, envfile, "Good", kwargs, rows_of("a"), overflow="drop")
    assert eps[0].failed == "overlong" and m["overlong"] == 1
    with pytest.raises(EnvError, match=r"step\(\) at rollout step 7 returned messages of 10485760 characters, "
                                       r"more than env.max_total_tokens=60 tokens can hold"):
        play(tok, envfile, "Good", kwargs, rows_of("a"), overflow="error")
    # a reset prompt of 10 MB under data.max_prompt_length: only its end is read
    _, eps, m = play(tok, envfile, "Good", {}, rows_of("y" * (10 << 20)), prompt_limit=32)
    assert len(eps[0].prompt_ids) == 32 and not eps[0].failed and m["overlong"] == 1


def test_every_episode_dropped_for_a_nonfinite_reward_stops_with_one_line_naming_it():
    from rlhfkit.train.online.producer import all_episodes_dropped

    err = all_episodes_dropped({"env/nonfinite_rewards": 8.0, "env/timeouts": 0.0, "env/errors": 0.0}, 8, 2)
    assert "every one of the 8 episodes at rollout step 2 was dropped (8 for a non-finite reward" in err.message
    assert str(err).count("(fix:") == 1 and "finite float reward" in err.fix
    err = all_episodes_dropped({"env/nonfinite_rewards": 1.0, "env/timeouts": 5.0, "env/errors": 2.0}, 8, 3)
    assert "1 for a non-finite reward" in err.message and "7 for a timed-out" in err.message
    assert "env.timeout_s" in err.fix


def test_no_ratio_is_reported_for_a_step_without_a_token_in_the_loss():
    from rlhfkit.track.health import HealthMonitor
    from rlhfkit.train.online.learner import RATIO_KEYS, Learner

    class Acc:
        num_processes = 1

    me = type("L", (), {"acc": Acc()})()
    assert Learner.ratio_stats(me, torch.zeros(1 + len(RATIO_KEYS), dtype=torch.float64)) == {}
    # token-weighted: a micro-batch of 30 tokens at ratio 1.0 and one of 10 at 2.0 -> 1.25 (not 1.5)
    sums = torch.tensor([40.0, 30 * 1.0 + 10 * 2.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert Learner.ratio_stats(me, sums)["val/ratio"] == pytest.approx(1.25)
    assert HealthMonitor().evaluate({"objective/scores": 0.0}, 2) == []  # no val/ratio: no "moved too far"
