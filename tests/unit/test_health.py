"""Health checks that catch collapse: KL blow-up, reward collapse, entropy collapse / explosion, all responses
truncated, repetition and gibberish; warnings.jsonl and track.stop_on_critical."""

import io

import pytest
from rich.console import Console

from rlhfkit.errors import UserError
from rlhfkit.track import CriticalHealthStop, HealthMonitor, read_warnings
from rlhfkit.track.health import gibberish_score, repetition_score, token_entropy

HEALTHY = {"objective/kl": 0.5, "objective/scores": 0.4, "policy/entropy_avg": 1.2, "val/eos_frac": 0.9}


def _names(mon, seq, texts=None):
    """The rule names fired at each step of ``seq`` (each a dict merged over HEALTHY)."""
    return [[w.name for w in mon.evaluate({**HEALTHY, **m}, step, texts)] for step, m in enumerate(seq)]


def _quiet():
    return Console(file=io.StringIO(), width=100)


def test_issue_12_grpo_collapse_kl_70_to_82_nats_scores_to_zero_is_caught(tmp_path):
    # GRPO at lr 3e-2: a few healthy steps, then KL climbs to 70-82 nats while the scores fall to 0
    kl = [0.3, 0.5, 0.4, 0.6, 0.5, 0.7, 3.0, 12.0, 70.0, 75.0, 82.0, 79.0, 81.0, 80.0, 78.0]
    scores = [0.4, 0.45, 0.5, 0.5, 0.55, 0.5, 0.4, 0.2, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    mon = HealthMonitor(run_dir=tmp_path)
    lines = [mon.report({"objective/kl": k, "objective/scores": s}, step, _quiet())
             for step, (k, s) in enumerate(zip(kl, scores))]
    mon.close()
    assert all(not x for x in lines[:6])  # silent while healthy
    records = read_warnings(tmp_path)
    by_name = {r["name"]: r for r in records}
    # step 6: 3.0 is 6x the running median 0.5 (quiet); step 7: 12.0 is 24x it, a warning; step 8: 70 > 20 nats
    assert by_name["kl_spike"]["step"] == 7 and by_name["kl_spike"]["severity"] == "warning"
    assert by_name["kl_blowup"]["step"] == 8
    assert by_name["kl_blowup"]["severity"] == "critical" and by_name["kl_blowup"]["knob"] == "optim.lr"
    assert "algo.kl.coef" in by_name["kl_blowup"]["message"]
    assert "reward_collapse" in by_name and by_name["reward_collapse"]["severity"] == "critical"
    assert set(records[0]) == {"step", "name", "severity", "knob", "message"}
    # scores: rolling means of 5 peak at 0.5 (steps 1-5); at step 9 the last five average 0.13 < 0.5 - 0.25
    assert by_name["reward_collapse"]["step"] == 9
    assert "objective/scores collapsed" in by_name["reward_collapse"]["message"]


def test_kl_blowup_absolute_bound_fires_on_the_first_step():
    mon = HealthMonitor()
    (w,) = mon.evaluate({"objective/kl": 70.0}, 1)
    assert w.name == "kl_blowup" and "above 20 nats" in w.message and "\n" not in w.message
    assert [w.name for w in HealthMonitor(kl_max=100, kl_warn=100).evaluate({"objective/kl": 70.0}, 1)] == []


def test_kl_bound_is_per_token_when_the_length_is_logged():
    # 30 nats over 300 tokens is 0.1 nat per token: a long answer, not a blow-up; over 30 tokens it is 1 per token
    assert HealthMonitor().evaluate({"objective/kl": 30.0, "response/length_mean": 300.0}, 1) == []
    (w,) = HealthMonitor().evaluate({"objective/kl": 30.0, "response/length_mean": 30.0}, 1)
    assert w.name == "kl_blowup" and "(1 per token)" in w.message


def test_kl_relative_needs_history_and_the_floor():
    mon = HealthMonitor()
    # 10x a median of 0.05 is 0.5 nats: under the 1-nat floor, quiet; 1.2 is above both
    seq = [{"objective/kl": v} for v in (0.05, 0.05, 0.05, 0.6, 1.2)]
    assert _names(mon, seq) == [[], [], [], [], ["kl_spike"]]


def test_healthy_noisy_run_is_silent():
    mon = HealthMonitor()
    seq = []
    for step in range(60):
        wiggle = 1 + 0.3 * ((step * 7) % 5 - 2) / 2  # 0.7 .. 1.3
        seq.append({"objective/kl": 0.5 * wiggle, "objective/scores": 0.1 * wiggle - 0.05,
                    "policy/entropy_avg": 1.0 * wiggle})
    texts = ["The answer is 42 because six times seven is 42.", "Paris is the capital of France."]
    assert all(names == [] for names in _names(mon, seq, texts))


def test_reward_collapse_and_not_a_rise_or_flat_zero():
    falling = [{"objective/scores": v} for v in (1.0,) * 5 + (0.9, 0.6, 0.3, 0.1, 0.0)]
    fired = _names(HealthMonitor(), falling)
    # named at 0.6, 0.3, 0.1 after 1.0 (all three below the halfway line to half the level), silent before
    assert fired[8] == ["reward_collapse"] and all(f == [] for f in fired[:8])
    rising = [{"objective/scores": v / 10} for v in range(12)]
    flat = [{"objective/scores": 0.0}] * 12
    assert all(f == [] for f in _names(HealthMonitor(), rising) + _names(HealthMonitor(), flat))
    # negative reward-model scores: the drop is measured against max(|best|, 2 std)
    neg = [{"objective/scores": v} for v in (-1.0,) * 5 + (-1.5, -2.5, -3.5, -4.0, -4.5)]
    fired = _names(HealthMonitor(), neg)
    assert fired[8] == ["reward_collapse"] and all(f == [] for f in fired[:8])


def test_entropy_collapse_and_explosion_against_the_first_window():
    base = [{"policy/entropy_avg": 1.0}] * 5
    collapse = _names(HealthMonitor(), base + [{"policy/entropy_avg": 0.3}, {"policy/entropy_avg": 0.05}])
    assert collapse[-2:] == [[], ["entropy_collapse"]]
    explode = _names(HealthMonitor(), base + [{"policy/entropy_avg": 2.5}, {"policy/entropy_avg": 3.5}])
    assert explode[-2:] == [[], ["entropy_explosion"]]
    # a collapse inside the first window is measured from the highest early value
    early = _names(HealthMonitor(), [{"policy/entropy_avg": v} for v in (2.9, 0.01, 1e-4, 1e-5, 1e-6, 1e-9)])
    assert early[-1] == ["entropy_collapse"]
    # a model that starts near-deterministic is not collapsing
    low = _names(HealthMonitor(), [{"policy/entropy_avg": 0.05}] * 10)
    assert all(f == [] for f in low)


def test_token_entropy_falls_back_to_sequence_entropy_over_length():
    assert token_entropy({"policy/entropy_avg": 0.7, "objective/entropy": 30.0}) == 0.7
    assert token_entropy({"objective/entropy": 30.0, "response/length_mean": 20.0}) == 1.5
    assert token_entropy({"objective/entropy": 30.0}) is None


def test_all_truncated_versus_few_eos():
    mon = HealthMonitor(batch_size=32)
    (w,) = mon.evaluate({"val/num_eos_tokens": 0}, 3)
    assert w.name == "all_truncated" and "generation.max_new_tokens" in w.message
    assert [x.name for x in HealthMonitor().evaluate({"val/eos_frac": 0.05}, 3)] == ["eos"]


def test_repetition_score_hand_values():
    # 8 words, 6 word 3-grams, of which ("a","b","c"), ("b","c","a"), ("c","a","b") are distinct: 1 - 3/6
    assert repetition_score("a b c a b c a b") == pytest.approx(0.5)
    assert repetition_score("one two three four five six seven") == 0.0
    # few words: character 4-grams; "aaaaaaaa" has 5 4-grams, 1 distinct
    assert repetition_score("aaaaaaaa") == pytest.approx(0.8)
    assert repetition_score("abc") == 0.0  # too short to judge


def test_gibberish_score_hand_values():
    assert gibberish_score("Hello, world! 42.") == 0.0
    assert gibberish_score("2 × 3 = 6 — «ok» … 5 €, x^2; 東京は晴れ。") == 0.0  # any script, punctuation, math
    assert gibberish_score("ok \U0001F600") == pytest.approx(1 / 4)  # an emoji is an odd symbol
    assert gibberish_score("ab\ufffd\ufffd") == pytest.approx(0.5)  # two replacement characters of four
    assert gibberish_score("x" * 50) == 1.0  # one 50-character word
    assert gibberish_score("  ") == 0.0


def test_text_rules_fire_when_half_the_responses_degenerate():
    rep = ["the cat the cat the cat the cat the cat the cat"] * 2 + ["A fine answer about cats."] * 2
    assert _names(HealthMonitor(), [{}], rep) == [["repetition"]]
    gib = ["\u2591\u2592\u2593\u2588\u2591\u2592 \u2593\u2588"] * 3 + ["fine"]
    (names,) = _names(HealthMonitor(), [{}], gib)
    assert names == ["gibberish"]
    assert _names(HealthMonitor(), [{}], rep[:1] + rep[2:] * 3) == [[]]  # a quarter is not half


def test_warnings_jsonl_resume_drops_later_lines_and_repeat_every(tmp_path):
    mon = HealthMonitor(run_dir=tmp_path)
    for step in range(25):
        mon.report({"objective/kl": 50.0}, step, _quiet())
    mon.close()
    assert [r["step"] for r in read_warnings(tmp_path)] == [0, 10, 20]
    HealthMonitor(run_dir=tmp_path, resume_step=12).close()
    assert [r["step"] for r in read_warnings(tmp_path)] == [0, 10]
    HealthMonitor(run_dir=tmp_path, resume_step=-1).close()  # starting over
    assert read_warnings(tmp_path) == []


def test_stop_on_critical_raises_one_line_after_writing_and_warnings_do_not_stop(tmp_path):
    mon = HealthMonitor(run_dir=tmp_path, stop_on_critical=True)
    mon.report({"val/ratio": 3.0}, 1, _quiet())  # a warning, not critical: goes on
    with pytest.raises(CriticalHealthStop) as info:
        mon.report({"objective/kl": 80.0}, 2, _quiet())
    mon.close()
    err = info.value
    assert isinstance(err, UserError) and "\n" not in str(err)
    assert str(err).startswith("step 2: stopped on a critical health warning: objective/kl=80 nats")
    assert "track.stop_on_critical=false" in str(err)
    assert [r["name"] for r in read_warnings(tmp_path)] == ["ratio", "kl_blowup"]


def test_report_prints_one_line_per_warning_with_severity():
    console = Console(file=io.StringIO(), width=80)
    HealthMonitor().report({"objective/kl": 80.0, "val/ratio": 3.0}, 4, console)
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("warning: step 4: val/ratio=3")
    assert lines[1].startswith("critical: step 4: objective/kl=80")


@pytest.mark.slow
def test_grpo_run_stops_on_a_critical_warning_with_one_line_and_a_report(tmp_path, monkeypatch, capsys):
    from rlhfkit.cli import main
    from rlhfkit.track import health

    def always(m, prev, mon):  # a critical rule that fires on the first step: the wiring, not the threshold
        return "objective/kl=99 nats is above 20 nats at objective/scores=0.5: test; lower optim.lr"

    monkeypatch.setitem(health.RULES, "kl_blowup", health.Rule(always, health.CRITICAL, "optim.lr"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "shout: w{i}", "answer": "W{i}"}}\n' for i in range(8)))
    out = tmp_path / "run"
    code = main(["grpo", f"output_dir={out}", "model.name=tiny:hidden=32,layers=1", f"data.train={prompts}",
                 "reward.functions=[{fn: exact_match}]", "algo.rollout_batch_size=2", "algo.num_generations=2",
                 "algo.mini_batch_size=4", "train.batch_size=4", "algo.total_episodes=16",
                 "generation.max_new_tokens=4", "track.sample_every=0", "track.stop_on_critical=true",
                 "algo.ppo_epochs=2"])
    err = capsys.readouterr().err.strip().splitlines()
    # step 2 of metrics.jsonl: the first rollout makes ppo_epochs (2) x 4 / 4 = 2 optimizer updates; the message
    # names each metric as GRPO's metrics.jsonl does (TRL's reward; objective/kl, per answer, keeps rlhfkit's name
    # since TRL's kl is per token), the knob untouched (optim.lr)
    assert code == 2 and err[-1].startswith("error: step 2: stopped on a critical health warning: objective/kl=99 "
                                            "nats is above 20 nats at reward=0.5")
    assert "lower optim.lr (fix: turn optim.lr" in err[-1]
    assert "kl_blowup" in [r["name"] for r in read_warnings(out)]  # (4 new tokens: all truncated too)
    assert "1 critical)" in (out / "report.html").read_text()
    assert not (out / "model.safetensors").exists()  # stopped before the final model


def test_kl_per_token_on_short_responses_below_the_total_bound():
    # 8 nats over 4 tokens is 2 nats per token: far from the reference though 8 < the 20-nat total bound
    (w,) = HealthMonitor().evaluate({"objective/kl": 8.0, "response/length_mean": 4.0}, 1)
    assert w.name == "kl_per_token" and "2 nats per token" in w.message and w.knob == "algo.kl.coef"
    # 8 nats over 16 tokens is 0.5 per token: quiet; above 20 nats kl_blowup speaks, not this rule as well
    assert HealthMonitor().evaluate({"objective/kl": 8.0, "response/length_mean": 16.0}, 1) == []
    assert [w.name for w in HealthMonitor().evaluate({"objective/kl": 30.0, "response/length_mean": 3.0}, 1)] == \
        ["kl_blowup"]


def test_length_growth_several_fold_against_the_early_median():
    lengths = [10, 12, 11, 10, 12, 20, 35, 44, 46]  # early median 11; 44 is 4.0x (not above), 46 is 4.2x
    names = _names(HealthMonitor(), [{"response/length_mean": v} for v in lengths])
    assert names == [[]] * 8 + [["length_growth"]]
    (w,) = HealthMonitor(length_growth=2.0).evaluate({"response/length_mean": 30.0}, 9) or [None]
    assert w is None  # no early window yet: never on the first checks


def test_thresholds_are_stated():
    text = HealthMonitor().thresholds()
    assert "20 nats per response" in text and "1 nat per token" in text and "4x its start" in text


def test_one_bad_kl_step_gives_one_kl_warning():
    """Each KL band has one owner: kl_per_token up to kl_warn (10 nats), kl_high up to kl_max (20), kl_blowup above;
    15 nats over 4 tokens (3.75 per token) used to fire kl_per_token and kl_high together."""
    for kl, name in ((8.0, "kl_per_token"), (15.0, "kl_high"), (30.0, "kl_blowup")):
        warned = HealthMonitor().evaluate({"objective/kl": kl, "response/length_mean": 4.0}, 1)
        assert [w.name for w in warned] == [name], kl


def test_grad_norm_advice_fits_a_run_that_clips():
    # train/grad_norm is logged only when optim.max_grad_norm is set: "set it" would be no advice
    mon = HealthMonitor()
    for step, norm in enumerate((2.0, 2.1, 60.0, 75.0)):
        warned = mon.evaluate({"train/grad_norm": norm}, step)
    (w,) = warned
    assert w.name == "grad_norm_blowup" and "lower optim.lr or optim.max_grad_norm" in w.message
    assert "set optim.max_grad_norm" not in w.message


def test_a_one_step_window_averages_one_loss():
    # window=1: the mean of the last loss alone (it summed the whole history, and the first check had no start)
    mon = HealthMonitor(window=1)
    assert [mon.evaluate({"train/loss": 1.0}, step) for step in range(6)] == [[]] * 6
