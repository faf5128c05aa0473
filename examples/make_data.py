"""Regenerate the bundled example data (deterministic; the outputs are committed).

- data/chat.jsonl: 1,500 synthetic instruction/response samples whose lengths follow a
  long-tailed (log-normal) distribution like real SFT sets: most are short, a few are very long.
- data/tokenizer.json: a 2,000-token BPE tokenizer trained on that file with `tokenizers`.
- data/speech.csv: 1,200 utterances of a synthetic speech manifest (duration_s, text), for the
  custom TTS factory example.

    python examples/make_data.py
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent / "data"
SYLLABLES = ["ka", "to", "ri", "men", "sa", "lo", "vi", "dur", "ne", "pa", "zu", "el", "mor", "ti", "an",
             "ber", "go", "li", "sun", "da", "fe", "ra", "ko", "ul", "ston", "ve", "mi", "no", "tra", "is"]


def vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4)))))
    return sorted(words)


def sentence(rng: random.Random, words: list[str], weights: list[float], n: int) -> str:
    picked = rng.choices(words, weights=weights, k=n)
    out, i = [], 0
    while i < len(picked):
        k = rng.randint(6, 18)
        chunk = picked[i:i + k]
        out.append(" ".join(chunk).capitalize() + rng.choice([".", ".", ".", "?", "!", ","]))
        i += k
    return " ".join(out)


def main() -> None:
    rng = random.Random(20261121)
    words = vocabulary(rng)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]  # Zipf-like word frequencies
    HERE.mkdir(exist_ok=True)
    with (HERE / "chat.jsonl").open("w") as f:
        for i in range(1500):
            n_words = max(4, min(1400, int(rng.lognormvariate(4.1, 0.8))))
            prompt = sentence(rng, words, weights, max(3, n_words // 5))
            answer = sentence(rng, words, weights, n_words)
            f.write(json.dumps({"id": i, "text": f"### Instruction:\n{prompt}\n### Response:\n{answer}"}) + "\n")
    with (HERE / "speech.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["utt_id", "duration_s", "text"])
        for i in range(1200):
            seconds = round(min(30.0, max(0.6, rng.lognormvariate(1.5, 0.55))), 2)
            w.writerow([f"utt{i:05d}", seconds, sentence(rng, words, weights, max(2, int(seconds * 2.5)))])

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [json.loads(line)["text"] for line in (HERE / "chat.jsonl").open()]
    tok.train_from_iterator(texts, trainer)
    tok.save(str(HERE / "tokenizer.json"))


if __name__ == "__main__":
    main()
