"""Rewards that hold a model (aha.rewards.models): TRL's reward model, a generative judge, the rules they share;
each trained here to prefer shorter answers and used as a policy's only reward."""

import contextlib
import json
import random
import time

import pytest
import torch

from aha.config import GRPOConfig
from aha.rewards import JudgeReward, SequenceClassifierReward, score_completions
from aha.rewards.models import ModelReward, first_number, padded, reward_text

PROMPT = [{"role": "user", "content": "say something"}]
STEPS = 20
EOS_BIAS = 0.2
"""The policy's EOS logit per unit of its constant embedding feature: some completions stop before
max_completion_length (with a constant reward the mean is 13-16 of 16 tokens a step), so lengths spread within a
group and a length preference has something to act on."""


def _tiny_gpt2(tok, head, seed: int = 0, labels: int = 1):
    """A one-layer GPT-2 on the policy's tokenizer: learned absolute positions let it read a text's length at its
    last token in 150 updates (a RoPE model would have to learn to count)."""
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel
    config = GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=32, n_layer=1, n_head=2, num_labels=labels,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    return {"classifier": GPT2ForSequenceClassification, "lm": GPT2LMHeadModel}[head](config)


def _completions(tok, rng: random.Random, n: int, most: int = 32) -> list[list[dict]]:
    """n assistant messages of 0 to `most` random tokens, as the random policy writes them (twice its longest: a
    byte token that decodes to U+FFFD takes three tokens when the text is encoded again)."""
    def text():
        return tok.decode([rng.randrange(7, len(tok)) for _ in range(rng.randrange(most + 1))])
    return [[{"role": "assistant", "content": text()}] for _ in range(n)]


@contextlib.contextmanager
def one_thread():
    """Torch on one thread for a block: these models are so small that a second thread only waits for the first
    (on a busy CPU, several times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _fit(model, pool: list, loss, steps: int = 150, lr: float = 1e-2):
    """`steps` Adam updates of `loss(examples)` on 32 examples drawn from `pool`; the model back in eval mode."""
    rng, opt = random.Random(0), torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    with one_thread():
        for _ in range(steps):
            value = loss(rng.sample(pool, 32))
            opt.zero_grad()
            value.backward()
            opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """The tiny Llama of tiny.py with an untied head and one embedding feature constant, on which the EOS row of the
    head reads EOS_BIAS: most completions are cut at 16 tokens, some end sooner."""
    from aha.models.tiny import build_model, save_pretrained_dir, train_tokenizer
    from aha.tasks import task_corpus
    from aha.tasks.arithmetic import make_addition
    tok = train_tokenizer(task_corpus(make_addition("train", 300, seed=0)) + ["say something"])
    model = build_model(tok, overrides={"tie_word_embeddings": False})
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight[tok.eos_token_id, 0] = EOS_BIAS
    return str(save_pretrained_dir(model, tok, tmp_path_factory.mktemp("policy") / "model")), tok


@pytest.fixture(scope="module")
def scorer(policy):
    """A sequence classifier trained to score prompt + completion by minus its length in tokens / 16."""
    tok = policy[1]
    model = _tiny_gpt2(tok, "classifier")
    pool = [tok(reward_text(tok, PROMPT, c), add_special_tokens=False)["input_ids"]
            for c in _completions(tok, random.Random(0), 512)]

    def loss(rows):
        ids, mask = padded(rows, tok.pad_token_id, "cpu")
        target = -torch.tensor([len(r) for r in rows], dtype=torch.float32) / 16                       # [32]
        return ((model(input_ids=ids, attention_mask=mask).logits[:, 0] - target) ** 2).mean()
    return _fit(model, pool, loss)


RUBRIC = "Score 0-9, short is good:\n{completion}"
"""The test judge's rubric (a short one: the default's 200 tokens would slow its training)."""


@pytest.fixture(scope="module")
def judge(policy):
    """A causal LM trained to answer RUBRIC with one digit and its end of turn: 9 for an empty answer and one less
    for every two tokens of it (0 from 18 on); its digit over 10 is the reward (parse=first_number's default)."""
    tok = policy[1]
    reward = JudgeReward(_tiny_gpt2(tok, "lm"), tok, prompt=RUBRIC, max_new_tokens=2)

    def example(answer):
        digit = max(0, 9 - len(tok(answer[0]["content"], add_special_tokens=False)["input_ids"]) // 2)
        reply = tok(str(digit), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return reward.judge_ids(PROMPT, answer), reply

    def loss(examples):
        ids, mask = padded([p + r for p, r in examples], tok.pad_token_id, "cpu")
        labels = torch.where(mask.bool(), ids, -100)                                                    # [32, L]
        for i, (p, _) in enumerate(examples):
            labels[i, :len(p)] = -100  # the loss on the reply alone
        return reward.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    _fit(reward.model, [example(a) for a in _completions(tok, random.Random(0), 512)], loss)
    return reward


def _lengths(policy, reward, tmp_path, reward_processing_classes=None, **kw) -> list[float]:
    """completion/len_mean of each of STEPS GRPO steps with `reward` as the only reward."""
    from aha.train.grpo import GRPOTrainer
    args = GRPOConfig(output_dir=str(tmp_path), num_generations=8, per_device_train_batch_size=16, max_steps=STEPS,
                      max_completion_length=16, learning_rate=2e-2, seed=0, progress_bar=False, report_to=["jsonl"],
                      log_completions_steps=0, log_groups_steps=0, save_steps=0, **kw)
    with one_thread():
        t = GRPOTrainer(model=policy[0], reward_funcs=[reward], args=args, train_dataset=[{"prompt": PROMPT}] * 4,
                        reward_processing_classes=reward_processing_classes)
        t.train()
    logs = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m["completion/len_mean"] for m in logs if "completion/len_mean" in m]


@pytest.fixture(scope="module")
def constant_lengths(policy, tmp_path_factory):
    """The same run with a constant reward: no group has spread, so the policy never moves."""
    return _lengths(policy, lambda completions, **kw: [1.0] * len(completions), tmp_path_factory.mktemp("const"))


def _shortened(trained: list[float], constant: list[float]) -> float:
    """How much shorter the last five steps' completions are than the constant-reward run's, as a fraction."""
    assert len(trained) == len(constant) == STEPS
    return 1 - sum(trained[-5:]) / sum(constant[-5:])


def test_the_trained_scorer_and_judge_prefer_the_shorter_answer(policy, scorer, judge):
    reward = SequenceClassifierReward(scorer, policy[1])
    answers = [[{"role": "assistant", "content": ""}],
               [{"role": "assistant", "content": "1 plus 2 is 3, 4 plus 5 is 9"}]]
    short, long = reward([PROMPT, PROMPT], answers)
    assert short > long
    short, long = judge([PROMPT, PROMPT], answers)
    assert short > long


def test_a_reward_model_that_prefers_short_answers_shortens_the_policy(policy, scorer, constant_lengths, tmp_path):
    """TRL's way: the module in reward_funcs, its tokenizer in reward_processing_classes."""
    lengths = _lengths(policy, scorer, tmp_path, reward_processing_classes=[policy[1]])
    assert _shortened(lengths, constant_lengths) >= 0.3, (lengths, constant_lengths)


def test_a_judge_that_prefers_short_answers_shortens_the_policy(policy, judge, constant_lengths, tmp_path):
    lengths = _lengths(policy, judge, tmp_path)
    assert _shortened(lengths, constant_lengths) >= 0.3, (lengths, constant_lengths)


def test_reward_text_is_prompt_plus_completion_and_a_conversation_through_the_chat_template(policy):
    tok = policy[1]
    assert reward_text(tok, "2+2=", " 4") == "2+2= 4"
    # TRL applies the template to prompt + completion messages, with no generation prompt after them
    assert reward_text(tok, PROMPT, [{"role": "assistant", "content": "hi"}]) == (
        "<|im_start|>user\nsay something<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n")


def test_scores_are_the_logit_at_the_last_token_whatever_the_batching(policy, scorer):
    tok = policy[1]
    answers = _completions(tok, random.Random(1), 7)
    batched = SequenceClassifierReward(scorer, tok, batch_size=3)([PROMPT] * 7, answers)  # passes of 3, 3 and 1
    alone = []
    for a in answers:
        row = tok(reward_text(tok, PROMPT, a), add_special_tokens=False)["input_ids"]
        ids = torch.tensor([row], device=scorer.device)
        with torch.no_grad():
            alone.append(scorer(input_ids=ids).logits[0, 0].item())  # unpadded: read at its last token
    assert batched == pytest.approx(alone, abs=1e-5)


def test_a_reward_model_by_directory_is_loaded_and_named_as_trls(policy, scorer, tmp_path):
    from aha.train.grpo import resolve_reward_funcs
    scorer.save_pretrained(tmp_path / "short-rm")
    policy[1].save_pretrained(tmp_path / "short-rm")
    (loaded,) = resolve_reward_funcs([str(tmp_path / "short-rm")])
    assert isinstance(loaded, SequenceClassifierReward) and loaded.__name__ == "short-rm"  # TRL: the id's last part
    answers = _completions(policy[1], random.Random(2), 4)
    in_memory = SequenceClassifierReward(scorer, policy[1])([PROMPT] * 4, answers)
    assert loaded([PROMPT] * 4, answers) == pytest.approx(in_memory, abs=1e-6)


def _without_architectures(src, dst):
    import shutil
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    del config["architectures"]  # only the weights can tell
    (dst / "config.json").write_text(json.dumps(config))
    return str(dst)


def test_models_without_a_trained_head_or_of_another_kind_are_refused_naming_them(policy, scorer, tmp_path):
    from aha.train.grpo import resolve_reward_funcs
    lm, tok = policy
    with pytest.raises(ValueError, match=r"reward model '.*model' is a LlamaForCausalLM, not a sequence-classification "
                                         r"reward model \(train a reward model"):
        resolve_reward_funcs([lm])
    with pytest.raises(ValueError, match=r"reward model '.*bare' has no trained score head: score\.weight not in its "
                                         r"weights \(a LlamaForSequenceClassification would start it from random"):
        resolve_reward_funcs([_without_architectures(lm, tmp_path / "bare")])
    scorer.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    with pytest.raises(ValueError, match=r"judge model '.*rm' is a GPT2ForSequenceClassification, not a causal "
                                         r"language model"):
        JudgeReward(str(tmp_path / "rm"))
    with pytest.raises(ValueError, match=r"reward model 'no-such-org/no-such-rm': "):
        resolve_reward_funcs(["no-such-org/no-such-rm"])  # offline and not cached
    with pytest.raises(TypeError, match=r"reward model Linear: not a sequence-classification reward model"):
        resolve_reward_funcs([torch.nn.Linear(2, 1)])
    with pytest.raises(ValueError, match=r"has 2 labels; a reward model has 1"):
        SequenceClassifierReward(_tiny_gpt2(tok, "classifier", labels=2), tok)


def test_a_model_built_in_memory_needs_its_tokenizer_and_processing_classes_match_the_functions(policy, scorer):
    from aha.train.grpo import resolve_reward_funcs
    with pytest.raises(ValueError, match=r"reward model GPT2ForSequenceClassification was built in memory and names "
                                         r"no tokenizer: pass its tokenizer in reward_processing_classes"):
        resolve_reward_funcs([scorer])
    with pytest.raises(ValueError, match=r"2 reward_processing_classes for 1 reward functions"):
        resolve_reward_funcs([scorer], processing_classes=[policy[1], policy[1]])
    funcs = resolve_reward_funcs(["format", scorer], processing_classes=[None, policy[1]])
    assert isinstance(funcs[1], SequenceClassifierReward) and funcs[1].tokenizer is policy[1]


def test_model_rewards_with_reward_workers_are_refused_with_the_reason(policy, scorer):
    from aha.train.grpo import GRPOTrainer
    args = GRPOConfig(output_dir="unused", num_reward_workers=1, progress_bar=False)
    with pytest.raises(ValueError, match=r"reward model reward_model runs in the driver on the policy's device, as "
                                         r"prm_model does: set num_reward_workers=0 \(reward workers are one-CPU"):
        GRPOTrainer(model=policy[0], reward_funcs=[scorer], args=args, train_dataset=[{"prompt": PROMPT}],
                    reward_processing_classes=policy[1])


def test_the_judges_prompt_and_parser_are_its_own(policy):
    tok = policy[1]
    replies = []
    judge = JudgeReward(_tiny_gpt2(tok, "lm"), tok, prompt="Q: {prompt}\nA: {completion}\nScore:", max_new_tokens=3,
                        parse=lambda reply: replies.append(reply) or (None if len(replies) == 1 else 0.5))
    assert tok.decode(judge.judge_ids("2+2", "4")) == (
        "<|im_start|>user\nQ: 2+2\nA: 4\nScore:<|im_end|>\n<|im_start|>assistant\n")
    values, metrics = score_completions([judge], ["2+2", "3+3"], ["4", "6"], {})
    assert len(replies) == 2 and torch.isnan(values[0, 0]) and values[1, 0] == 0.5  # None: excluded, not a score
    assert metrics["reward/unparsed"] == 1.0  # the judge's counter, as every reward's
    with pytest.raises(ValueError, match=r"judge prompt must contain \{completion\}"):
        JudgeReward(judge.model, tok, prompt="Rate {prompt}")
    assert (first_number("8"), first_number("score: 3.5 of 10"), first_number("none"), first_number("11")) == (
        0.8, 0.35, None, None)


class _Slow(ModelReward):
    """Holds a model and takes `delay` seconds a call, noting whether gradients were on inside."""
    name = "slow"

    def __init__(self, model, tok, delay):
        super().__init__(model, tok)
        self.delay, self.grad = delay, []

    def score(self, prompts, completions):
        self.grad.append(torch.is_grad_enabled())
        time.sleep(self.delay)
        return [1.0] * len(completions)


def test_a_model_reward_runs_in_eval_mode_without_gradients_and_within_reward_timeout(policy):
    model = _tiny_gpt2(policy[1], "classifier").train()
    slow = _Slow(model, policy[1], delay=5.0)
    assert not model.training
    values, metrics = score_completions([slow], ["p"], ["c"], {}, timeout_s=0.5)
    assert torch.isnan(values[0, 0]) and metrics["reward/call_timeouts"] == 1  # excluded and counted
    slow.delay = 0.0  # the cut call let go of the model: the next one runs
    values, metrics = score_completions([slow], ["p"], ["c"], {}, timeout_s=0.5)
    assert values.tolist() == [[1.0]] and slow.grad == [False, False]
