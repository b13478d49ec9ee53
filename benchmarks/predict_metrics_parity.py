"""`do_predict` scores against LLaMA-Factory 0.9.5's own `ComputeSimilarity`:
`python benchmarks/predict_metrics_parity.py --llamafactory-python /work/main/.venv-peer/bin/python [--snapshot]`.

Scores English and Chinese (prediction, label) pairs, from identical to disjoint and empty, with LLaMA-Factory's
metric code in its environment (it needs jieba, rouge-chinese and nltk there: `pip install --no-deps jieba==0.42.1
rouge-chinese==1.0.3 nltk joblib six`) and with `tuneline.evaluation.similarity` here, then prints each pair's
scores side by side and "N of M pairs equal". `--snapshot` writes LLaMA-Factory's scores to
tests/fixtures/llamafactory/0.9.5/predict_metrics_parity.json for tests/integration/test_similarity.py, which checks
tuneline against them without LLaMA-Factory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "fixtures" / "llamafactory" / "0.9.5" / "predict_metrics_parity.json"
PAIRS = [  # (prediction, label)
    ("The cat sat on the mat.", "The cat sat on the mat."),
    ("The cat is sitting on a mat", "A cat sat on the mat."),
    ("I am an AI assistant developed by Tuneline.", "I am {{name}}, an AI assistant developed by {{author}}."),
    ("Paris", "The capital of France is Paris."),
    ("completely unrelated words here", "nothing in common at all"),
    ("42", "42"),
    ("", "An empty answer scores zero."),
    ("  ", "Whitespace only."),
    ("今天天气很好，我们去公园散步吧。", "今天天气不错，我们一起去公园散步。"),
    ("我是一个人工智能助手。", "您好，我是人工智能助手，很高兴为您服务。"),
    ("机器学习是人工智能的一个分支", "机器学习是人工智能的一个分支"),
    ("北京", "上海"),
    ("Hello 世界, this mixes 中文 and English.", "Hello world, 这句话 mixes Chinese and English."),
    ("1. Preheat the oven.\n2. Mix flour and eggs.", "1. Preheat the oven to 180C.\n2. Mix the flour with eggs."),
]

# Run in LLaMA-Factory's environment: one call per pair (its per-pair list), then one call for the mean.
THEIRS = r"""
import json, sys
import numpy as np
from llamafactory.train.sft.metric import ComputeSimilarity

pairs = json.load(sys.stdin)
texts = [t for pair in pairs for t in pair]

class Decoder:  # what ComputeSimilarity reads of a tokenizer: row i of ids is [index of its text]
    pad_token_id = 0
    def batch_decode(self, ids, skip_special_tokens=True):
        return [texts[int(row[0])] for row in ids]

metric = ComputeSimilarity(tokenizer=Decoder())
class Preds:
    def __init__(self, p, l): self.predictions, self.label_ids = np.array(p), np.array(l)
rows = [metric(Preds([[2 * i]], [[2 * i + 1]])) for i in range(len(pairs))]
mean = metric(Preds([[2 * i] for i in range(len(pairs))], [[2 * i + 1] for i in range(len(pairs))]))
print(json.dumps({"pairs": rows, "mean": mean}))
"""


def theirs(python: str) -> dict:
    done = subprocess.run([python, "-c", THEIRS], input=json.dumps(PAIRS), capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def ours() -> dict:
    sys.path.insert(0, str(REPO))
    from tuneline.evaluation.similarity import pair_similarity, similarity_metrics

    mean = similarity_metrics([p for p, _ in PAIRS], [label for _, label in PAIRS], prefix="")
    return {"pairs": [pair_similarity(p, label) for p, label in PAIRS], "mean": mean}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llamafactory-python", required=True)
    parser.add_argument("--snapshot", action="store_true", help=f"write LLaMA-Factory's scores to {SNAPSHOT}")
    args = parser.parse_args()
    reference, mine = theirs(args.llamafactory_python), ours()
    equal = 0
    for (prediction, label), want, got in zip(PAIRS, reference["pairs"], mine["pairs"], strict=True):
        same = all(abs(want[k] - got[k]) < 1e-9 for k in want)
        equal += same
        print(f"{'=' if same else 'DIFFERS'} {prediction!r} vs {label!r}\n  LLaMA-Factory {want}\n  tuneline      {got}")
    print(f"mean: LLaMA-Factory {reference['mean']}\n      tuneline      {mine['mean']}")
    print(f"{equal} of {len(PAIRS)} pairs equal")
    if args.snapshot:
        SNAPSHOT.write_text(json.dumps({"inputs": PAIRS, "scores": reference["pairs"], "mean": reference["mean"]},
                                       ensure_ascii=False, indent=1) + "\n",
                            encoding="utf-8")
        print(f"wrote {SNAPSHOT}")
    return 0 if equal == len(PAIRS) else 1


if __name__ == "__main__":
    sys.exit(main())
