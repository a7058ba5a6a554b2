"""Speed of ``--model hf`` (rdpp_cli/models/hf.py) against the same steps written directly against
``transformers``' ``VisionEncoderDecoderModel`` with the same weights, on a CPU, at a small shape.

The model: a random GPT-2 decoder with cross-attention (``--layers`` 4, width 256, 4 heads, a
vocabulary of 5,000 tokens) over a ViT encoder's outputs (``--regions`` 50 tokens of 256 features,
random; the encoder runs at prepro time on both sides, so it is not timed). The end token's bias is
raised so that sampled captions average about ``--words`` tokens (both sides sample the same model).

Rows (each side's own way of doing the step the RL loop needs), ``--batch`` images, m = 5:

- ``sample``: 5 captions per image at temperature 1, at most ``--max-len`` tokens, eval mode, no
  gradient: rdpp's ``decode(method="random")`` (cross-attention keys once per image, a key/value
  cache of plain tensors) against ``generate(do_sample=True, top_k=0, num_return_sequences=5)``;
- ``score``: the teacher-forced log-probs of those 5 x batch captions, no gradient: rdpp's
  ``token_logprobs`` against the model's forward with ``decoder_input_ids`` and a log-softmax gather;
- ``replay``: the same pass in train mode with gradients and the backward: rdpp's replaying the
  sampling pass's pre-drawn dropout masks against the model's forward with fresh dropout.

Checked first: rdpp's eval-mode log-probs are within 1e-4 of the model's forward.

Timing: benchmarks/timing.py ``interleaved`` (one run of each side per round, the order reversed
every other round), ``--repeat`` rounds after one warm-up, medians (best beside), ratio = theirs /
rdpp's median. ``--quick``: tiny sizes, one round, to check that the script runs.

    OMP_NUM_THREADS=1 python benchmarks/hf_speed.py --threads 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import interleaved, machine  # noqa: E402


def build(args, folder: Path):
    import transformers as tf

    from rdpp_cli.models.hf import HFCaptioner

    torch.manual_seed(0)
    enc = tf.ViTConfig(hidden_size=args.width, num_hidden_layers=1, num_attention_heads=4,
                       intermediate_size=2 * args.width, image_size=32, patch_size=8)
    V = args.vocab
    dec = tf.GPT2Config(vocab_size=V, n_positions=128, n_embd=args.width, n_layer=args.layers, n_head=4,
                        add_cross_attention=True, is_decoder=True, bos_token_id=V - 1, eos_token_id=V - 1)
    cfg = tf.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id = cfg.pad_token_id = cfg.eos_token_id = V - 1
    hf = tf.VisionEncoderDecoderModel(config=cfg)
    with torch.no_grad():  # GPT-2 ties lm_head to wte: raise the end token's logit through its row
        hf.decoder.transformer.wte.weight[V - 1] *= args.eos_scale
    from tokenizers import Tokenizer, models

    tok = tf.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {f"w{i}": i for i in range(V - 1)} | {"<|endoftext|>": V - 1}, unk_token="<|endoftext|>")),
        eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    ours = HFCaptioner.from_folder(folder, seq_length=args.max_len)
    return ours, hf.eval()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--regions", type=int, default=50)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=5000)
    p.add_argument("--max-len", type=int, default=20)
    p.add_argument("--eos-scale", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.regions, args.width, args.layers, args.vocab, args.repeat = 2, 5, 32, 1, 100, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.modeling_outputs import BaseModelOutput

    from rdpp_cli.decoding.decode import DecodeConfig, decode

    with tempfile.TemporaryDirectory() as tmp:
        ours, hf = build(args, Path(tmp))
    B, m, L = args.batch, 5, args.max_len
    att = torch.randn(B, args.regions, args.width, generator=torch.Generator().manual_seed(1))
    enc_out = BaseModelOutput(last_hidden_state=att)
    start = ours.config.decoder_start_token_id
    with torch.no_grad():
        seqs = decode(ours, att, DecodeConfig(method="random", n=m, max_len=L),
                      generator=torch.Generator().manual_seed(2)).tokens.reshape(B * m, -1)
    ids = torch.cat([torch.full((B * m, 1), start), ours.hf_of[seqs]], 1)
    att_rows = att.repeat_interleave(m, 0)

    def theirs_logp(grad: bool):
        with torch.set_grad_enabled(grad):
            logits = hf(encoder_outputs=BaseModelOutput(last_hidden_state=att_rows), decoder_input_ids=ids).logits
            target = torch.cat([ids[:, 1:], torch.full((B * m, 1), start)], 1)
            return torch.log_softmax(logits.float(), -1).gather(2, target.unsqueeze(2)).squeeze(2)

    with torch.no_grad():  # the check: the same numbers
        ours_lp = ours(att, seqs)
        target = torch.cat([seqs, seqs.new_zeros(B * m, 1)], 1)
        diff = (ours_lp.gather(2, target.unsqueeze(2)).squeeze(2) - theirs_logp(False)).abs()
        diff = diff[(target == 0).cumsum(1) - (target == 0).int() == 0].max()
    assert diff < 1e-4, f"log-probs differ by {diff}"
    words = float((seqs > 0).sum(1).float().mean())
    drop = ours.draw_dropout(B, B * m, L + 1, args.regions, generator=torch.Generator().manual_seed(3))

    def ours_sample():
        with torch.no_grad():
            return decode(ours, att, DecodeConfig(method="random", n=m, max_len=L))

    def theirs_sample():
        with torch.no_grad():
            return hf.generate(encoder_outputs=enc_out, do_sample=True, top_k=0, num_return_sequences=m,
                               max_new_tokens=L + 1, decoder_start_token_id=start, eos_token_id=start, pad_token_id=start)

    def ours_score():
        with torch.no_grad():
            return ours.token_logprobs(att, seqs)

    def ours_replay():
        ours.train()
        lp, mask = ours.token_logprobs(att, seqs, drop=drop)
        (-lp.sum()).backward()
        ours.zero_grad(set_to_none=True)
        ours.eval()

    def theirs_replay():
        hf.train()
        (-theirs_logp(True).sum()).backward()
        hf.zero_grad(set_to_none=True)
        hf.eval()

    rows = {"sample": (ours_sample, theirs_sample), "score": (ours_score, lambda: theirs_logp(False)),
            "replay": (ours_replay, theirs_replay)}
    print(f"{machine()}; torch threads {torch.get_num_threads()}; {B} images x {m} captions (mean {words:.1f} "
          f"tokens), {args.regions} x {args.width} encoder states, GPT-2 {args.layers} layers x {args.width}, "
          f"vocabulary {args.vocab}; log-probs within {diff:.1e}")
    print("| step | rdpp --model hf | transformers | ratio |\n|---|---|---|---|")
    for name, (a, b) in rows.items():
        a(), b()  # warm-up
        t = interleaved({"rdpp": a, "transformers": b}, repeat=args.repeat)
        r, h = t["rdpp"], t["transformers"]
        print(f"| {name} | {r.median * 1e3:.1f} ms (best {r.best * 1e3:.1f}) | {h.median * 1e3:.1f} ms "
              f"(best {h.best * 1e3:.1f}) | {h.median / r.median:.2f}x |")


if __name__ == "__main__":
    main()
