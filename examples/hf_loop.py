"""R-DPP on a Hugging Face captioner in a loop of your own: a saved VisionEncoderDecoderModel
folder (model and tokenizer, e.g. a ViT-GPT2 captioner saved with save_pretrained) fine-tuned with
rdpp_cli.objective. generated_logprobs gives generate's rows their log-probs and mask (the vision
encoder run once per image); the objective turns them into weights and a loss.

    python examples/hf_loop.py MODEL_DIR [--steps 20] [--m 5] [--reward dpp|scst-mean]

Each step prints one JSON line (loss, sample_cider, reward, self_cider); tests/test_objective_example.py
runs it on a tiny random captioner. The images here are random pixel values standing in for yours:
with real images, pixel_values = AutoImageProcessor.from_pretrained(MODEL_DIR)(images=[...],
return_tensors="pt").pixel_values, and REFERENCES their captions. docs/api.md explains the API.
"""

import argparse
import json

import torch
from transformers import AutoTokenizer, VisionEncoderDecoderModel

from rdpp_cli.objective import Objective, generated_logprobs

REFERENCES = {"red-circle": ["A red circle.", "A circle that is red.", "One red circle on a plain background."],
              "blue-square": ["A blue square.", "A square that is blue.", "One blue square on a plain background."],
              "green-triangle": ["A green triangle.", "A triangle that is green.", "One green triangle."]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--m", type=int, default=5)
    ap.add_argument("--reward", default="dpp", choices=["dpp", "scst-mean"])
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = VisionEncoderDecoderModel.from_pretrained(args.model_dir).eval()  # samples and log-probs: no dropout
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    size = model.config.encoder.image_size
    pixel_values = torch.randn(len(REFERENCES), 3, size, size, generator=torch.Generator().manual_seed(0))  # your images
    image_ids, m = list(REFERENCES), args.m
    objective = Objective.from_references(REFERENCES, reward=args.reward, m=m)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        with torch.no_grad():  # m samples per image, image-major, at temperature 1 from the whole distribution
            gen = model.generate(pixel_values=pixel_values, do_sample=True, top_k=0, num_return_sequences=m,
                                 max_new_tokens=16)
        rows = generated_logprobs(model, pixel_values, gen, m=m)  # ids, log-probs (with grad), mask
        out = objective.step(image_ids, rows.ids, rows.logprobs, rows.mask,
                             decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        print(json.dumps({"step": step, "loss": out.loss.item(), **out.logs}))


if __name__ == "__main__":
    main()
