"""rdpp_cli.objective.trl_reward: R-DPP as a reward function of TRL's GRPOTrainer. Called as TRL
calls it (prompts, completions, completion_ids and the dataset's columns), it returns each
completion's Objective.weights, set by set of m per image, in TRL's order, and refuses in one line
a call it cannot cut into whole sets. A real GRPOTrainer on a vision-language model (a tiny random
LLaVA: CLIP vision encoder and Llama, with its processor; built offline) trains with it for three
steps, each image's pixels in its prompt: the rewards
TRL receives are the objective's weights of the completions it drew, and the advantages it trains on
are the weights with R-DPP's mean baseline (docs/api.md, "What trains")."""

from __future__ import annotations

import pytest
import torch

from rdpp_cli.errors import RdppError
from rdpp_cli.objective import Objective, tokenize, trl_reward

pytestmark = pytest.mark.usefixtures("one_thread")

REFS = {"red": ["A red circle.", "A circle that is red.", "One red circle."],
        "blue": ["A blue square.", "A square that is blue.", "One blue square."]}


def _call(reward, images, completions, **extra):
    """As GRPOTrainer._calculate_rewards calls a reward function (trl 1.x)."""
    logged = {}
    out = reward(prompts=[f"<img_{k}>" for k in images], completions=completions,
                 completion_ids=[[0] * len(c) for c in completions], image_id=list(images), trainer_state=None,
                 log_extra=lambda column, values: None, log_metric=logged.__setitem__, **extra)
    return out, logged


@pytest.mark.unit
def test_the_rewards_are_the_objectives_weights_set_by_set():
    objective = Objective.from_references(REFS, reward="dpp", m=2)
    reward = trl_reward(objective)
    # num_generations = 4 = two sets of m = 2 per image; images in the order TRL's sampler drew them
    images = ["blue"] * 4 + ["red"] * 4
    texts = ["a blue square", "a square", "one blue square", "a blue square",
             "a red circle", "a red circle", "red", "a circle that is red"]
    out, logged = _call(reward, images, texts)
    want = objective.weights(["blue", "blue", "red", "red"], [texts[i:i + 2] for i in range(0, 8, 2)])
    assert out == [float(x) for x in want.weights.reshape(-1)] and len(out) == 8
    assert reward.__name__ == "rdpp_dpp" and abs(logged["rdpp/self_cider"] - want.logs["self_cider"]) < 1e-12
    assert out[4] == out[5] == 0.0 and out[0] > 1.0  # an exact duplicate pair of a set of 2 gets 0
    # TRL's conversational form gives the same numbers (the last message's text)
    chats = [[{"role": "assistant", "content": [{"type": "text", "text": t}]}] for t in texts]
    assert _call(reward, images, chats)[0] == out
    # m given here overrides the objective's
    three = trl_reward(objective, m=4)
    assert three.m == 4 and len(_call(three, images, texts)[0]) == 8


@pytest.mark.unit
def test_calls_that_cannot_be_cut_into_whole_sets_are_refused_in_one_line():
    objective = Objective.from_references(REFS, reward="dpp", m=3)
    reward = trl_reward(objective)
    texts = ["a red circle"] * 8
    cases = [
        # num_generations = 2, not a multiple of m = 3: the middle image's run is whole but holds 2
        (["red"] * 3 + ["blue"] * 2 + ["red"] * 3, "has 2 completions in a row, not a multiple of m=3"),
        (["red"] * 2, "has 2 completions in a row, not a multiple of m=3"),
        # this process holds part of an image's set: the rest is on another process
        (["blue"] * 1 + ["red"] * 3 + ["blue"] * 3, "only 1 of image 'blue''s completions are in this call"),
        (["red"] * 3 + ["blue"] * 3 + ["red"] * 2, "only 2 of image 'red''s completions are in this call"),
    ]
    for images, words in cases:
        with pytest.raises(RdppError) as e:
            _call(reward, images, texts[:len(images)])
        assert words in str(e.value) and "num_generations" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(RdppError, match="no 'image_id' column among the dataset's columns"):
        reward(prompts=["x"] * 3, completions=["a"] * 3, image=["red"] * 3)
    with pytest.raises(RdppError, match="GRPOTrainer does not produce"):
        trl_reward(Objective.from_references(REFS, reward="scst", m=3))


def _tiny_grpo(tmp_path, reward_func, m: int, steps: int):
    """A GRPOTrainer on a tiny random LLaVA (LlavaForConditionalGeneration: a one-layer CLIP vision
    encoder of 16x16 images and a one-layer Llama) with a LlavaProcessor over a word-level tokenizer,
    all built offline, on the CPU. The dataset: one row per image, a chat prompt holding the image
    (a plain red or blue picture) and the word "describe", and its image id."""
    T = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from PIL import Image

    words = sorted({w for caps in REFS.values() for c in caps for w in tokenize(c)})
    vocab = ["<pad>", "<eos>", "<bos>", "<image>", "USER:", "ASSISTANT:", "describe", *words]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    chat = ("{% for message in messages %}{% if message['role'] == 'user' %}USER: {% for part in message['content'] %}"
            "{% if part['type'] == 'image' %}<image> {% else %}{{ part['text'] }} {% endif %}{% endfor %}"
            "{% else %}ASSISTANT: {% for part in message['content'] %}{{ part['text'] }} {% endfor %}<eos> "
            "{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")
    tokenizer = T.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                          bos_token="<bos>", extra_special_tokens={"image_token": "<image>"})
    pixels = T.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    processor = T.LlavaProcessor(image_processor=pixels, tokenizer=tokenizer, patch_size=8, chat_template=chat,
                                 vision_feature_select_strategy="default", num_additional_image_tokens=1)
    vision = T.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=8)
    text = T.LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=2, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    model = T.LlavaForConditionalGeneration(T.LlavaConfig(vision_config=vision, text_config=text,
                                                          image_token_index=vocab.index("<image>")))
    colours = {"red": (255, 0, 0), "blue": (0, 0, 255)}
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}]
    data = datasets.Dataset.from_list([{"prompt": prompt, "image": Image.new("RGB", (16, 16), colours[k]),
                                        "image_id": k} for k in REFS])
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2 * m, num_generations=m,
                          max_completion_length=6, max_steps=steps, learning_rate=1e-2, logging_steps=1,
                          report_to="none", use_cpu=True, save_strategy="no", beta=0.0, scale_rewards="none",
                          loss_type="dapo", disable_dropout=True, seed=0)
    return trl.GRPOTrainer(model=model, reward_funcs=reward_func, args=args, train_dataset=data,
                           processing_class=processor)


@pytest.mark.integration
def test_grpo_trainer_trains_on_the_objectives_weights(tmp_path):
    m, steps = 3, 3
    objective = Objective.from_references(REFS, reward="dpp", m=m)
    inner, seen = trl_reward(objective), []

    def rdpp_dpp(prompts, completions, **columns):  # records what TRL receives
        rewards = inner(prompts, completions, **columns)
        assert all(c[-1]["role"] == "assistant" for c in completions)  # TRL's conversational form
        seen.append((list(columns["image_id"]), [c[-1]["content"] for c in completions], rewards))
        return rewards

    trainer = _tiny_grpo(tmp_path, rdpp_dpp, m, steps)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    losses, compute_loss = [], trainer._compute_loss

    def keep(model, inputs):  # what GRPO trains on: its advantages, its token mask, its loss
        loss = compute_loss(model, inputs)
        losses.append((inputs["advantages"].clone(), inputs["completion_mask"].clone(), loss.item()))
        return loss

    trainer._compute_loss = keep
    trainer.train()
    assert len(seen) == len(losses) == steps
    mean_baseline = Objective.from_references(REFS, reward="dpp", m=m, baseline="mean")
    for (images, texts, _), (advantages, mask, loss) in zip(seen, losses):
        # GRPO's group normalisation (scale_rewards="none", num_generations=m) is R-DPP's mean baseline
        want = mean_baseline.weights(images[::m], [texts[i:i + m] for i in range(0, len(texts), m)]).weights
        # (TRL shuffles the generation batch's rows before the loss: compared as sorted values)
        assert torch.allclose(advantages.sort().values, want.reshape(-1).sort().values, atol=1e-5, rtol=0)
        assert want.abs().max() > 0.1
        # loss_type="dapo", one process, on-policy (ratio 1): -sum_i A_i x tokens_i / all tokens
        assert abs(loss - float(-(advantages * mask.sum(1)).sum() / mask.sum())) < 1e-5
    logged = [h["rewards/rdpp_dpp/mean"] for h in trainer.state.log_history if "rewards/rdpp_dpp/mean" in h]
    for (images, texts, rewards), mean in zip(seen, logged, strict=True):
        # each image's m completions consecutive: R-DPP sets, scored independently of the wrapper
        assert all(len(set(images[i:i + m])) == 1 for i in range(0, len(images), m)) and len(images) == 2 * m
        want = objective.weights(images[::m], [texts[i:i + m] for i in range(0, len(texts), m)])
        assert rewards == [float(x) for x in want.weights.reshape(-1)]
        assert abs(mean - sum(rewards) / len(rewards)) < 1e-5  # TRL's logged reward: the same numbers
    assert any(max(r) > 1.0 for _, _, r in seen)  # some completions scored against the references
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))  # it trained
